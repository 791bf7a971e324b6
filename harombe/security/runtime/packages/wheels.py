"""Wheels and their dependency graph, read as data: nothing here runs package code.

:func:`collect_wheels` reads what pip downloaded (each wheel's ``METADATA``, size-capped, as a
zip member) and :func:`parse_requires` refuses any ``Requires-Dist`` that is a direct URL, VCS
or path reference. :func:`wanted` and :func:`stale` are the pure steps of harombe's own
level-by-level resolution in :mod:`.pypi`: which distributions the tree needs, with combined
version ranges and extras, and which of them have no fitting wheel yet.
"""

from __future__ import annotations

import lzma
import os
import re
import stat
import zipfile
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from harombe.errors import PackageFetchError, PackageSpecError

METADATA_MAX_BYTES = 4 * 1024 * 1024
#: Members a wheel may have (its central directory is parsed whole, as root); the largest
#: wheels on public indexes have some tens of thousands.
ZIP_MAX_MEMBERS = 200_000


@dataclass(frozen=True)
class Target:
    """The sandbox interpreter and platform that wheels are chosen and markers judged for."""

    python: str
    machine: str
    glibc: str

    @property
    def python_version(self) -> str:
        return ".".join(self.python.split(".")[:2])

    def marker_env(self) -> dict[str, str]:
        """PEP 508 marker variables of the sandbox (not of the host)."""
        full = self.python if self.python.count(".") >= 2 else f"{self.python_version}.0"
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": full,
            "platform_python_implementation": "CPython",
            "python_version": self.python_version,
            "sys_platform": "linux",
        }


@dataclass(frozen=True)
class Wheel:
    """A downloaded wheel: its canonical name, version, file and dependency requirements."""

    name: str
    version: Version
    path: Path
    requires: tuple[Requirement, ...]

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass
class Want:
    """A distribution the tree needs: combined version range, extras, and who asked first."""

    name: str
    specifier: SpecifierSet
    extras: set[str] = field(default_factory=set)
    needed_by: str = "the request"

    @property
    def pip_text(self) -> str:
        return f"{self.name}{self.specifier}"


def _url_refusal(label: str, line: str, root: str) -> PackageSpecError:
    return PackageSpecError(
        f"{label} depends on {line.strip()!r}, a direct URL, VCS or path reference; harombe "
        "installs registry releases only and never fetches or builds such a dependency on the "
        f"host. Install a release of {root} whose dependencies are all published on the "
        "package index (or publish the dependency there and depend on it by name)"
    )


def parse_requires(label: str, lines: Iterable[str], root: str) -> tuple[Requirement, ...]:
    """``Requires-Dist`` lines of ``label`` as requirements; refuses URL/VCS/path references.

    Refusal is unconditional — a reference under a marker or extra that does not apply here
    still refuses — and so is an unreadable line (pip would read it its own way)."""
    parsed: list[Requirement] = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            if "@" in line or "://" in line or re.search(r"\b(git|hg|svn|bzr)\+", line):
                raise _url_refusal(label, line, root) from None
            raise PackageSpecError(
                f"{label} declares a dependency harombe cannot read ({line.strip()!r}: {exc}); "
                f"install another release of {root}"
            ) from None
        if req.url is not None:
            raise _url_refusal(label, line, root)
        parsed.append(req)
    return tuple(parsed)


def applies(req: Requirement, env: Mapping[str, str], extra: str) -> bool:
    """Whether ``req`` is needed in ``env`` when the depending distribution's ``extra`` ("" for
    none) was requested."""
    if req.marker is None:
        return extra == ""
    return req.marker.evaluate({**env, "extra": extra})


def wanted(
    root: Requirement,
    picks: Mapping[str, Wheel],
    env: Mapping[str, str],
    constraints: Mapping[str, SpecifierSet] | None = None,
) -> dict[str, Want]:
    """Every distribution reachable from ``root`` through the wheels picked so far.

    Pure. A distribution not picked yet is a leaf; its range combines every edge into it."""
    wants: dict[str, Want] = {}
    expanded: set[tuple[str, str]] = set()
    queue: deque[tuple[Requirement, str]] = deque([(root, "the request")])
    while queue:
        req, needed_by = queue.popleft()
        name = canonicalize_name(req.name)
        want = wants.get(name)
        if want is None:
            base = (constraints or {}).get(name, SpecifierSet())
            want = wants[name] = Want(name, base, needed_by=needed_by)
        want.specifier &= req.specifier
        want.extras |= {canonicalize_name(e) for e in req.extras}
        pick = picks.get(name)
        if pick is None:
            continue
        for extra in ("", *sorted(want.extras)):
            if (name, extra) in expanded:
                continue
            expanded.add((name, extra))
            queue.extend((dep, pick.label) for dep in pick.requires if applies(dep, env, extra))
    return wants


def stale(wants: Mapping[str, Want], picks: Mapping[str, Wheel]) -> list[Want]:
    """Wanted distributions with no wheel yet, or whose wheel falls outside the range."""
    return [
        w
        for name, w in wants.items()
        if name not in picks or not w.specifier.contains(picks[name].version, prereleases=True)
    ]


def read_requires_dist(path: Path) -> list[str]:
    """The ``Requires-Dist`` lines of the wheel at ``path``, read as data only.

    The file is opened without following links and must be a regular file; the METADATA member
    must sit in the wheel's single top-level ``.dist-info`` directory and be at most
    ``METADATA_MAX_BYTES``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            # A hard link could be another file of the host's, not something pip downloaded.
            raise PackageFetchError(f"{path.name} is not a regular file of pip's own")
        try:
            end = zipfile._EndRecData(handle)  # type: ignore[attr-defined]  # stable since 2.x
            if end is None or end[zipfile._ECD_ENTRIES_TOTAL] > ZIP_MAX_MEMBERS:  # type: ignore[attr-defined]
                raise zipfile.BadZipFile(f"not a zip, or over {ZIP_MAX_MEMBERS} members")
            with zipfile.ZipFile(handle) as wheel:
                members = [
                    i
                    for i in wheel.infolist()
                    if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename)
                ]
                if len(members) != 1 or members[0].file_size > METADATA_MAX_BYTES:
                    raise PackageFetchError(
                        f"{path.name} is not a valid wheel (no single, reasonably sized "
                        ".dist-info/METADATA); install another release"
                    )
                with wheel.open(members[0]) as meta:
                    raw = meta.read(METADATA_MAX_BYTES + 1)
        except (
            zipfile.BadZipFile,
            OSError,
            EOFError,
            RuntimeError,
            NotImplementedError,
            zlib.error,
            lzma.LZMAError,
        ) as exc:
            raise PackageFetchError(f"{path.name} is not a valid wheel: {exc}") from None
    headers = HeaderParser().parsestr(raw[:METADATA_MAX_BYTES].decode("utf-8", "replace"))
    return [str(v) for v in headers.get_all("Requires-Dist") or []]


def collect_wheels(dest: Path, root: str) -> dict[str, Wheel]:
    """The wheels pip left in ``dest`` (a directory harombe owns again), with requirements."""
    found: dict[str, Wheel] = {}
    if not dest.is_dir() or dest.is_symlink():
        return found
    for entry in os.scandir(dest):
        if not entry.is_file(follow_symlinks=False) or not entry.name.endswith(".whl"):
            raise PackageFetchError(
                f"pip produced {entry.name!r}, which is not a wheel; harombe installs wheels only"
            )
        try:
            name, version, _, _ = parse_wheel_filename(entry.name)
        except InvalidWheelFilename as exc:
            raise PackageFetchError(f"pip produced an invalid wheel name: {exc}") from None
        label = f"{name} {version}"
        requires = parse_requires(label, read_requires_dist(Path(entry.path)), root)
        found[str(name)] = Wheel(str(name), version, Path(entry.path), requires)
    return found


#: The module NumPy's C API is imported from: NumPy 2's headers name ``numpy._core`` (with a
#: fallback to ``numpy.core``), NumPy 1.x's only ``numpy.core``. An extension that holds the
#: second string but not the first was built against NumPy 1.x and fails to import with 2.x.
NUMPY_2_API = b"numpy._core._multiarray_umath"
NUMPY_1_API = b"numpy.core._multiarray_umath"
#: Bytes of extensions read from one wheel for the check (a larger rest is not read).
NUMPY_SCAN_MAX_BYTES = 1 << 30


def built_against_numpy_1(path: Path) -> bool:
    """Whether a compiled extension (``.so``) in the wheel at ``path`` was built against NumPy
    1.x's C API (see :data:`NUMPY_1_API`). Reads the members as data; a wheel that cannot be
    read says no (unpacking refuses it later)."""
    budget = NUMPY_SCAN_MAX_BYTES
    keep = max(len(NUMPY_1_API), len(NUMPY_2_API))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle, zipfile.ZipFile(handle) as wheel:
            for info in wheel.infolist()[:ZIP_MAX_MEMBERS]:
                base = info.filename.rsplit("/", 1)[-1]
                if not (base.endswith(".so") or ".so." in base) or budget <= 0:
                    continue
                old = new = False
                tail = b""
                with wheel.open(info) as member:
                    while budget > 0 and (chunk := member.read(1 << 20)):
                        budget -= len(chunk)
                        window = tail + chunk
                        old = old or NUMPY_1_API in window
                        new = new or NUMPY_2_API in window
                        tail = window[-keep:]
                if old and not new:
                    return True
    except (
        OSError,
        zipfile.BadZipFile,
        EOFError,
        RuntimeError,
        NotImplementedError,
        zlib.error,
        lzma.LZMAError,
    ):
        return False
    return False


def numpy_1_builds(wheels: Iterable[Wheel]) -> list[str]:
    """Labels of ``wheels`` (NumPy aside) that depend on NumPy and hold extensions built
    against NumPy 1.x. Reads the wheels: run it in a thread."""
    return [
        wheel.label
        for wheel in wheels
        if wheel.name != "numpy"
        and any(canonicalize_name(r.name) == "numpy" for r in wheel.requires)
        and built_against_numpy_1(wheel.path)
    ]

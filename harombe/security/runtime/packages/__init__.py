"""Package installation: which specs are acceptable (pure), and the host-side download.

Only plain registry specs pass: a name and optional version constraint (``requests==2.31.0``,
``pandas>=2,<3``, ``axios@1.6.0``, ``@types/node@^20``). URLs, VCS references, local paths,
npm aliases and option-looking strings are refused before anything runs.

Downloads happen on the host with the machine's own pip / npm configuration (index URLs,
proxies, CA bundles) — harombe never names a registry host — and are then copied into the
sandbox, which stays offline. Nothing of a package runs on the host: pip is never allowed to
resolve (harombe walks the tree itself and refuses URL/VCS/path dependencies anywhere in it,
:mod:`.pypi`), npm installs a lockfile harombe has checked holds
registry releases only (:mod:`.npm`), and both run unprivileged in a
private directory (:mod:`.fetch_runner`).
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
from packaging.requirements import InvalidRequirement, Requirement

from harombe.errors import PackageFetchError, PackageSpecError
from harombe.security.runtime.packages import npm as npm_fetch
from harombe.security.runtime.packages import pypi as pypi_fetch
from harombe.security.runtime.packages.fetch_runner import FetchArea

log = structlog.get_logger(__name__)

Registry = Literal["pypi", "npm"]
REGISTRIES: tuple[Registry, ...] = ("pypi", "npm")
NPM_NAME = re.compile(r"^(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
NPM_RANGE = re.compile(r"^[0-9A-Za-z.+\-*^~<>=| ]{1,128}$")
MAX_SPEC_CHARS = 512
#: The whole download (every pip / npm run of one install) must finish within this.
FETCH_TIMEOUT_S = 600


@dataclass(frozen=True)
class PackageSpec:
    """A validated spec: ``text`` is what is handed to pip / npm, unchanged."""

    registry: Registry
    name: str
    text: str


def parse_spec(package: str, registry: str = "pypi") -> PackageSpec:
    """Validate ``package`` for ``registry``; :class:`PackageSpecError` says what to write."""
    if registry not in REGISTRIES:
        raise PackageSpecError(
            f"unknown registry {registry!r}; harombe installs from 'pypi' or 'npm' only"
        )
    if not isinstance(package, str) or not package.strip():
        raise PackageSpecError("package spec is empty; give a name such as 'requests==2.31.0'")
    if len(package) > MAX_SPEC_CHARS:
        raise PackageSpecError(
            f"package spec is {len(package)} characters long; a registry spec (name and "
            f"version) is at most {MAX_SPEC_CHARS}"
        )
    text = package.strip()
    if text.startswith("-") or any(c in text for c in "\n\r\t\\"):
        raise PackageSpecError(f"package spec {package!r} looks like an option; give a name")
    if registry == "pypi":
        return _parse_pypi(text)
    return _parse_npm(text)


def _parse_pypi(text: str) -> PackageSpec:
    lowered = text.lower()
    if "://" in text or lowered.startswith(("git+", "file:")) or "/" in text or " @ " in text:
        raise PackageSpecError(
            f"{text!r} is a URL or path; only PyPI names with versions are allowed "
            "(e.g. 'requests==2.31.0')"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise PackageSpecError(f"{text!r} is not a valid PyPI requirement: {exc}") from None
    if req.url:
        raise PackageSpecError(f"{text!r} names a URL; only registry packages are allowed")
    if req.marker is not None:
        raise PackageSpecError(f"{text!r} has an environment marker; drop the ';' part")
    return PackageSpec("pypi", req.name, text)


def _parse_npm(text: str) -> PackageSpec:
    scoped = text.startswith("@")
    at = text.find("@", 1 if scoped else 0)
    name, version = (text, "") if at < 0 else (text[:at], text[at + 1 :])
    slashes = name.count("/")
    if ":" in text or slashes != (1 if scoped else 0) or text.startswith((".", "~")):
        raise PackageSpecError(
            f"{text!r} is a URL, alias, git or path reference; only npm registry names with "
            "versions are allowed (e.g. 'axios@1.6.0')"
        )
    if not NPM_NAME.match(name) or len(name) > 214:
        raise PackageSpecError(f"{name!r} is not a valid npm package name")
    if at >= 0 and not NPM_RANGE.match(version):
        raise PackageSpecError(f"{version!r} is not an npm version or range")
    return PackageSpec("npm", name, text)


def manylinux_platforms(machine: str, glibc: str) -> list[str]:
    """pip ``--platform`` tags a sandbox with this CPU and glibc version can load."""
    try:
        major, minor = (int(x) for x in glibc.split(".")[:2])
    except ValueError:
        major, minor = 2, 17
    if major != 2:
        minor = 17
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for m, name in legacy.items() if m <= minor]
    return tags


#: What one install may copy into a sandbox: members and bytes (before compression).
TAR_MAX_MEMBERS = 200_000
TAR_MAX_BYTES = 6 << 30


def _tar(paths: Sequence[Path], owner_uid: int) -> bytes:
    """``paths`` (files, or directories taken whole) as a tar.gz, each under its base name.

    The trees were written by the download user: only its own regular files and symlinks and
    directories are taken (links stored as links, never followed); a hard link, device, FIFO or
    a file of anyone else's (a hard link to a host file, say) is refused, and so is a tree past
    :data:`TAR_MAX_MEMBERS` or :data:`TAR_MAX_BYTES`."""
    seen = {"members": 0, "bytes": 0}

    def admit(info: tarfile.TarInfo) -> tarfile.TarInfo:
        seen["members"] += 1
        seen["bytes"] += info.size
        if seen["members"] > TAR_MAX_MEMBERS or seen["bytes"] > TAR_MAX_BYTES:
            raise PackageFetchError(
                f"the download holds more than {TAR_MAX_MEMBERS} files or "
                f"{TAR_MAX_BYTES >> 20} MB; install a smaller package"
            )
        if not (info.isreg() or info.isdir() or info.issym()) or (
            not info.isdir() and info.uid != owner_uid
        ):
            raise PackageFetchError(
                f"the download holds {info.name!r}, which is not a file the download tool "
                "wrote (a hard link, device or someone else's file); refused"
            )
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path in paths:
            tar.add(path, arcname=path.name, filter=admit)
    return buf.getvalue()


def _owner(area: FetchArea) -> int:
    """The uid that owns what the download tools of ``area`` write."""
    return area.identity.uid if area.identity.uid is not None else os.geteuid()


async def fetch_pypi(
    spec: PackageSpec, *, python: str, machine: str, glibc: str, constraints: Sequence[str] = ()
) -> bytes:
    """Wheels for ``spec`` and its dependencies, for the sandbox's interpreter, as a tar.gz.

    ``constraints`` are extra version limits (``numpy<2``) applied while resolving. Resolution
    is harombe's own, level by level, so no package code can run on the host
    (:mod:`.pypi`); a URL, VCS or path dependency anywhere in the tree
    raises :class:`PackageSpecError`, a dependency without a wheel :class:`PackageFetchError`."""
    target = pypi_fetch.Target(python=python, machine=machine, glibc=glibc)
    area = await asyncio.to_thread(FetchArea, "harombe-wheels-")
    try:
        async with asyncio.timeout(FETCH_TIMEOUT_S):
            wheels = await pypi_fetch.resolve(
                area, spec.text, target, manylinux_platforms(machine, glibc), constraints
            )
        log.debug("package.fetched", registry="pypi", spec=spec.text, files=len(wheels))
        return await asyncio.to_thread(_tar, [w.path for w in wheels], _owner(area))
    except TimeoutError:
        raise PackageFetchError(
            f"downloading {spec.text} took longer than {FETCH_TIMEOUT_S}s; check the host's "
            "network and package index configuration"
        ) from None
    finally:
        await asyncio.to_thread(area.close)


async def fetch_npm(spec: PackageSpec) -> tuple[bytes, str]:
    """``node_modules`` for ``spec`` (registry releases only, install scripts not run) as a
    tar.gz, and npm's output. See :mod:`harombe.security.runtime.packages.npm`."""
    npm = shutil.which("npm")
    if npm is None:
        raise PackageFetchError(
            "npm is not installed on the host; harombe downloads npm packages with the host's "
            "npm (install it, e.g. `apt-get install npm`)"
        )
    area = await asyncio.to_thread(FetchArea, "harombe-npm-")
    try:
        async with asyncio.timeout(FETCH_TIMEOUT_S):
            modules, output = await npm_fetch.fetch_tree(area, npm, spec.text)
        archive = await asyncio.to_thread(_tar, sorted(modules.iterdir()), _owner(area))
        log.debug("package.fetched", registry="npm", spec=spec.text)
        return archive, output
    except TimeoutError:
        raise PackageFetchError(
            f"downloading {spec.text} took longer than {FETCH_TIMEOUT_S}s; check the host's "
            "network and package index configuration"
        ) from None
    finally:
        await asyncio.to_thread(area.close)

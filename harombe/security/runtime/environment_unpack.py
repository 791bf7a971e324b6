"""One wheel unpacked into an environment's staging tree, on the host, by ``installer``.

Nothing of the package runs: the wheel's ``RECORD`` is checked (every file's hash and size)
before a byte is written, paths that would leave their scheme's directory are refused by
``installer``, and a zip member that claims to be a symlink is written as the regular file it
is stored as. Bytecode is compiled (parsed, not run) by :func:`compile_tree` in a separate
process with a memory and time limit — a source made to exhaust the compiler takes down that
process, never harombe's — and only when the host's Python is the sandbox's minor version, so
the magic numbers match. A file that does not compile just has no bytecode.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import structlog
from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.sources import WheelFile

from harombe.errors import PackageFetchError

log = structlog.get_logger(__name__)

#: The interpreter console scripts name: the sandbox image's Python.
SANDBOX_PYTHON = "/usr/bin/python3"
#: What one wheel may unpack to: members and bytes.
MAX_MEMBERS = 100_000
MAX_UNPACKED_BYTES = 4 << 30
_READ_CHUNK = 1 << 20
#: The bytecode compiler's process: its address space and its time.
COMPILE_MAX_BYTES = 2 << 30
COMPILE_TIMEOUT_S = 600


#: compileall under a memory limit and no core dumps, set in the child itself (no preexec_fn
#: in a threaded process).
COMPILER = (
    "import compileall, resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "compileall.compile_dir(sys.argv[2], maxlevels=100, quiet=2, workers=1, ddir=sys.argv[3])\n"
)


def compile_tree(site: Path, *, shown_as: str) -> bool:
    """Compile ``site``'s modules to bytecode (timestamp-checked, as pip does) in one child
    process, naming the files as ``shown_as`` (where sandboxes see them, not the host's
    path); whether it finished in time (files it could not compile are left without)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", COMPILER, str(COMPILE_MAX_BYTES), str(site), shown_as],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=COMPILE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode >= 0


def unpack_wheel(path: Path, stage: Path, *, label: str) -> None:
    """Unpack the wheel at ``path`` into ``stage`` (``site``, ``bin``, ``include``, ``data``).
    Raises :class:`PackageFetchError` naming ``label`` when the wheel is refused."""
    destination = SchemeDictionaryDestination(
        {
            "purelib": str(stage / "site"),
            "platlib": str(stage / "site"),
            "scripts": str(stage / "bin"),
            "headers": str(stage / "include" / label.split()[0]),
            "data": str(stage / "data"),
        },
        interpreter=SANDBOX_PYTHON,
        script_kind="posix",
    )
    try:
        with WheelFile.open(path) as source:
            _check_sizes(source._zipfile, label)
            source.validate_record()
            # installer warns (RuntimeWarning) of what it skips, e.g. a __pycache__ shipped in
            # the wheel: the debug log's, never the caller's stderr.
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                install(source, destination, {"INSTALLER": b"harombe\n"})
            for item in said[:20]:
                log.debug("environment.unpack_warned", wheel=label, warning=str(item.message)[:300])
    except (InstallerError, ValueError, KeyError, OSError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError, EOFError) as exc:  # fmt: skip
        raise PackageFetchError(
            f"the wheel of {label} ({path.name}) was refused while unpacking: {exc}; "
            "pin another version of it"
        ) from None
    with contextlib.suppress(OSError):
        os.rmdir(stage / "data")  # most wheels have none (it stays when one has)


def declared_bytes(path: Path) -> int:
    """What the wheel at ``path`` says it unpacks to (0 if it cannot be read: the unpack then
    refuses it with the reason)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sum(member.file_size for member in archive.infolist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return 0


def _check_sizes(archive: zipfile.ZipFile, label: str) -> None:
    members = archive.infolist()
    total = sum(member.file_size for member in members)
    if len(members) > MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
        raise PackageFetchError(
            f"the wheel of {label} unpacks to {len(members)} files, {total >> 20} MB; more than "
            f"{MAX_MEMBERS} files or {MAX_UNPACKED_BYTES >> 20} MB is refused"
        )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as stream:
        while chunk := stream.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def needs_import_check(stage: Path, names: Sequence[str]) -> bool:
    """Whether a sandbox must import the set once before it is trusted: only compiled
    extensions beside NumPy can break on import (built against NumPy 1.x, given NumPy 2)."""
    if "numpy" not in names or len(names) < 2:
        return False
    for root, dirs, files in os.walk(stage / "site"):
        if os.path.basename(root) == "numpy" and os.path.dirname(root) == str(stage / "site"):
            dirs[:] = []  # NumPy's own extensions are built against itself
            continue
        if any(name.endswith(".so") for name in files):
            return True
    return False


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def make_read_only(tree: Path) -> None:
    """Everything readable by anyone (the sandbox user), writable by no one but the owner."""
    for root, _dirs, files in os.walk(tree):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if not os.path.islink(path):  # installer writes none; never chmod through one
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def remove_tree(tree: Path) -> None:
    shutil.rmtree(tree, ignore_errors=True)


def top_level_modules(site: Path, requirements: Sequence[str]) -> list[str]:
    """The public top-level modules of the distributions ``requirements`` name (from each
    one's ``top_level.txt``, else its ``RECORD``): what a sandbox of the set may preimport."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    wanted = set()
    for text in requirements:
        with contextlib.suppress(InvalidRequirement):
            wanted.add(canonicalize_name(Requirement(text).name))
    found: list[str] = []
    for info in sorted(site.glob("*.dist-info")):
        if canonicalize_name(info.name.removesuffix(".dist-info").rsplit("-", 1)[0]) not in wanted:
            continue
        paths = [line.split(",", 1)[0] for line in _read_lines(info / "RECORD")]
        tops = {
            p.split("/", 1)[0].removesuffix(".py") for p in paths if "/" in p or p[-3:] == ".py"
        }
        names = _read_lines(info / "top_level.txt") or sorted(tops)
        found += [n for n in names if n.isidentifier() and not n.startswith("_") and n not in found]
    return found


def _read_lines(path: Path) -> list[str]:
    try:
        return [
            line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        return []

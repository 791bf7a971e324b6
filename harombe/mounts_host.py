"""The host side of a run with a host directory: read the directory into a tar, compare what
came back from the sandbox with it, and apply the difference to the directory.

Nothing here follows a symbolic link. The directory is opened once by its real path; every
name below it is reached from a directory descriptor with ``O_NOFOLLOW``, so a link put in
place of a directory (before or during the run) ends that one change with a refusal instead
of redirecting a read or a write outside. Files are written to a new name beside the target
and renamed over it: an existing entry (a link, a hard link) is replaced, never written
through. Only regular files and directories are copied either way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from typing import Any

from harombe.errors import MountError

MiB = 1 << 20
#: Bytes of one tar sent into the sandbox: a large directory goes in several requests.
ARCHIVE_BYTES = 16 * MiB
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TEMP_PREFIX = ".harombe-mnt-"
#: The most names a path below ``mnt_dir`` may have, both ways (``a/b`` has two).
MAX_DEPTH = 256
#: The longest path below ``mnt_dir`` (characters) that comes back from ``/mnt``.
MAX_PATH_CHARS = 4096


@dataclass(frozen=True)
class MountLimits:
    """Caps on a host directory copied in, and on what comes back from ``/mnt``:
    ``max_bytes`` (all files together), ``max_entries`` (files and directories) and
    ``max_file_bytes`` (one file)."""

    max_bytes: int = 128 * MiB
    max_entries: int = 10_000
    max_file_bytes: int = 64 * MiB


@dataclass(frozen=True)
class HostFile:
    """A regular file as it was read before the run (to see later whether it changed)."""

    size_bytes: int
    sha256: str
    mode: int
    ino: int
    mtime_ns: int


@dataclass
class Snapshot:
    """The host directory before the run: its real path and identity, its files and
    directories (relative paths), their bytes in all, and the tars (each about
    :data:`ARCHIVE_BYTES` at most, but for one larger file) that carry them into the sandbox."""

    root: str
    root_id: tuple[int, int]
    files: dict[str, HostFile] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    archives: list[bytes] = field(default_factory=list)
    size_bytes: int = 0


@dataclass
class Plan:
    """What the run changed in ``/mnt``: files to write (path → the scan's entry), files and
    directories to delete or create, and what is refused (with the reason)."""

    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    created_dirs: list[str] = field(default_factory=list)
    deleted_files: list[str] = field(default_factory=list)
    deleted_dirs: list[str] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def snapshot(mnt_dir: str | os.PathLike[str], limits: MountLimits) -> Snapshot:
    """Read ``mnt_dir`` (regular files and directories only) into a :class:`Snapshot`;
    :class:`MountError` for a missing directory, a symlink, a special file, an undecodable
    name, an unreadable entry, a path more than :data:`MAX_DEPTH` names deep, or a directory
    over ``limits``."""
    root = os.path.realpath(os.fspath(mnt_dir))
    try:
        fd = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        raise MountError(f"mnt_dir {root!r} does not exist; create it first") from None
    except NotADirectoryError:
        raise MountError(f"mnt_dir {root!r} is not a directory; pass a directory") from None
    except OSError as exc:
        raise MountError(f"mnt_dir {root!r} cannot be opened ({exc.strerror}); make it "
                         "readable") from None  # fmt: skip
    try:
        st = os.fstat(fd)
        snap = Snapshot(root=root, root_id=(st.st_dev, st.st_ino))
        packer = _Packer()
        _walk(fd, snap, packer, limits)
        snap.archives = packer.finish()
    finally:
        os.close(fd)
    return snap


class _Packer:
    """Tars of the directory's members, a new one begun past :data:`ARCHIVE_BYTES`."""

    def __init__(self) -> None:
        self.done: list[bytes] = []
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def add(self, info: tarfile.TarInfo, data: bytes = b"") -> None:
        if self.buf.tell() + len(data) > ARCHIVE_BYTES and self.buf.tell() > 0:
            self.done.append(self._close())
        self.tar.addfile(info, io.BytesIO(data) if info.isfile() else None)

    def _close(self) -> bytes:
        self.tar.close()
        data = self.buf.getvalue()
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        return data

    def finish(self) -> list[bytes]:
        last = self._close()
        self.tar.close()
        return [*self.done, last]


def _walk(root_fd: int, snap: Snapshot, tar: _Packer, limits: MountLimits) -> None:
    """Read the tree below ``root_fd`` depth first, parents before children, without
    recursion (a tree of any depth ends in a :class:`MountError`, never a crash)."""
    stack = [(os.dup(root_fd), "", iter(_listing(root_fd, "", snap)))]
    try:
        while stack:
            fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                os.close(fd)
                continue
            path = _join(rel, name)
            sub = _read_entry(fd, name, path, snap, tar, limits)
            if sub is not None:
                stack.append((sub, path, iter(())))  # closed by the finally, also on an error
                stack[-1] = (sub, path, iter(_listing(sub, path, snap)))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _listing(fd: int, rel: str, snap: Snapshot) -> list[str]:
    try:
        with os.scandir(fd) as it:
            return sorted(entry.name for entry in it)
    except OSError as exc:
        raise _unreadable(snap, rel, exc) from None


def _unreadable(snap: Snapshot, rel: str, exc: OSError) -> MountError:
    where = os.path.join(snap.root, _shown(rel)) if rel else snap.root
    return MountError(f"{where!r} cannot be read ({exc.strerror or exc}); it may have "
                      "changed while being read: try again, or make it readable")  # fmt: skip


def _shown(path: str) -> str:
    """``path`` for a message: a very long one cut in the middle."""
    return path if len(path) <= 200 else f"{path[:100]}…{path[-100:]}"


def _read_entry(fd: int, name: str, path: str, snap: Snapshot, tar: _Packer,
                limits: MountLimits) -> int | None:  # fmt: skip
    """Add ``name`` (in directory ``fd``) to ``snap`` and the tar; a descriptor of it if it
    is a directory (to walk next), else None."""
    _check_name(path, snap.root)
    if path.count("/") >= MAX_DEPTH:
        raise MountError(f"{os.path.join(snap.root, _shown(path))!r} is more than {MAX_DEPTH} "
                         "directories deep; move it higher up or out of mnt_dir")  # fmt: skip
    if len(snap.files) + len(snap.dirs) >= limits.max_entries:
        raise MountError(f"mnt_dir {snap.root!r} has more than max_entries="
                         f"{limits.max_entries} files and directories; copy in less")  # fmt: skip
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            snap.dirs.add(path)
            tar.add(_member(path, tarfile.DIRTYPE, 0o755, 0))
            return os.open(name, DIR_FLAGS, dir_fd=fd)  # walked next, closed by _walk
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a special file"
            raise MountError(f"{os.path.join(snap.root, path)!r} is {what}; only regular "
                             "files and directories are copied into /mnt: replace it with a "
                             "copy or move it out")  # fmt: skip
        data, st = _read_file(fd, name, path, snap, limits)
    except OSError as exc:
        raise _unreadable(snap, path, exc) from None
    digest = hashlib.sha256(data).hexdigest()
    snap.files[path] = HostFile(len(data), digest, stat.S_IMODE(st.st_mode), st.st_ino,
                                st.st_mtime_ns)  # fmt: skip
    snap.size_bytes += len(data)
    mode = 0o755 if st.st_mode & 0o100 else 0o644
    tar.add(_member(path, tarfile.REGTYPE, mode, len(data)), data)
    return None


def _check_name(path: str, root: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raw = path.encode("utf-8", "surrogateescape")
        raise MountError(f"a name below {root!r} is not valid UTF-8 ({raw!r}); rename it") from None


def _read_file(
    fd: int, name: str, path: str, snap: Snapshot, limits: MountLimits
) -> tuple[bytes, os.stat_result]:
    cap = min(limits.max_file_bytes, limits.max_bytes - snap.size_bytes)
    file_fd = os.open(name, READ_FLAGS, dir_fd=fd)
    try:
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the stat: refuse, never block
            raise MountError(f"{os.path.join(snap.root, path)!r} changed while being read; "
                             "try again")  # fmt: skip
        with os.fdopen(os.dup(file_fd), "rb") as f:
            data = f.read(cap + 1)
    finally:
        os.close(file_fd)
    if len(data) > cap:
        which = "max_file_bytes" if cap == limits.max_file_bytes else "max_bytes"
        raise MountError(
            f"{os.path.join(snap.root, path)!r} does not fit: over {which}="
            f"{getattr(limits, which)} bytes copied into /mnt; copy in less or raise the limit"
        )
    return data, st


def _member(path: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type, info.mode, info.size = kind, mode, size
    return info


def apply_changes(
    snap: Snapshot, plan: Plan, contents: dict[str, bytes]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Apply ``plan`` to the host directory: deletions (files, then directories, deepest
    first), new directories (parents first), then files written from ``contents``. Each
    change is applied or refused on its own (a host entry changed during the run is kept,
    never overwritten; a file whose directory is not there is refused, never makes it);
    returns ``(changed_files, refused)``, the changes applied and those that were not.
    :class:`MountError` (before any change) if ``mnt_dir`` is gone or was replaced."""
    try:
        root_fd = os.open(snap.root, DIR_FLAGS)
    except OSError as exc:
        raise MountError(f"mnt_dir {snap.root!r} cannot be opened after the run "
                         f"({exc.strerror}); nothing was applied") from None  # fmt: skip
    try:
        st = os.fstat(root_fd)
        if (st.st_dev, st.st_ino) != snap.root_id:
            raise MountError(f"mnt_dir {snap.root!r} was replaced during the run; nothing "
                             "was applied")  # fmt: skip
        return _apply_steps(root_fd, snap, plan, contents)
    finally:
        os.close(root_fd)


def _apply_steps(
    root_fd: int, snap: Snapshot, plan: Plan, contents: dict[str, bytes]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every step of ``plan``, in order; one that fails is refused, and the rest go on."""
    steps = [(p, "deleted", "file", 0) for p in plan.deleted_files]
    steps += [(p, "deleted", "directory", 0) for p in plan.deleted_dirs]
    steps += [(p, "created", "directory", 0) for p in plan.created_dirs]
    steps += [(p, "modified" if p in snap.files else "created", "file", _new_mode(entry))
              for p, entry in plan.writes.items()]  # fmt: skip
    changed: list[dict[str, Any]] = []
    refused = list(plan.refused)
    for path, change, kind, new_mode in steps:
        try:
            size = _apply_one(root_fd, snap, path, change, kind, contents.get(path, b""),
                              new_mode)  # fmt: skip
        except (OSError, _Kept) as exc:
            why = exc.reason if isinstance(exc, _Kept) else _os_reason(exc)
            refused.append({"path": path, "change": change, "reason": why})
            continue
        except Exception as exc:  # noqa: BLE001 (one change refused; the others still apply)
            refused.append({"path": path, "change": change,
                            "reason": f"could not be applied ({type(exc).__name__})"})  # fmt: skip
            continue
        changed.append({"path": path, "change": change, "type": kind, "size_bytes": size})
    return changed, refused


def _new_mode(entry: dict[str, Any]) -> int:
    """The mode of a new file: executable (0755) if the sandbox's file was, else 0644."""
    mode = entry.get("mode")
    return 0o755 if type(mode) is int and mode & 0o100 else 0o644


class _Kept(MountError):
    """One change not applied because the host's entry changed during the run."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _os_reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a directory on its path is a symbolic link or not a directory on the host"
    if exc.errno == errno.ENOENT:
        return "it or its directory is not there on the host (removed during the run?)"
    return f"{exc.strerror or exc}"


def _apply_one(root_fd: int, snap: Snapshot, path: str, change: str, kind: str,
               data: bytes, new_mode: int) -> int:  # fmt: skip
    parent, name = os.path.split(path)
    dir_fd = _open_dir(root_fd, parent)
    try:
        if kind == "directory" and change == "deleted":
            os.rmdir(name, dir_fd=dir_fd)
            return 0
        if kind == "directory":
            os.mkdir(name, 0o755, dir_fd=dir_fd)
            return 0
        try:
            now: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        old = snap.files.get(path)
        if now is not None and (old is None or not _same(old, now)):
            raise _Kept("changed on the host during the run; the host's version was kept")
        if change == "deleted":
            if now is not None:
                os.unlink(name, dir_fd=dir_fd)
            return old.size_bytes if old is not None else 0
        mode = old.mode if old is not None else new_mode
        _replace(dir_fd, name, data, mode)
        return len(data)
    finally:
        os.close(dir_fd)


def _same(old: HostFile, now: os.stat_result) -> bool:
    return (stat.S_ISREG(now.st_mode) and now.st_ino == old.ino
            and now.st_size == old.size_bytes and now.st_mtime_ns == old.mtime_ns)  # fmt: skip


def _open_dir(root_fd: int, rel: str) -> int:
    """A descriptor of directory ``rel`` below ``root_fd``, walked one name at a time with
    ``O_NOFOLLOW``; ``OSError`` if a name is missing, a link or not a directory (a change's
    directory is never made here: new directories are steps of their own, applied first)."""
    fd = os.dup(root_fd)
    for name in [p for p in rel.split("/") if p]:
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = sub
    return fd


def _replace(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file beside ``name`` and rename it over ``name``."""
    temp = TEMP_PREFIX + os.urandom(8).hex()
    fd = os.open(temp, TEMP_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode & 0o777)  # never setuid, setgid or sticky
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise

"""The files of a :class:`~harombe.testing.guest.FakeGuest`: a dict, with the supervisor's
``write``, ``read``, ``list`` and ``untar`` operations on it and the same refusals.

Paths are absolute inside the sandbox (``/workspace/data.csv``). Directories exist when made
(``write`` and ``untar`` make the missing ones, like the supervisor) and ``/workspace``,
``/home/sandbox`` and ``/tmp`` exist from the start. A request path is relative to its ``root``;
``..`` may step back inside it but never above it, and an absolute path or a NUL byte is
refused, each as ``WorkspacePathError``, which the host turns into
:class:`~harombe.errors.WorkspacePathError`.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from typing import Any

__all__ = ["FakeWorkspace", "Refused"]

ROOTS = ("/workspace", "/home/sandbox", "/tmp")


class Refused(Exception):
    """A refused request; ``kind`` is the ``error`` of the supervisor's reply."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _join(root: str, rel: object) -> str:
    """``rel`` below ``root``, resolved the way the supervisor walks it."""
    if not isinstance(rel, str):
        raise Refused("WorkspacePathError", "path must be a string")
    if "\x00" in rel:
        raise Refused("WorkspacePathError", f"path {rel!r} contains a NUL byte")
    if rel.startswith("/"):
        raise Refused("WorkspacePathError", f"path {rel!r} must be relative")
    kept: list[str] = []
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not kept:
                raise Refused(
                    "WorkspacePathError",
                    f"path {rel!r} leads above {root} (through '..' or a symlink); refused",
                )
            kept.pop()
        else:
            kept.append(part)
    return posixpath.join(root, *kept)


class FakeWorkspace:
    """Files by absolute path, and directories; see the module docstring."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/", *ROOTS}

    def _make_dirs(self, path: str) -> None:
        while path not in self.dirs:
            if path in self.files:
                raise Refused("NotADirectoryError", f"{path}: Not a directory")
            self.dirs.add(path)
            path = posixpath.dirname(path)

    def handle(self, op: str, msg: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        """Carry out file request ``op``; its reply fields and blob, or :class:`Refused`."""
        try:
            if op == "write":
                return self.write(_join(msg["root"], msg["path"]), blob), b""
            if op == "read":
                return self.read(_join(msg["root"], msg["path"]), int(msg["max_bytes"]))
            if op == "list":
                return self.listing(_join(msg["root"], msg["path"])), b""
            return self.untar(str(msg["root"]), blob), b""
        except KeyError as exc:
            raise Refused("BadRequest", f"request lacks {exc}") from None

    def write(self, path: str, blob: bytes) -> dict[str, Any]:
        if path in self.dirs:
            raise Refused("IsADirectoryError", f"{path!r} is a directory")
        self._make_dirs(posixpath.dirname(path))
        self.files[path] = bytes(blob)
        return {"bytes": len(blob)}

    def read(self, path: str, max_bytes: int) -> tuple[dict[str, Any], bytes]:
        if path in self.dirs:
            raise Refused("IsADirectoryError", f"{path!r} is a directory; list it")
        if path not in self.files:
            raise Refused("FileNotFoundError", f"{path!r}: No such file or directory")
        data = self.files[path]
        if len(data) > max_bytes:
            raise Refused(
                "FileTooLargeError",
                f"{path!r} is {len(data)} bytes, over max_file_bytes ({max_bytes})",
            )
        return {"bytes": len(data)}, data

    def listing(self, path: str) -> dict[str, Any]:
        if path in self.files:
            raise Refused("NotADirectoryError", f"{path!r}: Not a directory")
        if path not in self.dirs:
            raise Refused("FileNotFoundError", f"{path!r}: No such file or directory")
        entries = [
            {"name": posixpath.basename(d), "type": "dir", "size": 0}
            for d in self.dirs
            if d != path and posixpath.dirname(d) == path
        ] + [
            {"name": posixpath.basename(f), "type": "file", "size": len(data)}
            for f, data in self.files.items()
            if posixpath.dirname(f) == path
        ]
        entries.sort(key=lambda e: str(e["name"]))
        return {"entries": entries, "total": len(entries), "truncated": False, "total_exact": True}

    def untar(self, root: str, blob: bytes) -> dict[str, Any]:
        root = posixpath.normpath(root)
        if not root.startswith("/") or root == "/":
            raise Refused("WorkspacePathError", f"untar root {root!r} must be absolute")
        self._make_dirs(root)
        count = 0
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                for member in tar:
                    self._unpack(tar, member, root)
                    count += 1
        except tarfile.TarError as exc:
            raise Refused("TarError", str(exc)) from None
        return {"members": count}

    def _unpack(self, tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> None:
        """One member: files and directories are kept; a symlink that stays inside ``root`` is
        accepted (and not kept: this workspace has no links); anything else is refused."""
        target = posixpath.normpath(posixpath.join(root, member.name))
        bad = not target.startswith(root + "/") or not (
            member.isfile() or member.isdir() or member.issym()
        )
        if member.issym():
            dest = posixpath.normpath(posixpath.join(posixpath.dirname(target), member.linkname))
            bad = bad or posixpath.isabs(member.linkname) or not dest.startswith(root + "/")
        if bad:
            raise Refused("WorkspacePathError", f"archive member {member.name!r} is not allowed")
        if member.isdir():
            self._make_dirs(target)
        elif member.isfile():
            source = tar.extractfile(member)
            self.write(target, source.read() if source else b"")

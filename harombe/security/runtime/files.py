"""Workspace file operations, carried out by the supervisor inside the sandbox.

No host directory is ever shared with a sandbox, so no symlink planted by sandboxed code can
lead to the host. Paths are checked twice: on the host (:func:`workspace_relative`, and the
depth cap here), and inside the sandbox, where the supervisor walks them one component at a
time from a descriptor of ``/workspace`` without ever letting the kernel follow a link, and
refuses anything that would leave it (see ``guest/supervisor_paths.py``). Reads refuse anything but
regular files and never block; writes replace the file atomically; listings are capped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from harombe.config import Limits
from harombe.errors import FileError, SandboxLostError, UsageError, WorkspacePathError
from harombe.security.policy.paths import WORKSPACE, workspace_relative
from harombe.security.runtime.sandbox import Sandbox

__all__ = ["MAX_LIST_ENTRIES", "DirListing", "FileError", "Files", "checked_relative"]

FILE_TIMEOUT_S = 120.0
#: Deepest path accepted, in directories (the supervisor also counts those symlinks add).
MAX_PATH_DEPTH = 128
#: Entries a listing returns at most: the first by name; ``total`` still counts them all.
MAX_LIST_ENTRIES = 10_000


@dataclass(frozen=True)
class DirListing:
    """A directory's entries (``name``, ``type``, ``size``; ``target`` for symlinks), sorted by
    name; ``truncated`` when more exist than were returned, ``total`` the count of all."""

    entries: list[dict[str, Any]]
    total: int
    truncated: bool


def checked_relative(path: str, *, allow_root: bool = False) -> str:
    """:func:`workspace_relative`, and no deeper than :data:`MAX_PATH_DEPTH`."""
    rel = workspace_relative(path, allow_root=allow_root)
    depth = rel.count("/") + 1
    if depth > MAX_PATH_DEPTH:
        raise WorkspacePathError(
            f"path is {depth} directories deep, over {MAX_PATH_DEPTH}; use a shallower path"
        )
    return rel


#: How much of an error reply's kind and message reaches the caller.
MAX_KIND_CHARS = 80
MAX_MESSAGE_CHARS = 2000
#: The fields of a listing entry and their types: a forged entry keeps nothing else.
ENTRY_FIELDS: dict[str, type] = {
    "name": str, "type": str, "size": int, "target": str, "target_truncated": bool,
    "name_undecodable": bool, "target_undecodable": bool,
}  # fmt: skip


def checked_listing(reply: dict[str, Any]) -> DirListing:
    """The listing in a ``list`` reply, every entry checked field by field; ``ValueError`` /
    ``TypeError`` for a reply outside the protocol (it comes from inside the sandbox)."""
    raw = reply.get("entries")
    total = reply.get("total")
    if not isinstance(raw, list) or type(total) is not int or len(raw) > MAX_LIST_ENTRIES:
        raise ValueError("entries must be a list of at most MAX_LIST_ENTRIES, total a count")
    entries = [_checked_entry(entry) for entry in raw]
    total = max(total, len(entries))
    truncated = reply.get("truncated") is True or total > len(entries)
    return DirListing(entries=entries, total=total, truncated=truncated)


def _checked_entry(entry: object) -> dict[str, Any]:
    if not isinstance(entry, dict) or not {"name", "type"} <= entry.keys() <= ENTRY_FIELDS.keys():
        raise ValueError(f"an entry that is not a name and a type: {str(entry)[:80]}")
    for key, value in entry.items():
        if type(value) is not ENTRY_FIELDS[key] or (type(value) is int and value < 0):
            raise TypeError(f"an entry whose {key} is {str(value)[:40]!r}")
    return dict(entry)


async def _broken(box: Sandbox, what: str) -> NoReturn:
    """``box`` sent a reply outside the protocol: never trusted again (lost)."""
    await box.channel.close()
    raise SandboxLostError(f"sandbox {box.sandbox_id} broke the protocol: a malformed {what}")


class Files:
    """Workspace file operations on a sandbox, under ``limits`` (``max_file_bytes``)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    async def request(
        self, box: Sandbox, msg: dict[str, Any], blob: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        """Send one file request to ``box``'s supervisor (the caller holds ``box.lock``);
        a refusal becomes :class:`WorkspacePathError` or :class:`FileError`."""
        reply, data = await box.channel.request(msg, blob, timeout_s=FILE_TIMEOUT_S)
        if reply.get("ok"):
            return reply, data
        # From inside the sandbox: any type, any size (up to the frame cap); cut to a sentence.
        kind = str(reply.get("error"))[:MAX_KIND_CHARS]
        text = str(reply.get("message", ""))[:MAX_MESSAGE_CHARS]
        if kind == "WorkspacePathError":
            raise WorkspacePathError(text)
        raise FileError(f"{kind}: {text}")

    async def write(self, box: Sandbox, file_path: str, content: str | bytes) -> int:
        """Write ``content`` (str as UTF-8) to ``/workspace/<file_path>``; bytes written.

        The file is replaced atomically (a reader sees the old or the new content, never part),
        keeping the mode of the file it replaces; missing directories are created."""
        rel = checked_relative(file_path)
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        if len(data) > self.limits.max_file_bytes:
            raise UsageError(
                f"content is {len(data)} bytes, over max_file_bytes={self.limits.max_file_bytes}"
            )
        async with box.lock:
            msg = {"op": "write", "root": WORKSPACE, "path": rel}
            reply, _ = await self.request(box, msg, data)
            written = reply.get("bytes")
            if isinstance(written, bool) or not isinstance(written, int):
                await _broken(box, f"write reply ({str(written)[:40]!r} bytes written)")
            if not 0 <= written <= len(data):
                await _broken(box, f"write reply ({written} of {len(data)} bytes written)")
        return written

    async def read(self, box: Sandbox, file_path: str) -> bytes:
        """The bytes of regular file ``/workspace/<file_path>`` (at most ``max_file_bytes``;
        a larger file, a directory, FIFO, socket or device is a :class:`FileError`)."""
        rel = checked_relative(file_path)
        async with box.lock:
            msg = {
                "op": "read",
                "root": WORKSPACE,
                "path": rel,
                "max_bytes": self.limits.max_file_bytes,
            }
            _, data = await self.request(box, msg)
        return data

    async def list_directory(self, box: Sandbox, path: str = ".") -> DirListing:
        """The first :data:`MAX_LIST_ENTRIES` entries of a workspace directory by name, with
        the count of all; symlinks are reported with their target, never followed."""
        rel = checked_relative(path, allow_root=True)
        async with box.lock:
            msg = {"op": "list", "root": WORKSPACE, "path": rel, "max_entries": MAX_LIST_ENTRIES}
            reply, _ = await self.request(box, msg)
            try:
                return checked_listing(reply)
            except (TypeError, ValueError) as exc:
                await _broken(box, f"listing ({exc})")

    async def untar(self, box: Sandbox, archive: bytes, *, root: str) -> None:
        """Unpack a host-made tar.gz below ``root`` inside the sandbox (caller holds the lock)."""
        await self.request(box, {"op": "untar", "root": root}, archive)

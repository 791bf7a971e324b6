"""Workspace file operations, carried out by the supervisor inside the sandbox.

No host directory is ever shared with a sandbox, so no symlink planted by sandboxed code can
lead to the host. Paths are checked twice: lexically on the host
(:func:`harombe.security.paths.workspace_relative`) and after symlink resolution inside the
sandbox, which refuses anything that resolves outside ``/workspace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harombe.errors import UsageError, WorkspacePathError
from harombe.security.paths import WORKSPACE, workspace_relative

if TYPE_CHECKING:
    from harombe.security.sandbox import Sandbox

FILE_TIMEOUT_S = 120.0


class FileError(UsageError):
    """A file operation failed inside the sandbox (missing file, not a directory…)."""


class FileOps:
    """Mixin for :class:`~harombe.security.sandbox_manager.SandboxManager`."""

    limits: Any

    def get(self, sandbox_id: str) -> Sandbox:  # provided by the manager
        raise NotImplementedError

    async def _file_request(
        self, box: Sandbox, msg: dict[str, Any], blob: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        reply, data = await box.channel.request(msg, blob, timeout_s=FILE_TIMEOUT_S)
        if reply.get("ok"):
            return reply, data
        kind, text = reply.get("error"), reply.get("message", "")
        if kind == "WorkspacePathError":
            raise WorkspacePathError(text)
        raise FileError(f"{kind}: {text}")

    async def write_file(self, sandbox_id: str, file_path: str, content: str | bytes) -> int:
        """Write ``content`` (str as UTF-8) to ``/workspace/<file_path>``; bytes written."""
        rel = workspace_relative(file_path)
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        if len(data) > self.limits.max_file_bytes:
            raise UsageError(
                f"content is {len(data)} bytes, over max_file_bytes={self.limits.max_file_bytes}"
            )
        box = self.get(sandbox_id)
        async with box.lock:
            msg = {"op": "write", "root": WORKSPACE, "path": rel}
            reply, _ = await self._file_request(box, msg, data)
        return int(reply["bytes"])

    async def read_file(self, sandbox_id: str, file_path: str) -> bytes:
        """The bytes of ``/workspace/<file_path>`` (at most ``max_file_bytes``)."""
        rel = workspace_relative(file_path)
        box = self.get(sandbox_id)
        async with box.lock:
            msg = {
                "op": "read",
                "root": WORKSPACE,
                "path": rel,
                "max_bytes": self.limits.max_file_bytes,
            }
            _, data = await self._file_request(box, msg)
        return data

    async def list_files(self, sandbox_id: str, path: str = ".") -> list[dict[str, Any]]:
        """Entries of a workspace directory: ``{"name", "type", "size"}``, sorted by name."""
        rel = workspace_relative(path, allow_root=True)
        box = self.get(sandbox_id)
        async with box.lock:
            reply, _ = await self._file_request(box, {"op": "list", "root": WORKSPACE, "path": rel})
        return list(reply["entries"])

    async def _untar(self, box: Sandbox, archive: bytes, *, root: str) -> None:
        """Unpack a host-made tar.gz below ``root`` inside the sandbox (caller holds the lock)."""
        await self._file_request(box, {"op": "untar", "root": root}, archive)

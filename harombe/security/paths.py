"""Workspace path policy: pure, no I/O.

Every file path a caller gives is checked here, on the host, before anything is sent to the
sandbox; the supervisor then checks the *resolved* path again inside the sandbox, where symlinks
that user code planted are visible. Files never touch a host directory at all: reads and writes
travel over the sandbox's channel, so no symlink can reach the host.
"""

from __future__ import annotations

import posixpath

from harombe.errors import WorkspacePathError

WORKSPACE = "/workspace"
MAX_PATH_CHARS = 4096


def workspace_relative(path: str, *, allow_root: bool = False) -> str:
    """``path`` as a normalised path relative to ``/workspace``, or :class:`WorkspacePathError`.

    Accepts ``a/b.txt``, ``./a/b.txt`` and ``/workspace/a/b.txt``; refuses absolute paths
    elsewhere, any ``..`` component, NUL bytes and empty names. ``.`` (the workspace itself) is
    allowed only with ``allow_root`` (for listing).
    """
    if not isinstance(path, str):
        raise WorkspacePathError(f"file path must be a string, got {type(path).__name__}")
    if "\x00" in path:
        raise WorkspacePathError("file path contains a NUL byte; remove it")
    if len(path) > MAX_PATH_CHARS:
        raise WorkspacePathError(f"file path is longer than {MAX_PATH_CHARS} characters")
    stripped = path.strip()
    if stripped == "":
        raise WorkspacePathError("file path is empty; give a path relative to /workspace")
    if stripped.startswith("/"):
        if stripped == WORKSPACE or stripped.startswith(WORKSPACE + "/"):
            stripped = stripped[len(WORKSPACE) :].lstrip("/") or "."
        else:
            raise WorkspacePathError(
                f"absolute path {path!r} is outside /workspace; use a path relative to /workspace"
            )
    parts = [p for p in stripped.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspacePathError(
            f"path {path!r} contains '..'; paths must stay inside /workspace, so write it "
            "without '..'"
        )
    rel = posixpath.join(*parts) if parts else "."
    if rel == "." and not allow_root:
        raise WorkspacePathError(f"path {path!r} names /workspace itself; give a file name")
    return rel

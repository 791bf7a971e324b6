"""Workspace file operations for the in-sandbox supervisor (standard library only).

Part of the supervisor's source (see ``supervisor_sessions.py``); ``Refused`` comes from
``supervisor.py``. Every path is resolved inside the sandbox, symlinks followed, and refused if
it ends outside its root; the supervisor runs these with the sandbox user's effective uid.
"""

import os
import stat


class Refused(Exception):
    """A file operation that is refused; ``kind`` becomes the host-side error."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def resolve(root, rel):
    """Absolute path of ``rel`` under ``root`` after following symlinks; refuse escapes."""
    if "\x00" in rel or os.path.isabs(rel):
        raise Refused("WorkspacePathError", "path %r must be relative to %s" % (rel, root))
    full = os.path.realpath(os.path.join(root, rel))
    if full != root and not full.startswith(root + "/"):
        raise Refused(
            "WorkspacePathError",
            "path %r resolves outside %s (through '..' or a symlink); refused" % (rel, root),
        )
    return full


def op_write(msg, blob):
    full = resolve(msg["root"], msg["path"])
    parent = os.path.dirname(full)
    os.makedirs(parent, exist_ok=True)
    if os.path.realpath(parent) != parent:  # a symlink was planted while we created dirs
        raise Refused("WorkspacePathError", "path %r changed while writing" % msg["path"])
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(full, flags, int(msg.get("mode", 0o644)))
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    return {"bytes": len(blob)}, b""


def op_read(msg, _blob):
    full = resolve(msg["root"], msg["path"])
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise Refused("IsADirectoryError", "%r is a directory; use list" % msg["path"])
        limit = int(msg["max_bytes"])
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused("FileTooLargeError", "%r is larger than %d bytes" % (msg["path"], limit))
    return {"bytes": len(data)}, data


def op_list(msg, _blob):
    full = resolve(msg["root"], msg["path"])
    entries = []
    with os.scandir(full) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "file"
            )
            entries.append({"name": entry.name, "type": kind, "size": st.st_size})
    entries.sort(key=lambda e: e["name"])
    return {"entries": entries}, b""


def op_untar(msg, blob):
    """Unpack a tar (made by the host) below ``root``; every member must stay inside it."""
    import io

    root = msg["root"]
    os.makedirs(root, exist_ok=True)
    import tarfile  # only package installs need it; importing it costs start-up time

    try:
        return _untar(tarfile.open(fileobj=io.BytesIO(blob), mode="r:*"), root)
    except tarfile.TarError as exc:
        raise Refused("TarError", str(exc)) from None


def _untar(tar, root):
    with tar:
        members = tar.getmembers()
        for m in members:
            target = os.path.normpath(os.path.join(root, m.name))
            bad = not (target == root or target.startswith(root + "/"))
            if m.issym():
                dest = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname))
                bad = bad or os.path.isabs(m.linkname) or not dest.startswith(root + "/")
            if bad or m.islnk() or m.isdev() or m.isfifo():
                raise Refused("WorkspacePathError", "archive member %r is not allowed" % m.name)
            m.mode &= 0o755
        tar.extractall(root, members=members)
    return {"members": len(members)}, b""


FILE_OPS = {"write": op_write, "read": op_read, "list": op_list, "untar": op_untar}

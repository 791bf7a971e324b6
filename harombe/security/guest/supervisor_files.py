"""Workspace file operations for the in-sandbox supervisor: read, write, list, untar.

Standard library only; a part of the supervisor's source (see ``__init__.py``), after
``supervisor_paths.py``, whose :class:`Walk` reaches every file named here.

Reads open the final name with ``O_NOFOLLOW | O_NONBLOCK`` and check ``fstat`` before reading:
FIFOs, sockets, devices and directories are refused and no open or read can block. Writes are
atomic: the bytes go to a new temporary file in the target's directory, which is then renamed
over the name, so a reader sees the old file or the new one, never half of one, and an existing
file (a hard link included) is replaced, never written through; the mode of a replaced file is
kept. No fsync: the workspace is a tmpfs. Listings are sorted by name and capped in entries and
reply bytes, and say when they were cut. Every exception inside an operation becomes an error
reply (:func:`guarded`); none reaches the supervisor's loop.
"""

import errno
import os
import stat

#: A listing returns at most this many entries (the first by name) and counts the rest...
MAX_LIST_ENTRIES = 10000
#: ...up to this many: past it the count is a lower bound (``total_exact`` is false).
MAX_LIST_SCAN = 1000000
#: Bound on a listing reply's JSON, well under the host's frame cap.
MAX_LIST_REPLY_BYTES = 4 << 20
MAX_LINK_TARGET_CHARS = 1024
READ_CHUNK_BYTES = 1 << 20
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TEMP_PREFIX = ".harombe-write-"


def not_regular(path, mode, verb):
    if stat.S_ISDIR(mode):
        return Refused(
            "IsADirectoryError", "%s is a directory; list it, or name a file in it" % shown(path)
        )
    return Refused(
        "NotARegularFileError",
        "%s is a %s; only regular files can be %s" % (shown(path), kind_of(mode), verb),
    )


def op_read(msg, _blob):
    """The bytes of a regular file, at most ``max_bytes``; never blocks."""
    path, limit = msg["path"], int(msg["max_bytes"])
    with Walk(msg["root"], path) as walk:
        while True:
            name = walk.last()
            if name is None:
                raise not_regular(path, stat.S_IFDIR, "read")
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=walk.dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    walk.follow(name)
                    continue
                if exc.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
                    raise not_regular(path, stat.S_IFSOCK, "read") from None
                raise
            break
    try:
        data = read_regular(fd, path, limit)
    finally:
        os.close(fd)
    return {"bytes": len(data)}, data


def read_regular(fd, path, limit):
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode, "read")
    if st.st_size > limit:
        raise too_large(path, st.st_size, limit)
    chunks, got, want = [], 0, st.st_size + 1
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:  # it grew since fstat
            raise too_large(path, None, limit)
        if len(chunk) < want and got >= st.st_size:  # a short read past the size: the end
            break
        want = min(READ_CHUNK_BYTES, limit + 1 - got)
    return b"".join(chunks)


def too_large(path, size, limit):
    return Refused(
        "FileTooLargeError",
        "%s is %s bytes, over max_file_bytes (%d); read it in parts from code "
        "(e.g. `head -c`, `split`, or seek and read in Python), or raise max_file_bytes"
        % (shown(path), "more than %d" % limit if size is None else size, limit),
    )


def op_write(msg, blob):
    """Replace (or create) a regular file atomically, creating missing directories."""
    path = msg["path"]
    with Walk(msg["root"], path) as walk:
        while True:
            name = walk.last(create=True)
            if name is None:
                raise not_regular(path, stat.S_IFDIR, "written")
            try:
                st = os.stat(name, dir_fd=walk.dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                walk.follow(name)
                continue
            break
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode, "written (remove it first)")
        mode = stat.S_IMODE(st.st_mode) & 0o777 if st else int(msg.get("mode", 0o644)) & 0o777
        replace(walk.dir_fd, name, blob, mode)
    return {"bytes": len(blob)}, b""


def replace(dir_fd, name, blob, mode):
    """Write ``blob`` to a new file beside ``name`` and rename it over ``name``: the directory
    entry is replaced, never an existing inode written through (a hard link, say)."""
    temp = TEMP_PREFIX + os.urandom(8).hex()
    fd = os.open(temp, TEMP_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def op_list(msg, _blob):
    """The first ``max_entries`` entries of a directory by name, with the total count."""
    cap = max(0, min(int(msg.get("max_entries", MAX_LIST_ENTRIES)), MAX_LIST_ENTRIES))
    with Walk(msg["root"], msg["path"]) as walk:
        enter_all(walk)
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=walk.dir_fd)
    try:
        return listing(fd, cap), b""
    finally:
        os.close(fd)


def listing(fd, cap):
    kept, total, exact = [], 0, True
    with os.scandir(fd) as it:
        for entry in it:
            if total == MAX_LIST_SCAN:
                exact = False
                break
            total += 1
            kept.append(entry.name)
            if len(kept) >= 2 * cap + 1:  # keep the first ``cap`` by name in bounded memory
                kept.sort()
                del kept[cap:]
    kept.sort()
    del kept[cap:]
    entries, budget = [], MAX_LIST_REPLY_BYTES
    for name in kept:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:  # removed since the scan
            continue
        entry = {"name": name, "type": kind_of(st.st_mode), "size": st.st_size}
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=fd)
            except OSError:
                target = ""
            if len(target) > MAX_LINK_TARGET_CHARS:
                target = target[:MAX_LINK_TARGET_CHARS]
                entry["target_truncated"] = True
            entry["target"] = printable(target, entry, "target_undecodable")
        entry["name"] = printable(name, entry, "name_undecodable")
        budget -= json_bytes(entry["name"]) + json_bytes(entry.get("target", "")) + 96
        if budget < 0:
            break
        entries.append(entry)
    truncated = len(entries) < total or not exact
    return {"entries": entries, "total": total, "truncated": truncated, "total_exact": exact}


def printable(text, entry, flag):
    """``text`` as valid Unicode: undecodable bytes of a name are shown as ``\\xNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        entry[flag] = True
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def json_bytes(text):
    """An upper bound on ``text``'s length as ASCII JSON."""
    if text.isascii() and text.isprintable():
        return len(text) + text.count('"') + text.count("\\") + 2
    return 12 * len(text) + 2  # a character outside the BMP is two \\uXXXX escapes


def op_untar(msg, blob):
    """Unpack a tar made by the host below absolute ``root``, never following a link: ``root``
    and each member's directories are walked like workspace paths (a symlink anywhere is
    refused, naming its target), files are written by :func:`replace` (an existing entry is
    replaced, never written through), and only files, directories and symlinks that stay
    inside ``root`` are accepted. Modes keep at most 0755."""
    import io
    import tarfile  # only package installs need it; importing it costs start-up time

    root = os.path.normpath(msg["root"])
    if not root.startswith("/") or root == "/":
        raise Refused("WorkspacePathError", "untar root %s must be absolute" % shown(root))
    dirs = {}  # member directory (relative) -> descriptor, walked once per unpack
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            with Walk("/", root) as base:
                enter_all(base, create=True)
                dirs[""] = os.dup(base.dir_fd)
            count = 0
            for m in tar:
                unpack(tar, m, dirs, root)
                count += 1
    except tarfile.TarError as exc:
        raise Refused("TarError", str(exc)) from None
    finally:
        for fd in dirs.values():
            os.close(fd)
    return {"members": count}, b""


def unpack(tar, m, dirs, root):
    target = os.path.normpath(os.path.join(root, m.name))
    bad = not target.startswith(root + "/") or not (m.isfile() or m.isdir() or m.issym())
    if m.issym():
        dest = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname))
        bad = bad or os.path.isabs(m.linkname) or not dest.startswith(root + "/")
    if bad:
        raise Refused("WorkspacePathError", "archive member %s is not allowed" % shown(m.name))
    rel = target[len(root) + 1 :]
    parent, name = (rel, None) if m.isdir() else os.path.split(rel)
    dir_fd = held_dir(dirs, parent, root)
    if name is None:
        return
    if m.issym():
        temp = TEMP_PREFIX + os.urandom(8).hex()
        os.symlink(m.linkname, temp, dir_fd=dir_fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    source = tar.extractfile(m)
    replace(dir_fd, name, source.read() if source else b"", m.mode & 0o755)


def held_dir(dirs, rel, root):
    """The descriptor of directory ``rel`` below the unpack root, walked (and made) one
    component at a time from the nearest one already held, never through a symlink."""
    if rel in dirs:
        return dirs[rel]
    above, name = os.path.split(rel)
    with Walk(root, name, root_fd=held_dir(dirs, above, root)) as walk:
        enter_all(walk, create=True)
        dirs[rel] = os.dup(walk.dir_fd)
    return dirs[rel]


def guarded(fn):
    """``fn`` with every exception turned into :class:`Refused`, so that whatever a request or
    the sandbox's files do, the supervisor answers with an error and keeps serving."""

    def op(msg, blob):
        try:
            return fn(msg, blob)
        except Refused:
            raise
        except OSError as exc:
            reason = exc.strerror or str(exc)
            where = shown(msg.get("path", msg.get("root")))
            raise Refused(type(exc).__name__, "%s: %s" % (where, reason)) from None
        except KeyError as exc:
            raise Refused("BadRequest", "request lacks %s" % exc) from None
        except Exception as exc:
            raise Refused(type(exc).__name__, str(exc)[:500]) from None

    return op


FILE_OPS = {
    "write": guarded(op_write),
    "read": guarded(op_read),
    "list": guarded(op_list),
    "untar": guarded(op_untar),
}

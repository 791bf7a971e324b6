"""The workspace walk for the in-sandbox supervisor's file operations (standard library only).

A part of the supervisor's source (see ``__init__.py``). The supervisor runs file operations
with the sandbox user's effective uid and gid, and keeps no supplementary groups (Docker gives
root group 0), so the kernel checks exactly the user's permissions.

No path is ever resolved by the kernel. :class:`Walk` holds a descriptor of the root
(``/workspace``) and opens one component at a time relative to its parent's descriptor with
``O_PATH | O_NOFOLLOW``, so a symlink is opened as itself and seen, and nothing blocks or needs
read permission. A symlink anywhere in the path is refused, naming its target: what the gate
judged (the path as given) is exactly the file touched, and ``..`` above the root is refused.
A process that swaps links or renames directories during an operation can only change which
entry *inside the root* it reaches: every descriptor held is inside the root. (``O_DIRECTORY``
is never combined with ``O_NOFOLLOW``: gVisor release 20221219 follows a final symlink for that
pair.) Walks are iterative and capped in depth and length.
"""

import errno
import os
import stat
import sys

#: Components a path may have (the host checks it too).
MAX_PATH_DEPTH = 128
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
MAX_SYMLINKS = 40  # entries found swapped back from a symlink during one walk
MAX_SHOWN_CHARS = 120
#: Opens a component as itself: a symlink is not followed, a FIFO cannot block, no permission
#: on the entry itself is needed (search permission on its parent is).
WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "char_device"),
    (stat.S_ISBLK, "block_device"),
)


class Refused(Exception):
    """A file operation that is refused; ``kind`` becomes the host-side error."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def drop_supplementary_groups():
    """Leave this process with no supplementary groups, so that file operations, which switch
    only the effective uid and gid, carry none of root's (Docker starts PID 1 with group 0)."""
    if os.getuid() == 0 and os.getgroups():
        try:
            os.setgroups([])
        except OSError as exc:  # pragma: no cover - the container always grants CAP_SETGID
            sys.stderr.write("harombe-supervisor: setgroups failed: %r\n" % (exc,))


if __name__ == "__main__":  # only as the supervisor's source, never when imported on the host
    drop_supplementary_groups()


def shown(path):
    """``repr(path)``, cut short: error messages stay small whatever the path."""
    text = repr(path)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "..."


def kind_of(mode):
    for test, kind in KINDS:
        if test(mode):
            return kind
    return "other"


def components(rel):
    """The names of relative path ``rel``, checked: no NUL, not absolute, length, depth."""
    if type(rel) is not str:
        raise Refused("WorkspacePathError", "path must be a string")
    if len(rel) > MAX_PATH_CHARS:
        raise Refused(
            "WorkspacePathError",
            "path is %d characters, over %d; use a shorter path" % (len(rel), MAX_PATH_CHARS),
        )
    if "\x00" in rel:
        raise Refused("WorkspacePathError", "path %s contains a NUL byte" % shown(rel))
    if rel.startswith("/"):
        raise Refused("WorkspacePathError", "path %s must be relative" % shown(rel))
    parts = [p for p in rel.split("/") if p and p != "."]
    if len(parts) > MAX_PATH_DEPTH:
        raise Refused(
            "WorkspacePathError",
            "path %s is %d directories deep, over %d; use a shallower path"
            % (shown(rel), len(parts), MAX_PATH_DEPTH),
        )
    for part in parts:
        try:
            size = len(part.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            raise Refused(
                "WorkspacePathError", "path %s is not valid text (lone surrogate)" % shown(rel)
            ) from None
        if size > MAX_NAME_BYTES:
            raise Refused(
                "WorkspacePathError",
                "name %s is %d bytes; a file name has at most %d bytes"
                % (shown(part), size, MAX_NAME_BYTES),
            )
    return parts


class Walk:
    """Descriptors of the directories from ``root`` down to the current one, held while an
    operation runs (closed on exit); ``pending`` holds the names still to walk, last first."""

    def __init__(self, root, rel, root_fd=None):
        self.root = root
        self.rel = rel
        self.pending = components(rel.lstrip("/") if root_fd is None and root == "/" else rel)
        self.pending.reverse()
        self.links = 0
        fd = os.open(root if root_fd is None else ".", WALK_FLAGS, dir_fd=root_fd)
        self.fds = [fd]
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            self.close()
            raise Refused("WorkspacePathError", "%s is not a directory" % root)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        while self.fds:
            os.close(self.fds.pop())

    @property
    def dir_fd(self):
        return self.fds[-1]

    def last(self, create=False):
        """Walk every pending name but the last (creating missing directories if asked) and
        return the last; None when the path ends at a directory already held (``dir_fd``)."""
        while self.pending:
            name = self.pending.pop()
            if name == "..":
                self.up()
            elif not self.pending:
                return name
            else:
                self.enter(name, create)
        return None

    def up(self):
        if len(self.fds) == 1:
            raise Refused(
                "WorkspacePathError",
                "path %s leads above %s (through '..' or a symlink); refused"
                % (shown(self.rel), self.root),
            )
        os.close(self.fds.pop())

    def enter(self, name, create=False):
        """Step into directory ``name`` of the current one; a symlink there is resolved."""
        try:
            fd = os.open(name, WALK_FLAGS, dir_fd=self.dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(name, 0o755, dir_fd=self.dir_fd)
            except FileExistsError:  # made meanwhile: opened and checked like any other
                pass
            fd = os.open(name, WALK_FLAGS, dir_fd=self.dir_fd)
        try:
            mode = os.fstat(fd).st_mode
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISDIR(mode):
            self.fds.append(fd)
            self.check_depth()
            return
        os.close(fd)
        if stat.S_ISLNK(mode):
            self.follow(name)
            return
        raise NotADirectoryError(errno.ENOTDIR, "%s is not a directory" % shown(name))

    def follow(self, name):
        """Refuse symlink ``name`` (in the current directory): file operations never follow
        links, so the path the gate judged is the file touched. One swapped back to a plain
        entry meanwhile is looked at again."""
        self.links += 1
        try:
            target = os.readlink(name, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno == errno.EINVAL and self.links <= MAX_SYMLINKS:
                self.pending.append(name)  # no longer a symlink: look again
                return
            raise
        raise Refused(
            "WorkspacePathError",
            "%s in %s is a symbolic link (to %s); file operations do not follow links, so "
            "that the path approved is the file touched: use the path of its target"
            % (shown(name), shown(self.rel), shown(target)),
        )

    def check_depth(self):
        if len(self.fds) + len(self.pending) > MAX_PATH_DEPTH + 1:
            raise Refused(
                "WorkspacePathError",
                "path %s is more than %d directories deep (symlinks included); use a shallower "
                "path" % (shown(self.rel), MAX_PATH_DEPTH),
            )


def enter_all(walk, create=False):
    """Walk every pending name as a directory (refusing symlinks); ``walk.dir_fd`` is the end."""
    while True:
        name = walk.last(create)
        if name is None:
            return
        walk.enter(name, create)

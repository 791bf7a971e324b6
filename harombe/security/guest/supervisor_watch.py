"""The workspace as the last walk saw it, kept up to date by inotify, for the in-sandbox
supervisor: a call then pays for the files it touched, not for every file in ``/workspace``.

Standard library only; a part of the supervisor's source (see ``__init__.py``), after
``supervisor_artifacts.py``, whose ``SCAN`` it replaces with :func:`watched_scan`. The answer is
the walk's (``scan_workspace``): the same files, the same keys, the same ``cut``.

A :class:`Watch` holds what the walk saw (every directory it read, with its entries' kinds;
every regular file's key) and one inotify watch per such directory and per regular file, all
added with the user's ids (``AsUser``: what the user may not read is not watched, as it is not
walked), never following a link. Events name what to look at again: an entry of a directory
(``lstat``-ed, no link followed; a directory is walked afresh, its old subtree dropped) or a
file by its inode (so a write through a hard link elsewhere, even in ``.harombe``, is seen).
Files that cannot be watched are looked at on every scan.

The full walk runs instead whenever the events cannot be trusted: the first scan (inotify
needs ``ctypes``, imported once the supervisor is hardened), an overflowed queue, more than
:data:`MAX_EVENTS` events or :data:`MAX_DIRTY` paths since the last scan, a failed
``inotify_add_watch``, an entry that cannot be ``lstat``-ed, a change to ``/workspace`` itself,
a walk that would be cut (``MAX_SCAN_ENTRIES``, a path too long), or any exception. A walk that
is cut keeps no watches: the next scan walks again. Only under gVisor, whose inotify was
checked against the walk (on Linux a write through a shared mapping moves the mtime with no
event). The inotify descriptor is close-on-exec and non-blocking; :func:`drain_watch`, called as
a run is polled, keeps the kernel's queue short while user code runs.
"""

import errno
import os
import stat
import struct
import sys

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_ISDIR = 0x1000000, 0x2000000, 0x40000000
#: A directory's watch: its entries coming and going, and their attributes (a chmod decides
#: what the walk may read). Writes are seen by the files' own watches.
DIR_MASK = (
    IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
    | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
)  # fmt: skip
FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DONT_FOLLOW
#: Events read since the last scan (and paths named by them) past which the walk is cheaper.
MAX_EVENTS = 16384
MAX_DIRTY = 4096
READ_BYTES = 65536
EVENT = struct.Struct("iIII")


#: What the watch raises when only the walk can answer (any exception means that).
Untrusted = RuntimeError


class Watch:
    """The walk's view of ``root``, with the inotify watches that keep it current."""

    def __init__(self, root=None, *, cap=None):
        import ctypes

        self.root = root or WORKSPACE_ROOT
        self.cap = cap or MAX_SCAN_ENTRIES
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.get_errno = ctypes.get_errno
        self.fd = None
        self.walks = 0  # full walks so far (tests and the bench read it)
        self.plain = False  # the last walk was cut: walk without watching until it is not
        self.reset()

    def reset(self):
        """Forget everything; close the descriptor (its queue and watches go with it)."""
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
        self.dirs = None  # {dir rel: {name: "d" | "f" | "o"}} of the directories read
        self.files = {}  # {file rel: (mtime_ns, size, inode)}
        self.entries = 0  # entries of all read directories: the walk's count
        self.dir_wd, self.wd_dir = {}, {}  # dir rel <-> wd
        self.file_wd, self.wd_files = {}, {}  # file rel -> wd, wd -> {file rels}
        self.always = set()  # files that could not be watched: looked at on every scan
        self.dirty = set()  # (rel, is_dir) named by events since the last scan
        self.noted = set()  # the files' wds whose paths are in dirty
        self.events = 0
        self.broken = False
        self.fresh = set()  # directories read during this update

    def drain(self):
        """Read the queued events into :attr:`dirty`; give up (closing the descriptor, which
        frees the queue) past the bounds."""
        while self.fd is not None and not self.broken:
            try:
                buf = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return
            at = 0
            while at < len(buf) and not self.broken:  # one event names every link of a file
                wd, mask, _, size = EVENT.unpack_from(buf, at)
                name = os.fsdecode(buf[at + 16 : at + 16 + size].split(b"\0", 1)[0]) if size else ""
                at += 16 + size
                self.note(wd, mask, name)
                self.broken = self.broken or len(self.dirty) > MAX_DIRTY
            self.events += len(buf) // 16
            if self.events > MAX_EVENTS or not buf:
                self.broken = True
        if self.broken and self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def note(self, wd, mask, name):
        """What one event says must be looked at again."""
        if mask & IN_Q_OVERFLOW:
            self.broken = True
        elif wd in self.wd_dir:
            rel = self.wd_dir[wd]
            if name:
                self.dirty.add((rel + "/" + name if rel else name, bool(mask & IN_ISDIR)))
            elif not rel and mask & (IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                self.broken = True  # /workspace itself: its mode decides everything
            if mask & IN_IGNORED and self.dir_wd.get(self.wd_dir.pop(wd)) == wd:
                del self.dir_wd[rel]
        elif wd in self.wd_files:
            if wd not in self.noted:  # once: an event names every link of the file
                self.noted.add(wd)
                self.dirty.update((rel, False) for rel in self.wd_files[wd])
            if mask & IN_IGNORED:
                for rel in self.wd_files.pop(wd):
                    if self.file_wd.get(rel) == wd:
                        del self.file_wd[rel]

    def scan(self):
        """``(files, cut)`` as ``scan_workspace`` gives now; the caller holds the user's ids."""
        if self.fd is not None:
            self.drain()
        if self.dirs is not None and not self.broken:
            try:
                self.update()
                return dict(self.files), False
            except Exception:  # only the walk can answer
                pass
        return self.walk_all()

    def walk_all(self):
        """The full walk, watching what it reads; a cut walk keeps no watches, and the walks
        after it watch nothing until one is not cut."""
        self.reset()
        self.walks += 1
        if self.plain:
            files, cut = scan_workspace(self.root, self.cap)
            self.plain = cut
            return files, cut
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return scan_workspace(self.root, self.cap)
        self.fd, self.dirs = fd, {}
        try:
            self.walk_from("", self.cap)
            if "" not in self.dir_wd:
                raise Untrusted()  # /workspace unreadable: nothing would say when it is not
        except Exception:  # cut, or the watch failed
            self.reset()
            files, cut = scan_workspace(self.root, self.cap)
            self.plain = cut
            return files, cut
        self.fresh = set()
        return dict(self.files), False

    def walk_from(self, start, budget):
        """Read directory ``start`` and everything below it as the walk does, watching each
        directory before it is read and each regular file; raise :class:`Untrusted` past
        ``budget`` entries or at a path too long to open."""
        pending = [start]
        while pending:
            rel = pending.pop()
            path = self.root + "/" + rel if rel else self.root
            try:
                watched = self.watch_dir(rel)
                entries = os.scandir(path)
            except OSError as exc:  # unreadable, or gone: what is inside is not counted
                if exc.errno == errno.ENAMETOOLONG:
                    raise Untrusted() from None
                continue
            if not watched:  # readable, yet not watchable
                entries.close()
                raise Untrusted()
            names = self.dirs[rel] = {}
            self.fresh.add(rel)  # read now: what is below it needs no other look
            with entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > budget:
                        raise Untrusted()
                    sub = rel + "/" + entry.name if rel else entry.name
                    names[entry.name] = "o"
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            names[entry.name] = "d"
                            if rel or entry.name not in SKIPPED_TOP:
                                pending.append(sub)
                        elif entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            names[entry.name] = "f"
                            self.files[sub] = (st.st_mtime_ns, st.st_size, st.st_ino)
                            self.watch_file(sub)
                    except OSError:
                        continue

    def add_watch(self, rel, mask):
        path = os.fsencode(self.root + "/" + rel if rel else self.root)
        wd = self.libc.inotify_add_watch(self.fd, path, mask)
        if wd < 0:
            raise OSError(self.get_errno(), "inotify_add_watch")
        return wd

    def watch_dir(self, rel):
        """Whether directory ``rel`` is now watched (before it is read: what changes after
        is an event). If not, it must be unreadable, or the watch is untrusted."""
        try:
            wd = self.add_watch(rel, DIR_MASK)
        except OSError:
            return False
        old = self.wd_dir.get(wd)  # the same directory under its old name (a rename)
        if old is not None and self.dir_wd.get(old) == wd:
            del self.dir_wd[old]
        self.dir_wd[rel], self.wd_dir[wd] = wd, rel
        return True

    def unwatch_dir(self, rel):
        """Drop ``rel``'s watch, unless its directory is now watched under another name."""
        wd = self.dir_wd.pop(rel, None)
        if wd is not None and self.wd_dir.get(wd) == rel:
            del self.wd_dir[wd]
            self.libc.inotify_rm_watch(self.fd, wd)

    def watch_file(self, rel):
        """Watch file ``rel`` by its inode; one not readable (write-only, say) is looked at
        on every scan instead."""
        try:
            wd = self.add_watch(rel, FILE_MASK)
        except OSError:
            self.unwatch_file(rel)
            self.always.add(rel)
            return
        if self.file_wd.get(rel) != wd:
            self.unwatch_file(rel)
            self.file_wd[rel] = wd
            self.wd_files.setdefault(wd, set()).add(rel)
        self.always.discard(rel)

    def unwatch_file(self, rel):
        self.always.discard(rel)
        wd = self.file_wd.pop(rel, None)
        paths = self.wd_files.get(wd)
        if paths is not None:
            paths.discard(rel)
            if not paths:
                del self.wd_files[wd]
                self.libc.inotify_rm_watch(self.fd, wd)

    def update(self):
        """Look again at what the events named, shallow paths first; a directory's subtree is
        read afresh. Raises :class:`Untrusted` when only a walk can answer."""
        dirty = self.dirty | {(rel, False) for rel in self.always}
        self.dirty, self.noted, self.events = set(), set(), 0
        redone, self.fresh = set(), set()
        for rel, is_dir in sorted(dirty, key=lambda item: (item[0].count("/"), item)):
            parent, _, name = rel.rpartition("/")
            if parent not in self.dirs or parent in self.fresh or rel in redone:
                continue  # below a directory read afresh, dropped, or never read
            if is_dir or self.dirs[parent].get(name) == "d":
                self.redo(parent, name, rel)
                redone.add(rel)
            else:
                self.restat(parent, name, rel, redone)
        self.fresh = set()
        if self.entries > self.cap:
            raise Untrusted()

    def restat(self, parent, name, rel, redone):
        """One entry of a read directory, looked at again without following a link."""
        try:
            st = os.lstat(self.root + "/" + rel)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise Untrusted() from None
            self.forget_entry(parent, name, rel)
            return
        if stat.S_ISDIR(st.st_mode):
            self.redo(parent, name, rel)
            redone.add(rel)
            return
        self.set_entry(parent, name, "f" if stat.S_ISREG(st.st_mode) else "o")
        if stat.S_ISREG(st.st_mode):
            self.files[rel] = (st.st_mtime_ns, st.st_size, st.st_ino)
            self.watch_file(rel)
        else:
            self.files.pop(rel, None)
            self.unwatch_file(rel)

    def redo(self, parent, name, rel):
        """Entry ``rel`` was or is a directory: drop what was below it and read it again."""
        self.drop_tree(rel)
        self.forget_entry(parent, name, rel)
        try:
            st = os.lstat(self.root + "/" + rel)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise Untrusted() from None
            return
        if not stat.S_ISDIR(st.st_mode):
            self.restat(parent, name, rel, set())
            return
        self.set_entry(parent, name, "d")
        if parent or name not in SKIPPED_TOP:
            self.walk_from(rel, self.cap)

    def set_entry(self, parent, name, kind):
        names = self.dirs[parent]
        self.entries += name not in names
        names[name] = kind

    def forget_entry(self, parent, name, rel):
        names = self.dirs[parent]
        if names.pop(name, None) is not None:
            self.entries -= 1
        self.files.pop(rel, None)
        self.unwatch_file(rel)

    def drop_tree(self, top):
        """Forget directory ``top`` and everything read below it, with their watches."""
        pending = [top]
        while pending:
            rel = pending.pop()
            names = self.dirs.pop(rel, None)
            if names is None:
                continue
            self.unwatch_dir(rel)
            self.entries -= len(names)
            for name, kind in names.items():
                sub = rel + "/" + name
                if kind == "d":
                    pending.append(sub)
                else:
                    self.files.pop(sub, None)
                    self.unwatch_file(sub)


#: The supervisor's watch, made at the first scan after ``ctypes`` is loaded.
WATCH = [None]


def watched_scan():
    """``SCAN`` under gVisor: the walk's answer, from the watch when it can be trusted."""
    if not GVISOR or "ctypes" not in sys.modules:
        return scan_as_user()  # ctypes costs a cold start ~50 ms: not before hardening
    with AsUser():
        try:
            if WATCH[0] is None:
                WATCH[0] = Watch()
            return WATCH[0].scan()
        except Exception:  # never trust a watch that failed: walk, and start again
            if WATCH[0] is not None:
                WATCH[0].reset()
            return scan_workspace(WORKSPACE_ROOT)


def drain_watch():
    """Read what the watch has queued (cheap when nothing has): called as a run is polled."""
    watch = WATCH[0]
    if watch is not None and watch.fd is not None:
        try:
            watch.drain()
        except Exception:
            watch.reset()


SCAN[0] = watched_scan

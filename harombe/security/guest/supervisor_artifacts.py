"""What a call leaves behind, for the in-sandbox supervisor: the files it created or changed under
``/workspace``, and the images its Python code displayed.

Standard library only; a part of the supervisor's source (see ``__init__.py``), after
``supervisor_files.py`` (whose ``FILE_OPS`` it wraps). Every run takes a :func:`begin_call`
before its code starts and reports :func:`end_call`'s fields with its ``done``.

Changed files come from two walks of ``/workspace``, before and after the call, compared by
(mtime, size, inode) per regular file. The walks run with the user's ids, never follow a
symlink, never open anything but directories (a FIFO or a socket is only ``lstat``-ed), skip
the ``.harombe`` directory at the top (harombe's own files), and stop after
:data:`MAX_SCAN_ENTRIES` entries. No user code runs while they do: a call's processes are
stopped or dead when it reports. The walk after a call is kept as the state before the next
one, so a call pays for one walk; the supervisor's own writes into the workspace
(``write``, ``untar``) drop that state, so the next call looks again. Under gVisor
``supervisor_watch.py`` replaces :data:`SCAN`: the same answer from inotify events, so that
a call pays for what it touched rather than for every file.

Images are PNG bytes the Python worker sends after its reply's held stdout (see
``pyworker_artifacts.py``): ``artifacts`` in the reply lists ``[source, size]`` per image, in order.
The worker runs user code, so the list is checked and the sizes must fit the blob exactly.
"""

import errno
import os
import time

WORKSPACE_ROOT = "/workspace"
#: Entries (of every kind) one walk looks at; past it the walk stops and the result says so.
MAX_SCAN_ENTRIES = 10000
#: Changed files one result lists (by path); past it the result says so.
MAX_CHANGED_FILES = 200
#: Top-level directories of the workspace that are harombe's own, not the call's.
SKIPPED_TOP = frozenset((".harombe",))
#: What a worker may say about its images: how many, how long a source or a note is.
MAX_IMAGES = 64
MAX_IMAGE_NOTES = 8
MAX_NOTE_CHARS = 300
#: The walk after the last call: (files, cut), or None when it must be walked again.
LAST_SCAN = [None]
#: How the workspace is looked at: the walk, unless a later part installs something cheaper
#: with the same answer (``supervisor_watch.py``).
SCAN = [None]


def scan_workspace(root=WORKSPACE_ROOT, cap=MAX_SCAN_ENTRIES):
    """``({path relative to root: (mtime_ns, size, inode)}, cut)`` of the regular files under
    ``root``; ``cut`` says the walk stopped at ``cap`` entries. Never follows a symlink."""
    files = {}
    seen = 0
    pending = [""]
    cut = False
    while pending:
        rel = pending.pop()
        try:
            entries = os.scandir(root + "/" + rel if rel else root)
        except OSError as exc:  # unreadable, or gone: what is inside is not counted
            # Too deep to open by its path: files below it are missed, so the list says so.
            cut = cut or exc.errno == errno.ENAMETOOLONG
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > cap:
                    return files, True
                path = rel + "/" + entry.name if rel else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if rel or entry.name not in SKIPPED_TOP:
                            pending.append(path)
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        files[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
                except OSError:
                    continue
    return files, cut


def scan_as_user():
    with AsUser():
        return scan_workspace()


SCAN[0] = scan_as_user


def begin_call():
    """What :func:`end_call` compares against: the workspace before the call, and when the
    call started. Free when the last call's walk is still valid."""
    started_ns = time.time_ns()
    try:
        before = LAST_SCAN[0] or SCAN[0]()
    except Exception:  # never fail a run over its file list
        before = None
    return before, started_ns


def changed_files(before, after, started_ns):
    """``[[path, size, change], ...]`` of the files in ``after`` that are new or differ from
    ``before``, by path. A file the cut walk before did not see counts only if its mtime is
    within the call (and as ``modified``: it may have been there)."""
    old_files, old_cut = before
    changed = []
    for path, key in after.items():
        old = old_files.get(path)
        if old == key:
            continue
        if old is not None:
            change = "modified"
        elif not old_cut:
            change = "created"
        elif key[0] >= started_ns:
            change = "modified"
        else:
            continue
        changed.append([printable_path(path), key[1], change])
    changed.sort()
    return changed


def printable_path(path):
    """A path as valid UTF-8 text: undecodable bytes of a name are shown as ``\\xNN``."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        raw = path.encode("utf-8", "surrogateescape")
        return raw.decode("utf-8", "backslashreplace")


def end_call(run, msg):
    """Add the call's changed files and images to its ``done`` reply ``msg``; return the images'
    bytes, which follow the output in the reply's blob."""
    warnings = []
    before, started_ns = run.call_begun
    LAST_SCAN[0] = None
    try:
        after = SCAN[0]()
    except Exception as exc:
        after = None
        warnings.append("the files the call changed could not be listed: %r" % (exc,))
    if after is not None:
        LAST_SCAN[0] = after
        if before is None:
            before = ({}, True)  # unknown: only files touched during the call count
        changed = changed_files(before, after[0], started_ns)
        msg["changed_files"] = changed[:MAX_CHANGED_FILES]
        cut = after[1] or before[1] or len(changed) > MAX_CHANGED_FILES
        msg["changed_files_truncated"] = cut
        if cut:
            warnings.append(
                "changed_files is incomplete: the workspace walk stops at %d entries and at "
                "directories whose path is too long to open, and lists at most %d files"
                % (MAX_SCAN_ENTRIES, MAX_CHANGED_FILES)
            )
    images = run.images
    msg["artifacts"] = [[source, len(data)] for source, data in images]
    warnings.extend(run.image_notes)
    if warnings:
        msg["warnings"] = list(msg.get("warnings") or []) + warnings
    return b"".join(data for _, data in images)


def take_images(reply, blob):
    """Split a worker's reply blob into its held stdout and its images; raise
    :class:`Violation` unless the reply's ``artifacts`` and ``artifact_notes`` are well-formed
    and the images fit the blob exactly. Returns ``(stdout, [(source, png)], notes)``."""
    listed = reply.get("artifacts", [])
    notes = reply.get("artifact_notes", [])
    if type(listed) is not list or len(listed) > MAX_IMAGES:
        raise Violation("a malformed list of images")
    if type(notes) is not list or len(notes) > MAX_IMAGE_NOTES:
        raise Violation("a malformed list of image notes")
    if any(type(n) is not str or len(n) > MAX_NOTE_CHARS for n in notes):
        raise Violation("an image note that is not a short string")
    total = 0
    for item in listed:
        if (
            type(item) is not list
            or len(item) != 2
            or type(item[0]) is not str
            or len(item[0]) > 64
            or type(item[1]) is not int
            or item[1] <= 0
        ):
            raise Violation("a malformed image entry")
        total += item[1]
    if total > MAX_ARTIFACT_BYTES or total > len(blob):
        raise Violation("images larger than the cap or than what was sent")
    at = len(blob) - total
    stdout, images = blob[:at], []
    for source, size in listed:
        images.append((source, blob[at : at + size]))
        at += size
    return stdout, images, notes


def forgetting(op):
    """File operation ``op`` that drops the last walk: it changes the workspace itself."""

    def changing(msg, blob):
        LAST_SCAN[0] = None
        return op(msg, blob)

    return changing


for _name in ("write", "untar"):
    FILE_OPS[_name] = forgetting(FILE_OPS[_name])

"""What came back from a run with a host directory (see :mod:`harombe.mounts`): the program
that scans ``/mnt`` inside the sandbox, the check of what it reports, and the plan of changes
to apply to the host directory."""

from __future__ import annotations

from typing import Any

from harombe.errors import MountError
from harombe.mounts_host import MAX_DEPTH, MAX_PATH_CHARS, MountLimits, Plan, Snapshot

__all__ = ["SCAN_SOURCE", "checked_scan", "plan_changes", "refuse_writes"]

#: What the in-sandbox scan may call an entry; all but ``file`` and ``dir`` are refused.
KINDS = {"file", "dir", "symlink", "fifo", "socket", "char device", "block device", "other",
         "unreadable"}  # fmt: skip
REFUSED_KINDS = {
    "unreadable": "it cannot be read (its permissions were taken away)",
    "symlink": "a symbolic link",
    "fifo": "a FIFO",
    "socket": "a socket",
    "char device": "a character device",
    "block device": "a block device",
    "other": "not a regular file or directory",
}
TOO_DEEP = (f"its path is more than {MAX_DEPTH} names deep or {MAX_PATH_CHARS} characters "
            "long: not copied back, nor anything below it")  # fmt: skip
#: The fields of a scan's entry that the host keeps (anything else in it is dropped).
FIELDS = ("path", "type", "size", "links", "mode", "sha256")

#: Runs in the sandbox's Python session interpreter after the code (whose processes are gone
#: by then), as the sandbox user: lists ``/mnt`` without following links, hashes regular
#: files, and writes the list as JSON to a new file. Its answer is only a report from inside
#: the sandbox: the host checks every field (:func:`checked_scan`) and every byte it fetches.
SCAN_SOURCE = r"""
def _harombe_scan_mnt(out, cap):
    import hashlib, json, os, stat
    root = "/mnt"
    tests = ((stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"),
             (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char device"),
             (stat.S_ISBLK, "block device"))
    def kind(mode):
        for test, name in tests:
            if test(mode):
                return name
        return "other"
    def digest(path):
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return h.hexdigest()
                h.update(chunk)
        finally:
            os.close(fd)
    entries, index, stack, truncated = [], {}, [""], False
    while stack and not truncated:
        rel = stack.pop()
        try:
            names = sorted(os.listdir(os.path.join(root, rel) if rel else root))
        except OSError:
            names = []
            if rel:
                entries[index[rel]]["type"] = "unreadable"
        for name in names:
            path = rel + "/" + name if rel else name
            st = os.lstat(os.path.join(root, path))
            e = {"path": path, "type": kind(st.st_mode), "size": st.st_size,
                 "links": st.st_nlink, "mode": stat.S_IMODE(st.st_mode)}
            if e["type"] == "file":
                try:
                    e["sha256"] = digest(os.path.join(root, path))
                except OSError:
                    e["type"] = "unreadable"
            elif e["type"] == "dir":
                stack.append(path)
            entries.append(e)
            index[path] = len(entries) - 1
            if len(entries) > cap:
                truncated = True
                break
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"entries": entries, "truncated": truncated}, f)
"""


def checked_scan(raw: object, limits: MountLimits) -> list[dict[str, Any]]:
    """The in-sandbox scan's entries, checked field by field (they come from inside the
    sandbox); :class:`MountError` for anything outside the format or over ``max_entries``.
    An entry whose path is more than :data:`MAX_DEPTH` names deep or :data:`MAX_PATH_CHARS`
    characters long comes back as type ``too deep`` (refused by :func:`plan_changes`)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise MountError("the scan of /mnt came back malformed; nothing was applied")
    if raw.get("truncated") is not False or len(raw["entries"]) > limits.max_entries:
        raise MountError(f"/mnt holds more than max_entries={limits.max_entries} files and "
                         "directories after the run; nothing was applied")  # fmt: skip
    entries = []
    for entry in raw["entries"]:
        if not isinstance(entry, dict) or not _valid_entry(entry):
            raise MountError(f"the scan of /mnt has a malformed entry {str(entry)[:120]}; "
                             "nothing was applied")  # fmt: skip
        kept = {key: entry[key] for key in FIELDS if key in entry}
        path = kept["path"]
        if path.count("/") >= MAX_DEPTH or len(path) > MAX_PATH_CHARS:
            kept["type"] = "too deep"
        entries.append(kept)
    return entries


def _valid_entry(entry: dict[Any, Any]) -> bool:
    kind, size, links, mode = (entry.get(k) for k in ("type", "size", "links", "mode"))
    ok = _valid_path(entry.get("path")) and kind in KINDS and type(size) is int and size >= 0
    ok = ok and type(links) is int and type(mode) is int and 0 <= mode <= 0o7777
    if kind == "file":
        digest = entry.get("sha256")
        ok = ok and isinstance(digest, str) and len(digest) == 64
    return ok


def _valid_path(path: object) -> bool:
    if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def plan_changes(snap: Snapshot, entries: list[dict[str, Any]], limits: MountLimits) -> Plan:
    """Compare the scan of ``/mnt`` after the run with the directory before it. Links, hard
    links and special files are refused (the host's entries at and below that path are
    kept), and so are files past ``max_file_bytes`` or the ``max_bytes`` budget of what comes
    back, paths too deep, and entries whose directory is not a directory in the scan. What
    is below a refused entry is not looked at (the refusal covers it)."""
    plan, kept = Plan(), set()
    files = {e["path"] for e in entries if e["type"] == "file"}
    dirs = {e["path"] for e in entries if e["type"] == "dir"}
    budget = limits.max_bytes
    for entry in sorted(entries, key=lambda e: str(e["path"])):  # parents before children
        path, kind = entry["path"], entry["type"]
        parent = path.rpartition("/")[0]
        if parent in kept:
            kept.add(path)
            continue
        old = snap.files.get(path)
        if kind == "file" and old is not None and old.sha256 == entry["sha256"]:
            continue  # unchanged (also when hard-linked inside: nothing comes back)
        reason = _refusal(entry, budget, limits)
        if reason is None and parent and parent not in dirs:
            reason = "its directory is not a directory in the scan of /mnt"
        if reason is not None:
            plan.refused.append({"path": path, "change": "created" if old is None
                                 else "modified", "reason": reason})  # fmt: skip
            kept.add(path)
        elif kind == "dir":
            if path not in snap.dirs:
                plan.created_dirs.append(path)
        else:
            budget -= entry["size"]
            plan.writes[path] = {**entry, "change": "created" if old is None else "modified"}
    _plan_deletions(plan, snap, files, dirs, kept)
    return plan


def _plan_deletions(plan: Plan, snap: Snapshot, files: set[str], dirs: set[str],
                    kept: set[str]) -> None:  # fmt: skip
    """The host's files and directories gone from ``/mnt``, deepest first, but for those at
    or below a refused path."""
    covered = _covered(snap, kept)
    plan.deleted_files = sorted(set(snap.files) - files - covered, reverse=True)
    plan.deleted_dirs = sorted(snap.dirs - dirs - covered, reverse=True)


def refuse_writes(plan: Plan, snap: Snapshot, refused: dict[str, str]) -> None:
    """Take the writes of ``refused`` (path → reason, found when their bytes were fetched)
    out of ``plan``: the host's entries at and below each such path are kept, none deleted."""
    for path, reason in refused.items():
        entry = plan.writes.pop(path)
        plan.refused.append({"path": path, "change": entry["change"], "reason": reason})
    covered = _covered(snap, set(refused))
    plan.deleted_files = [p for p in plan.deleted_files if p not in covered]
    plan.deleted_dirs = [p for p in plan.deleted_dirs if p not in covered]


def _covered(snap: Snapshot, kept: set[str]) -> set[str]:
    """The host's paths at or below one in ``kept`` (one pass: the snapshot holds every
    directory of every path it holds, and a parent sorts before its children)."""
    covered: set[str] = set()
    if kept:
        for path in sorted({*snap.files, *snap.dirs}):
            if path in kept or path.rpartition("/")[0] in covered:
                covered.add(path)
    return covered


def _refusal(entry: dict[str, Any], budget: int, limits: MountLimits) -> str | None:
    kind, size = entry["type"], entry["size"]
    if not _utf8(entry["path"]):
        return "its name is not valid UTF-8: rename it in the code"
    if kind == "too deep":
        return TOO_DEEP
    if kind in REFUSED_KINDS:
        return f"{REFUSED_KINDS[kind]}: only regular files and directories are copied back"
    if kind == "dir":
        return None
    if entry["links"] > 1:
        return "a hard link (a file with more than one name): not copied back"
    if size > limits.max_file_bytes:
        return f"{size} bytes, over max_file_bytes={limits.max_file_bytes}"
    if size > budget:
        return f"{size} bytes, over what is left of max_bytes={limits.max_bytes}"
    return None


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

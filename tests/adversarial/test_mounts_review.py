"""Adversarial review of run-with-a-host-directory, host side: forged scans, a host directory
changed during the run, limits, and the sandbox's lifetime around a failing bring-back.

No Docker: the plan and apply code is driven with forged scans, and ``run_sandboxed_async``
with a stub manager whose "sandbox" ``/mnt`` is a temporary directory (the real scan program
runs over it, or a forged answer replaces it). Every host directory is a fresh temporary
directory; every link planted points at a canary inside another one.
"""

import asyncio
import hashlib
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.errors import FileError, MountError, UsageError
from harombe.mounts import run_sandboxed_async
from harombe.mounts_host import MountLimits, Snapshot, apply_changes, snapshot
from harombe.mounts_scan import SCAN_SOURCE, checked_scan, plan_changes
from harombe.security.runtime.sandbox import MNT, ExecutionResult

# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file(path: Any, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"path": path, "type": "file", "size": len(data), "links": 1, "mode": 0o644,
            "sha256": _sha(data), **extra}  # fmt: skip


def _dir(path: str) -> dict[str, Any]:
    return {"path": path, "type": "dir", "size": 0, "links": 2, "mode": 0o755}


def _tree(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (links not followed): path -> content, '/' or '-> target'."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "/"
            else:
                found[rel] = path.read_bytes().decode("utf-8", "replace")
    return found


def _unchanged_scan(snap: Snapshot) -> list[dict[str, Any]]:
    """The scan an untouched /mnt would give."""
    entries = [_dir(d) for d in sorted(snap.dirs)]
    for path, f in snap.files.items():
        entries.append({"path": path, "type": "file", "size": f.size_bytes, "links": 1,
                        "mode": f.mode, "sha256": f.sha256})  # fmt: skip
    return entries


def _bring_back(
    root: Path, entries: list[dict[str, Any]], contents: dict[str, bytes] | None = None, *,
    limits: MountLimits | None = None, snap: Snapshot | None = None,
    during: Callable[[], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """The host side of one run: snapshot (unless given), ``during`` (the host meddling while
    the code runs), the forged scan checked and planned, then applied with ``contents``."""
    limits = limits or MountLimits()
    snap = snap or snapshot(root, limits)
    if during is not None:
        during()
    checked = checked_scan({"entries": entries, "truncated": False}, limits)
    plan = plan_changes(snap, checked, limits)
    data = contents or {}
    return apply_changes(snap, plan, {p: data.get(p, b"") for p in plan.writes})


def _accounted(planned: set[str], changed: list[dict[str, Any]],
               refused: list[dict[str, Any]]) -> bool:  # fmt: skip
    """Nothing silently lost: every planned path is reported as applied or refused."""
    return planned <= {c["path"] for c in changed} | {r["path"] for r in refused}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "keep.txt").write_text("keep")
    (root / "sub" / "a.txt").write_text("a")
    (root / "sub" / "deep" / "b.txt").write_text("b")
    return root


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A directory outside the host directory with one file; it must never change."""
    place = tmp_path / "canary"
    place.mkdir()
    (place / "canary.txt").write_text("canary")
    (place / "a.txt").write_text("outside a.txt")  # what sub/a.txt would reach through a link
    before = _tree(place)
    yield place
    assert _tree(place) == before, "something outside mnt_dir was changed"


def _outside(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


# ------------------------------------------------------------------------------------------
# 1. forged paths
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["../x", "/etc/x", "a/../../x", "..", "a/..", ".", "./a", "a/", "/", "a\0b", "\0",
     "sub/../../x", 7, None, ["a"]],
    ids=["dotdot", "absolute", "climb", "bare-dotdot", "trailing-dotdot", "dot", "dot-first",
         "trailing-slash", "root", "nul", "only-nul", "sub-climb", "int", "none", "list"],
)  # fmt: skip
def test_a_forged_path_outside_the_directory_applies_nothing(
    host: Path, tmp_path: Path, canary: Path, path: Any
) -> None:
    """A scan naming a path that leaves mnt_dir (or is not a path) is refused as a whole."""
    before = _tree(host)
    snap = snapshot(host, MountLimits())
    with pytest.raises(MountError, match="nothing was applied"):
        _bring_back(host, [*_unchanged_scan(snap), _file(path, b"x")], snap=snap)
    assert _tree(host) == before
    assert _outside(tmp_path) == {"host", "canary"}


@pytest.mark.parametrize(
    ("name", "applied"),
    [("line\nbreak", True), ("tab\tand\rcr", True), ("é" * 127, True), ("x" * 256, False),
     ("ok/" + "y" * 300, False)],
    ids=["newline", "control-chars", "254-bytes", "256-bytes", "long-in-subdir"],
)  # fmt: skip
def test_odd_and_overlong_names_stay_inside_or_are_refused(
    host: Path, tmp_path: Path, name: str, applied: bool
) -> None:
    """Names with control characters land inside mnt_dir; names past 255 bytes are refused
    with a reason, never an exception."""
    snap = snapshot(host, MountLimits())
    extra = [_dir("ok")] if name.startswith("ok/") else []
    changed, refused = _bring_back(host, [*_unchanged_scan(snap), *extra, _file(name, b"n")],
                                   {name: b"n"}, snap=snap)  # fmt: skip
    assert (name in {c["path"] for c in changed}) is applied
    if applied:
        assert (host / name).read_bytes() == b"n"
    else:
        assert [r["path"] for r in refused] == [name] and refused[0]["reason"]
    assert _outside(tmp_path) == {"host"}


def test_a_scan_cannot_delete_mnt_dir_itself(host: Path, tmp_path: Path) -> None:
    """An empty scan deletes everything below mnt_dir and never mnt_dir itself."""
    changed, refused = _bring_back(host, [])
    assert refused == [] and host.is_dir() and _tree(host) == {}
    assert {c["path"] for c in changed} == {"keep.txt", "sub", "sub/a.txt", "sub/deep",
                                            "sub/deep/b.txt"}  # fmt: skip


@pytest.mark.parametrize("truncated", [None, 0, "false", [], True], ids=repr)
def test_a_scan_that_does_not_say_it_is_complete_applies_nothing(truncated: Any) -> None:
    """Only ``truncated: false`` counts as a complete scan: anything else deletes nothing."""
    with pytest.raises(MountError, match="max_entries"):
        checked_scan({"entries": [], "truncated": truncated}, MountLimits())


# ------------------------------------------------------------------------------------------
# 2. duplicates and type confusion
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries",
    [
        [_file("dup", b"1"), _file("dup", b"2")],
        [_dir("dup"), _file("dup", b"f")],
        [_file("dup", b"f"), _dir("dup"), _file("dup/in", b"i")],
        [_file("keep.txt", b"new"), _dir("keep.txt")],
        [_file("sub", b"file now"), _dir("sub"), _file("sub/a.txt", b"a")],
    ],
    ids=["file-twice", "dir-and-file", "file-dir-child", "host-file-as-both", "host-dir-as-both"],
)
def test_duplicate_entries_never_raise_and_everything_is_reported(
    host: Path, tmp_path: Path, entries: list[dict[str, Any]]
) -> None:
    """The same path twice (as file and directory, or two contents): each change is applied or
    refused, none raises, nothing lands outside, and no host file vanishes unreported."""
    snap = snapshot(host, MountLimits())
    base = [e for e in _unchanged_scan(snap) if e["path"] not in {x["path"] for x in entries}]
    contents = {e["path"]: b"2" for e in entries if e["type"] == "file"}
    changed, refused = _bring_back(host, [*base, *entries], contents, snap=snap)
    reported = {c["path"] for c in changed} | {r["path"] for r in refused}
    for path in set(snap.files) - set(_tree(host)):
        assert path in reported, f"{path} disappeared without a report"
    assert _outside(tmp_path) == {"host"}


def test_a_host_directory_reported_as_a_file_is_kept_when_the_host_filled_it(
    host: Path,
) -> None:
    """The code turned sub/ into a file while the host added sub/new.txt: the directory and
    the host's new file stay, and the file that could not replace it is refused."""
    snap = snapshot(host, MountLimits())
    entries = [e for e in _unchanged_scan(snap) if not e["path"].startswith("sub")]
    changed, refused = _bring_back(
        host, [*entries, _file("sub", b"flat")], {"sub": b"flat"}, snap=snap,
        during=lambda: (host / "sub" / "new.txt").write_text("host's"),
    )  # fmt: skip
    assert (host / "sub" / "new.txt").read_text() == "host's"
    assert (host / "sub").is_dir()
    assert sorted(r["change"] for r in refused if r["path"] == "sub") == ["created", "deleted"]
    assert "sub" not in {c["path"] for c in changed if c["type"] == "file"}


# ------------------------------------------------------------------------------------------
# 3. the host directory changed during the run
# ------------------------------------------------------------------------------------------


SWAPPED_CHANGES = {
    "create-file": ([_file("sub/new.txt", b"n")], {"sub/new.txt": b"n"}),
    "modify-file": ([_file("sub/a.txt", b"A!")], {"sub/a.txt": b"A!"}),
    "create-dir": ([_dir("sub/newdir"), _file("sub/newdir/f", b"f")], {"sub/newdir/f": b"f"}),
    "delete-file": ([], {}),
}


@pytest.mark.parametrize("change", list(SWAPPED_CHANGES), ids=list(SWAPPED_CHANGES))
def test_a_subdirectory_swapped_for_a_link_to_a_canary_is_never_written_through(
    host: Path, canary: Path, change: str
) -> None:
    """sub/ becomes a link to the canary directory during the run: creating, modifying or
    deleting below it is refused (or finds nothing), and the canary never changes."""
    snap = snapshot(host, MountLimits())
    extra, contents = SWAPPED_CHANGES[change]
    keep = [e for e in _unchanged_scan(snap) if e["path"] != "sub/a.txt" or change != "modify-file"]
    if change == "delete-file":
        keep = [e for e in keep if e["path"] != "sub/a.txt"]

    def swap() -> None:
        os.rename(host / "sub", host.parent / "sub-moved")
        os.symlink(canary, host / "sub")

    canary_before = _tree(canary)
    changed, refused = _bring_back(host, [*keep, *extra], contents, snap=snap, during=swap)
    assert _tree(canary) == canary_before
    touched = {c["path"] for c in changed}
    assert not any(p.startswith("sub/") for p in touched), touched
    assert os.path.islink(host / "sub")
    assert _accounted({p for p in contents} | ({"sub/a.txt"} if change == "delete-file" else set()),
                      changed, refused)  # fmt: skip


def test_a_host_file_hard_linked_to_a_canary_is_replaced_not_written_through(
    host: Path, canary: Path
) -> None:
    """keep.txt is a hard link of a file outside: modifying it replaces the name (the canary
    keeps its bytes); deleting it removes only the name."""
    (host / "keep.txt").unlink()
    os.link(canary / "canary.txt", host / "keep.txt")
    os.link(canary / "canary.txt", host / "other.txt")
    snap = snapshot(host, MountLimits())
    entries = [e for e in _unchanged_scan(snap) if e["path"] not in ("keep.txt", "other.txt")]
    changed, refused = _bring_back(host, [*entries, _file("keep.txt", b"new")],
                                   {"keep.txt": b"new"}, snap=snap)  # fmt: skip
    assert refused == []
    assert {(c["path"], c["change"]) for c in changed} == {("keep.txt", "modified"),
                                                           ("other.txt", "deleted")}  # fmt: skip
    assert (host / "keep.txt").read_bytes() == b"new"
    assert (canary / "canary.txt").read_text() == "canary"


@pytest.mark.parametrize("code_does", ["deletes", "modifies"])
def test_a_host_file_swapped_for_a_link_to_a_canary_keeps_the_link(
    host: Path, canary: Path, code_does: str
) -> None:
    """keep.txt becomes a link to the canary during the run: the code's deletion or change is
    refused as 'changed on the host', the link stays and the canary is untouched."""
    snap = snapshot(host, MountLimits())
    entries = [e for e in _unchanged_scan(snap) if e["path"] != "keep.txt"]
    if code_does == "modifies":
        entries.append(_file("keep.txt", b"code's"))

    def swap() -> None:
        (host / "keep.txt").unlink()
        os.symlink(canary / "canary.txt", host / "keep.txt")

    changed, refused = _bring_back(host, entries, {"keep.txt": b"code's"}, snap=snap, during=swap)
    assert [r["path"] for r in refused] == ["keep.txt"]
    assert "changed on the host" in refused[0]["reason"]
    assert os.readlink(host / "keep.txt") == str(canary / "canary.txt")
    assert changed == []


def test_a_whole_mnt_dir_replaced_by_a_link_applies_nothing(
    host: Path, tmp_path: Path, canary: Path
) -> None:
    """mnt_dir moved away and a link to the canary put in its place: nothing is applied there
    (it is opened without following a link, and its identity is checked): MountError."""
    snap = snapshot(host, MountLimits())
    os.rename(host, tmp_path / "moved")
    os.symlink(canary, host)
    plan = plan_changes(snap, [_file("canary.txt", b"pwned")], MountLimits())
    with pytest.raises(MountError, match="nothing was applied"):
        apply_changes(snap, plan, {"canary.txt": b"pwned"})


# ------------------------------------------------------------------------------------------
# 4. limits
# ------------------------------------------------------------------------------------------


def test_the_byte_budget_holds_over_many_forged_files(host: Path) -> None:
    """A hundred new files of 10 bytes under max_bytes=50: five are written, the rest refused
    with the limit named; the host gets no more than the budget."""
    limits = MountLimits(max_bytes=50, max_entries=1000)
    snap = snapshot(host, MountLimits())
    files = [_file(f"f{i:03d}", b"0123456789") for i in range(100)]
    changed, refused = _bring_back(host, [*_unchanged_scan(snap), *files],
                                   {f["path"]: b"0123456789" for f in files},
                                   limits=limits, snap=snap)  # fmt: skip
    written = sum(c["size_bytes"] for c in changed if c["change"] == "created")
    assert written <= 50 and len(refused) == 95
    assert all("max_bytes=50" in r["reason"] for r in refused)


def test_more_entries_than_the_limit_applies_nothing(host: Path) -> None:
    """A complete-looking scan with max_entries+1 entries deletes and writes nothing."""
    before = _tree(host)
    with pytest.raises(MountError, match="max_entries=3"):
        _bring_back(host, [_file(f"f{i}", b"") for i in range(4)],
                    limits=MountLimits(max_entries=3))  # fmt: skip
    assert _tree(host) == before


def _nested(root: Path, name: str, depth: int) -> None:
    """``root/name/name/...`` ``depth`` levels deep, made through descriptors (no PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)


def _remove_nested(root: Path, name: str) -> int:
    """Remove a chain made by :func:`_nested` (shutil.rmtree recurses and cannot); its depth."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                               dir_fd=fds[-1]))  # fmt: skip
        except FileNotFoundError:
            break
        for entry in os.listdir(fds[-1]):
            if entry != name:
                os.unlink(entry, dir_fd=fds[-1])
    depth = len(fds) - 1
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir(name, dir_fd=fds[-1])
    os.close(fds[0])
    return depth


def test_one_forged_entry_cannot_make_more_directories_than_max_entries(tmp_path: Path) -> None:
    """A scan with one file 3,000 directories deep (no directory entries) and max_entries=10:
    at most 10 new host entries, each of them reported."""
    root = tmp_path / "host"
    root.mkdir()
    path = "d/" * 3000 + "f"
    try:
        changed, _ = _bring_back(root, [_file(path, b"x")], {path: b"x"},
                                       limits=MountLimits(max_entries=10))  # fmt: skip
    finally:
        made = _remove_nested(root, "d")
    assert made <= 10, f"{made} directories were made on the host"
    assert made == sum(c["type"] == "directory" for c in changed)


def test_a_very_deep_host_directory_is_a_clear_mount_error(tmp_path: Path) -> None:
    """A host tree 1,100 levels deep (what an earlier run may have brought back): a
    MountError that names the depth, not a crash."""
    root = tmp_path / "host"
    root.mkdir()
    _nested(root, "d", 1100)
    try:
        with pytest.raises(MountError):
            snapshot(root, MountLimits())
    finally:
        _remove_nested(root, "d")


def test_a_deep_but_sane_tree_round_trips(tmp_path: Path) -> None:
    """200 levels (within every limit) are read in and a change at the bottom applies."""
    root = tmp_path / "host"
    root.mkdir()
    _nested(root, "d", 200)
    try:
        snap = snapshot(root, MountLimits())
        bottom = "/".join(["d"] * 200) + "/f"
        changed, refused = _bring_back(root, [*_unchanged_scan(snap), _file(bottom, b"b")],
                                       {bottom: b"b"}, snap=snap)  # fmt: skip
        assert refused == [] and [c["path"] for c in changed] == [bottom]
    finally:
        assert _remove_nested(root, "d") == 200


# ------------------------------------------------------------------------------------------
# 5. forged fields that are not paths
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["x", None, 1.5, [1], {"a": 1}],
                         ids=["str", "none", "float", "list", "dict"])  # fmt: skip
def test_a_forged_mode_is_refused_or_ignored_never_a_crash_mid_apply(host: Path, mode: Any) -> None:
    """A scan whose ``mode`` is not an int: a MountError before anything is applied, or the
    file is written with a default mode; never an exception after the deletions are done."""
    snap = snapshot(host, MountLimits())
    entries = [e for e in _unchanged_scan(snap) if e["path"] != "keep.txt"]
    try:
        changed, refused = _bring_back(host, [*entries, _file("new.txt", b"n", mode=mode)],
                                       {"new.txt": b"n"}, snap=snap)  # fmt: skip
    except MountError:
        assert (host / "keep.txt").exists(), "a MountError after keep.txt was deleted"
        return
    assert _accounted({"keep.txt", "new.txt"}, changed, refused)


# ------------------------------------------------------------------------------------------
# 6. run_sandboxed_async with a stub manager
# ------------------------------------------------------------------------------------------


class _Box:
    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.lock = asyncio.Lock()


class _Limits:
    max_file_bytes = 64 << 20


class _StubFiles:
    def __init__(self, manager: "_StubManager") -> None:
        self.m = manager

    async def untar(self, box: _Box, archive: bytes, *, root: str) -> None:
        assert root == MNT
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(self.m.mnt, filter="data")

    async def request(self, box: _Box, msg: dict[str, Any],
                      blob: bytes = b"") -> tuple[dict[str, Any], bytes]:  # fmt: skip
        where = {MNT: self.m.mnt, "/tmp": self.m.tmp}[msg["root"]]
        path = where / msg["path"]
        if msg["op"] == "write":
            path.write_bytes(blob)
            return {"ok": True}, b""
        if self.m.on_fetch is not None and msg["root"] == MNT:
            self.m.on_fetch(path)
        if not path.is_file() or path.is_symlink():
            raise FileError(f"FileNotFoundError: {msg['path']!r}")
        data = path.read_bytes()
        if len(data) > msg["max_bytes"]:
            raise FileError(f"FileTooLargeError: {msg['path']!r}")
        return {"ok": True, "bytes": len(data)}, data


class _StubManager:
    """What run_sandboxed_async uses of a SandboxManager; ``/mnt`` and ``/tmp`` of the one
    sandbox are directories under ``place``. ``program(mnt)`` stands for the user's code;
    ``scan`` (if set) answers instead of the real scan program; ``on_scan`` runs first."""

    def __init__(self, place: Path) -> None:
        self.mnt, self.tmp = place / "sandbox-mnt", place / "sandbox-tmp"
        self.mnt.mkdir()
        self.tmp.mkdir()
        self.files = _StubFiles(self)
        self.limits = _Limits()
        # The gate: the tests' runs are plain, auto-approved code; the config says so.
        self.config = parse_config({})
        self.sandboxes: set[str] = set()
        self.program: Callable[[Path], None] = lambda mnt: None
        self.scan: Callable[[Path], None] | None = None
        self.scan_result: Callable[[str], ExecutionResult] | None = None
        self.on_fetch: Callable[[Path], None] | None = None
        self.made = 0

    async def create_sandbox(self, language: str, **_: Any) -> _Box:
        self.made += 1
        box = _Box(f"sandbox-{self.made:012x}")
        self.sandboxes.add(box.sandbox_id)
        return box

    async def destroy_sandbox(self, sandbox_id: str) -> None:
        self.sandboxes.discard(sandbox_id)

    async def execute(self, sandbox_id: str, code: str, **_: Any) -> ExecutionResult:
        found = re.search(r"/tmp/(\.harombe-scan-[0-9a-f]+\.json)", code)
        if found is None:
            if "_o.chdir" not in code:  # the prelude moves the session; the rest is the program
                self.program(self.mnt)
            return _result(sandbox_id)
        if self.scan_result is not None:
            return self.scan_result(sandbox_id)
        out = self.tmp / found.group(1)
        if self.scan is not None:
            self.scan(out)
        else:
            scope: dict[str, Any] = {}
            exec(SCAN_SOURCE.replace('root = "/mnt"', f"root = {str(self.mnt)!r}"), scope)
            scope["_harombe_scan_mnt"](str(out), 10_000)
        return _result(sandbox_id)


def _result(sandbox_id: str, **kw: Any) -> ExecutionResult:
    base: dict[str, Any] = dict(success=True, sandbox_id=sandbox_id, stdout="", stderr="",
                                exit_code=0, execution_time=0.0, error=None, status="ok",
                                language="python", runtime="runsc")  # fmt: skip
    return ExecutionResult(**{**base, **kw})


@pytest.fixture
def stub(tmp_path: Path) -> _StubManager:
    place = tmp_path / "stub"
    place.mkdir()
    return _StubManager(place)


async def _run(stub: _StubManager, host: Path, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    return await run_sandboxed_async(code="pass", mnt_dir=host, manager=stub,  # type: ignore[arg-type]
                                     **kw)  # fmt: skip


async def test_the_stub_round_trip_applies_an_honest_run(stub: _StubManager, host: Path) -> None:
    """The real scan program over the stub's /mnt: a created, a modified and a deleted file
    come back, and the sandbox is destroyed."""

    def program(mnt: Path) -> None:
        (mnt / "new.txt").write_text("new")
        (mnt / "keep.txt").write_text("changed")
        (mnt / "sub" / "a.txt").unlink()

    stub.program = program
    res, changed = await _run(stub, host)
    assert res["mount_error"] is None and res["refused"] == []
    assert {(c["path"], c["change"]) for c in changed} == {
        ("new.txt", "created"),
        ("keep.txt", "modified"),
        ("sub/a.txt", "deleted"),
    }
    assert (host / "keep.txt").read_text() == "changed"
    assert stub.sandboxes == set()


async def test_a_file_that_grows_between_scan_and_fetch_is_refused(
    stub: _StubManager, host: Path
) -> None:
    """The file grows after the scan hashed it: refused (over its scanned size), and the
    host keeps its own version; the other change still applies."""

    def program(mnt: Path) -> None:
        (mnt / "keep.txt").write_text("v1")
        (mnt / "other.txt").write_text("o")

    def grow(path: Path) -> None:
        if path.name == "keep.txt":
            with path.open("ab") as f:
                f.write(b" and more")

    stub.program, stub.on_fetch = program, grow
    res, changed = await _run(stub, host)
    assert [r["path"] for r in res["refused"]] == ["keep.txt"]
    assert re.search("changed while|FileTooLargeError", res["refused"][0]["reason"])
    assert (host / "keep.txt").read_text() == "keep"
    assert [c["path"] for c in changed] == ["other.txt"]


async def test_an_exception_in_the_middle_of_apply_still_removes_the_sandbox(
    stub: _StubManager, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply_changes fails part-way: the error reaches the caller and no sandbox is left."""

    def boom(*_: Any) -> Any:
        raise OSError("disk went away")

    monkeypatch.setattr("harombe.mounts.apply_changes", boom)
    with pytest.raises(OSError, match="disk went away"):
        await _run(stub, host)
    assert stub.sandboxes == set()


async def test_a_sandbox_lost_during_the_scan_leaves_no_replacement(
    stub: _StubManager, host: Path
) -> None:
    """The sandbox dies during the scan and the manager replaces it: the result says nothing
    came back, and neither the sandbox nor its replacement is left."""

    def lost(sandbox_id: str) -> ExecutionResult:
        stub.sandboxes.discard(sandbox_id)
        replacement = f"sandbox-{0xFFF:012x}"
        stub.sandboxes.add(replacement)
        return _result(replacement, success=False, status="lost", exit_code=-1,
                       error="SandboxLostError: gone", replaced_sandbox_id=sandbox_id)  # fmt: skip

    stub.scan_result = lost
    res, changed = await _run(stub, host)
    assert changed == [] and "scan" in res["mount_error"]
    assert stub.sandboxes == set(), f"left behind: {stub.sandboxes}"


@pytest.mark.parametrize("scan", ["missing", "directory", "huge"])
async def test_a_scan_without_a_readable_answer_is_a_mount_error_in_the_result(
    stub: _StubManager, host: Path, scan: str
) -> None:
    """The code subverted the scan so that its output file is missing, a directory or too
    large: the call returns its result with ``mount_error``; the host is untouched."""
    before = _tree(host)

    def forged(out: Path) -> None:
        if scan == "directory":
            out.mkdir()
        elif scan == "huge":
            out.write_bytes(b" " * (stub.limits.max_file_bytes + 1))

    stub.scan = forged
    res, changed = await _run(stub, host)
    assert res["mount_error"] and changed == []
    assert _tree(host) == before and stub.sandboxes == set()


async def test_mnt_dir_replaced_during_the_run_is_reported_in_the_result(
    stub: _StubManager, host: Path, tmp_path: Path
) -> None:
    """The host directory is moved away and another made in its place while the code runs:
    the program's result comes back with ``mount_error``, and nothing is written."""

    def program(mnt: Path) -> None:
        (mnt / "new.txt").write_text("n")
        os.rename(host, tmp_path / "moved")
        host.mkdir()

    stub.program = program
    res, changed = await _run(stub, host)
    assert "replaced" in res["mount_error"] and changed == []
    assert _tree(host) == {} and stub.sandboxes == set()


async def test_a_script_path_that_climbs_out_of_mnt_is_a_usage_error(
    stub: _StubManager, tmp_path: Path
) -> None:
    """'/mnt/../etc/passwd' names no file under /mnt, whatever mnt_dir holds (here a file
    'passwd'): a UsageError before any sandbox, not a run of the sandbox's /etc/passwd."""
    root = tmp_path / "host"
    root.mkdir()
    (root / "passwd").write_text("print(1)")
    with pytest.raises(UsageError):
        await run_sandboxed_async(script_path="/mnt/../etc/passwd", mnt_dir=root,
                                  manager=stub)  # type: ignore[arg-type]  # fmt: skip
    assert stub.made == 0


# ------------------------------------------------------------------------------------------
# 7. modes, races while reading in, refusals after planning
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755], ids=["setuid", "setgid", "both"])
def test_bytes_from_the_sandbox_never_land_in_a_setuid_file(host: Path, mode: int) -> None:
    """A host file with the setuid or setgid bit, modified by the code: its new content is
    written without those bits (the supervisor's own writes keep at most 0777)."""
    target = host / "tool"
    target.write_bytes(b"#!/bin/sh\necho host\n")
    target.chmod(mode)
    snap = snapshot(host, MountLimits())
    entries = [e for e in _unchanged_scan(snap) if e["path"] != "tool"]
    evil = b"#!/bin/sh\nid\n"
    _, refused = _bring_back(
        host, [*entries, _file("tool", evil, mode=0o755)], {"tool": evil}, snap=snap
    )
    assert refused == [] and target.read_bytes() == evil
    assert target.stat().st_mode & 0o6000 == 0, oct(target.stat().st_mode)


def test_a_file_removed_while_the_directory_is_read_is_a_clear_mount_error(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host process removes keep.txt just after the directory is listed: a MountError
    that names the file and says to try again, not a bare OSError."""
    real = os.scandir

    class Listed(list[Any]):
        def __enter__(self) -> "Listed":
            return self

        def __exit__(self, *_: object) -> None:
            return None

    def listing_then_removal(fd: Any) -> Any:
        with real(fd) as it:
            listed = Listed(it)
        if os.path.exists(host / "keep.txt"):
            os.unlink(host / "keep.txt")
        return listed

    monkeypatch.setattr(os, "scandir", listing_then_removal)
    with pytest.raises(MountError, match=r"keep\.txt"):
        snapshot(host, MountLimits())


async def test_a_replacement_refused_at_fetch_keeps_what_it_would_replace(
    stub: _StubManager, host: Path
) -> None:
    """The code replaced the host's sub/ by a file 'sub' that changes before it is fetched:
    'sub' is refused, and, as for a refused link, the host's sub/ and its files are kept."""

    def program(mnt: Path) -> None:
        for path in sorted((mnt / "sub").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (mnt / "sub").rmdir()
        (mnt / "sub").write_text("flat")

    def change(path: Path) -> None:
        if path.name == "sub":
            path.write_text("FLAT")

    stub.program, stub.on_fetch = program, change
    res, changed = await _run(stub, host)
    assert ("sub", "created") in {(r["path"], r["change"]) for r in res["refused"]}
    assert (host / "sub" / "a.txt").read_text() == "a", f"lost: {changed}"

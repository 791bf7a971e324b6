"""The host side of a run with a host directory: reading it in, planning and applying changes."""

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harombe.errors import MountError
from harombe.mounts_host import MountLimits, Plan, Snapshot, apply_changes, snapshot
from harombe.mounts_scan import plan_changes


def _tree(root: Path) -> dict[str, str]:
    """Every file and directory below ``root``: path -> content, or '/' for a directory."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        found[rel] = "/" if path.is_dir() else path.read_text()
    return found


def _file(path: str, data: bytes, *, links: int = 1, mode: int = 0o644) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    return {"path": path, "type": "file", "size": len(data), "links": links,
            "mode": mode, "sha256": digest}  # fmt: skip


def _entry(path: str, kind: str) -> dict[str, Any]:
    return {"path": path, "type": kind, "size": 0, "links": 1, "mode": 0o755}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "io"
    (root / "sub").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "keep.txt").write_text("keep")
    (root / "sub" / "a.txt").write_text("a")
    return root


def test_snapshot_reads_files_and_directories_into_a_tar(host: Path) -> None:
    """Files, subdirectories and empty directories are in the snapshot and its tar."""
    snap = snapshot(host, MountLimits())
    assert set(snap.files) == {"keep.txt", "sub/a.txt"}
    assert snap.dirs == {"sub", "empty"}
    assert snap.files["keep.txt"].sha256 == hashlib.sha256(b"keep").hexdigest()
    assert snap.size_bytes == 5 and len(snap.archives) == 1
    with tarfile.open(fileobj=io.BytesIO(snap.archives[0])) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"empty", "keep.txt", "sub", "sub/a.txt"}
        assert members["empty"].isdir() and members["sub/a.txt"].isfile()
        extracted = tar.extractfile(members["sub/a.txt"])
        assert extracted is not None and extracted.read() == b"a"


def test_a_large_directory_goes_in_several_tars(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ARCHIVE_BYTES a new tar begins; together they hold every member once."""
    monkeypatch.setattr("harombe.mounts_host.ARCHIVE_BYTES", 4096)
    for i in range(5):
        (host / f"f{i}").write_bytes(bytes([i]) * 3000)
    snap = snapshot(host, MountLimits())
    assert len(snap.archives) >= 4
    names = []
    for archive in snap.archives:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            names += tar.getnames()
    assert sorted(names) == sorted([*snap.files, *snap.dirs])


def test_an_empty_directory_gives_an_empty_snapshot(tmp_path: Path) -> None:
    """An empty directory copies in nothing and is still a valid mount."""
    snap = snapshot(tmp_path, MountLimits())
    assert snap.files == {} and snap.dirs == set()
    assert snap.root == str(tmp_path.resolve())


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda root: (root / "link").symlink_to(root / "keep.txt"), "is a symbolic link"),
        (lambda root: (root / "out").symlink_to("/etc"), "is a symbolic link"),
        (lambda root: os.mkfifo(root / "fifo"), "is a special file"),
        (lambda root: (root / "sub" / "x").symlink_to("/etc/passwd"), "is a symbolic link"),
    ],
    ids=["symlink-inside", "symlink-out", "fifo", "symlink-in-subdir"],
)
def test_links_and_special_files_in_the_input_are_refused(host: Path, make: Any, said: str) -> None:
    """A link or special file anywhere in the directory is a MountError naming it."""
    make(host)
    with pytest.raises(MountError, match=said):
        snapshot(host, MountLimits())


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        (MountLimits(max_entries=3), "max_entries=3"),
        (MountLimits(max_file_bytes=3), "max_file_bytes=3"),
        (MountLimits(max_bytes=4), "max_bytes=4"),
    ],
    ids=["entries", "file-bytes", "total-bytes"],
)
def test_a_directory_over_a_limit_is_refused(host: Path, limits: MountLimits, said: str) -> None:
    """Each limit on what is copied in is checked, and the error names it."""
    with pytest.raises(MountError, match=said):
        snapshot(host, limits)


@pytest.mark.parametrize("target", ["missing", "keep.txt"], ids=["missing", "a-file"])
def test_mnt_dir_must_be_an_existing_directory(host: Path, target: str) -> None:
    """A missing path or a file is a MountError that says what to pass."""
    with pytest.raises(MountError, match=r"does not exist|not a directory"):
        snapshot(host / target, MountLimits())


def test_an_undecodable_name_is_refused(tmp_path: Path) -> None:
    """A name that is not UTF-8 cannot be carried: the error says to rename it."""
    open(os.fsencode(tmp_path) + b"/bad\xff", "w").close()
    with pytest.raises(MountError, match="not valid UTF-8"):
        snapshot(tmp_path, MountLimits())


def _plan(host: Path, entries: list[dict[str, Any]], **limits: int) -> tuple[Snapshot, Plan]:
    snap = snapshot(host, MountLimits())
    return snap, plan_changes(snap, entries, MountLimits(**limits))


def _as_before(extra: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    base = [_entry("sub", "dir"), _entry("empty", "dir"), _file("keep.txt", b"keep"),
            _file("sub/a.txt", b"a")]  # fmt: skip
    return [e for e in base if e["path"] not in drop] + extra


def test_an_unchanged_scan_plans_nothing(host: Path) -> None:
    """The same files and directories: nothing to write, delete or refuse."""
    _, plan = _plan(host, _as_before([]))
    assert plan == Plan()


def test_created_modified_and_deleted_are_planned(host: Path) -> None:
    """A new file, a changed file, a removed file and directory, a new directory."""
    new = [_file("new.txt", b"n"), _file("keep.txt", b"changed"), _entry("made", "dir")]
    entries = _as_before(new, drop=("keep.txt", "empty", "sub/a.txt"))
    _, plan = _plan(host, entries)
    assert {p: e["change"] for p, e in plan.writes.items()} == {
        "new.txt": "created", "keep.txt": "modified"}  # fmt: skip
    assert plan.deleted_files == ["sub/a.txt"]
    assert plan.deleted_dirs == ["empty"]
    assert plan.created_dirs == ["made"]
    assert plan.refused == []


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_entry("evil", "symlink"), "a symbolic link"),
        (_entry("pipe", "fifo"), "a FIFO"),
        (_entry("dev", "char device"), "a character device"),
        (_entry("sock", "socket"), "a socket"),
        (_file("hard", b"x", links=2), "a hard link"),
        (_entry("locked", "unreadable"), "cannot be read"),
    ],
    ids=["symlink", "fifo", "device", "socket", "hard-link", "unreadable"],
)
def test_links_and_special_files_are_refused(
    host: Path, entry: dict[str, Any], reason: str
) -> None:
    """What the code left that is not a plain file or directory is refused with a reason."""
    _, plan = _plan(host, _as_before([entry]))
    assert plan.writes == {}
    assert [(r["path"], r["change"]) for r in plan.refused] == [(entry["path"], "created")]
    assert reason in plan.refused[0]["reason"]


def test_a_link_in_place_of_a_host_file_keeps_the_host_file(host: Path) -> None:
    """keep.txt replaced by a link to /etc/passwd: refused, and keep.txt is not deleted."""
    entries = _as_before([_entry("keep.txt", "symlink")], drop=("keep.txt",))
    _, plan = _plan(host, entries)
    assert plan.deleted_files == []
    assert [(r["path"], r["change"]) for r in plan.refused] == [("keep.txt", "modified")]


def test_a_link_in_place_of_a_host_directory_keeps_its_contents(host: Path) -> None:
    """sub replaced by a link to /etc: refused, and nothing under sub is deleted."""
    entries = _as_before([_entry("sub", "symlink")], drop=("sub", "sub/a.txt"))
    _, plan = _plan(host, entries)
    assert plan.deleted_files == [] and plan.deleted_dirs == []
    assert plan.refused[0]["path"] == "sub"


def test_an_unchanged_hard_linked_file_is_not_a_change(host: Path) -> None:
    """A file the code only hard-linked (same content) is neither written nor refused."""
    _, plan = _plan(host, _as_before([_file("keep.txt", b"keep", links=2)], drop=("keep.txt",)))
    assert plan == Plan()


def test_files_past_the_byte_limits_are_refused_the_rest_apply(host: Path) -> None:
    """Over max_file_bytes, or past what is left of max_bytes: refused; smaller ones apply."""
    entries = _as_before([_file("big", b"x" * 50), _file("c1", b"x" * 30), _file("c2", b"y" * 30),
                          _file("small", b"z")])  # fmt: skip
    _, plan = _plan(host, entries, max_file_bytes=40, max_bytes=31)
    assert sorted(plan.writes) == ["c1", "small"]
    reasons = {r["path"]: r["reason"] for r in plan.refused}
    assert "max_file_bytes=40" in reasons["big"] and "max_bytes=31" in reasons["c2"]


def test_a_file_turned_into_a_directory_is_a_delete_and_a_create(host: Path) -> None:
    """keep.txt became a directory with a file in it; sub became a file."""
    entries = _as_before([_entry("keep.txt", "dir"), _file("keep.txt/in", b"i"),
                          _file("sub", b"s")], drop=("keep.txt", "sub", "sub/a.txt"))  # fmt: skip
    _, plan = _plan(host, entries)
    assert plan.deleted_files == ["sub/a.txt", "keep.txt"]
    assert plan.deleted_dirs == ["sub"]
    assert plan.created_dirs == ["keep.txt"]
    assert {p: e["change"] for p, e in plan.writes.items()} == {
        "keep.txt/in": "created", "sub": "created"}  # fmt: skip


def _apply(host: Path, entries: list[dict[str, Any]], data: dict[str, bytes],
           before: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    snap, plan = _plan(host, entries)
    if before is not None:
        before(host)
    return apply_changes(snap, plan, data)


def test_apply_writes_creates_and_deletes_inside_the_directory(host: Path) -> None:
    """Every planned change lands, and changed_files says what was done, with sizes."""
    entries = _as_before([_file("new/deep/ü.txt", b"u"), _entry("new", "dir"),
                          _entry("new/deep", "dir"), _file("keep.txt", b"changed"),
                          _file("run.sh", b"#!", mode=0o755)],
                         drop=("keep.txt", "sub/a.txt", "sub"))  # fmt: skip
    changed, refused = _apply(host, entries, {"new/deep/ü.txt": b"u", "keep.txt": b"changed",
                                              "run.sh": b"#!"})  # fmt: skip
    assert refused == []
    assert _tree(host) == {"empty": "/", "keep.txt": "changed", "new": "/", "new/deep": "/",
                           "new/deep/ü.txt": "u", "run.sh": "#!"}  # fmt: skip
    assert {(c["path"], c["change"], c["type"], c["size_bytes"]) for c in changed} == {
        ("sub/a.txt", "deleted", "file", 1), ("sub", "deleted", "directory", 0),
        ("new", "created", "directory", 0), ("new/deep", "created", "directory", 0),
        ("new/deep/ü.txt", "created", "file", 1), ("keep.txt", "modified", "file", 7),
        ("run.sh", "created", "file", 2)}  # fmt: skip
    assert (host / "run.sh").stat().st_mode & 0o777 == 0o755
    assert not [p for p in host.rglob(".harombe-mnt-*")]  # no temporary file left


def test_a_host_file_changed_during_the_run_is_kept(host: Path) -> None:
    """The host edited keep.txt meanwhile: the sandbox's version is refused, the rest applies."""
    entries = _as_before([_file("keep.txt", b"sandbox"), _file("new", b"n")], drop=("keep.txt",))

    def edit(root: Path) -> None:
        (root / "keep.txt").write_text("the host's edit")

    changed, refused = _apply(host, entries, {"keep.txt": b"sandbox", "new": b"n"}, edit)
    assert (host / "keep.txt").read_text() == "the host's edit"
    assert [r["path"] for r in refused] == ["keep.txt"] and "kept" in refused[0]["reason"]
    assert [c["path"] for c in changed] == ["new"]


def test_a_directory_swapped_for_a_link_never_redirects_a_write(
    host: Path, tmp_path: Path
) -> None:
    """sub/ replaced on the host by a link to a directory outside: the write into sub/ is
    refused and nothing is written outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = _as_before([_file("sub/a.txt", b"written")], drop=("sub/a.txt",))

    def swap(root: Path) -> None:
        (root / "sub" / "a.txt").unlink()
        (root / "sub").rmdir()
        (root / "sub").symlink_to(outside)

    changed, refused = _apply(host, entries, {"sub/a.txt": b"written"}, swap)
    assert changed == []
    assert [r["path"] for r in refused] == ["sub/a.txt"]
    assert "symbolic link" in refused[0]["reason"]
    assert list(outside.iterdir()) == []


def test_a_file_swapped_for_a_link_is_replaced_not_written_through(
    host: Path, tmp_path: Path
) -> None:
    """A new file whose name became a link on the host: refused, and the target is untouched."""
    target = tmp_path / "target.txt"
    target.write_text("outside")
    entries = _as_before([_file("new.txt", b"sandbox")])

    def plant(root: Path) -> None:
        (root / "new.txt").symlink_to(target)

    changed, refused = _apply(host, entries, {"new.txt": b"sandbox"}, plant)
    assert target.read_text() == "outside"
    assert changed == [] and [r["path"] for r in refused] == ["new.txt"]


def test_a_replaced_mnt_dir_applies_nothing(host: Path, tmp_path: Path) -> None:
    """The directory itself was moved away and another put in its place: MountError."""
    snap, plan = _plan(host, _as_before([_file("new", b"n")]))
    host.rename(tmp_path / "moved")
    host.mkdir()
    with pytest.raises(MountError, match="replaced during the run"):
        apply_changes(snap, plan, {"new": b"n"})
    assert list(host.iterdir()) == []


def test_a_directory_the_host_filled_meanwhile_is_not_removed(host: Path) -> None:
    """The code removed empty/, the host put a file in it: the directory stays, reported."""
    entries = _as_before([], drop=("empty",))

    def fill(root: Path) -> None:
        (root / "empty" / "host.txt").write_text("h")

    changed, refused = _apply(host, entries, {}, fill)
    assert (host / "empty" / "host.txt").read_text() == "h"
    assert changed == [] and [r["path"] for r in refused] == ["empty"]

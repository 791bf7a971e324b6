"""What comes back from /mnt that the host refuses or keeps apart: paths too deep, entries
whose directory is not in the scan, writes refused at fetch time, steps that fail mid-apply,
script paths that climb out of /mnt, and the CLI's exit when nothing came back."""

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest

from harombe.cli.run_mnt import mnt_exit_code
from harombe.errors import MountError, UsageError
from harombe.mounts import run_sandboxed
from harombe.mounts_host import (
    MAX_DEPTH,
    MAX_PATH_CHARS,
    MountLimits,
    Plan,
    apply_changes,
    snapshot,
)
from harombe.mounts_scan import TOO_DEEP, checked_scan, plan_changes, refuse_writes


def _file(path: str, data: bytes, *, mode: Any = 0o644) -> dict[str, Any]:
    return {"path": path, "type": "file", "size": len(data), "links": 1, "mode": mode,
            "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def _dir(path: str) -> dict[str, Any]:
    return {"path": path, "type": "dir", "size": 0, "links": 2, "mode": 0o755}


def _checked(*entries: dict[str, Any]) -> list[dict[str, Any]]:
    return checked_scan({"entries": list(entries), "truncated": False}, MountLimits())


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "sub").mkdir(parents=True)
    (root / "keep.txt").write_text("keep")
    (root / "sub" / "a.txt").write_text("a")
    return root


def test_a_path_past_the_depth_cap_is_refused_once_with_all_below_it(host: Path) -> None:
    """A chain of directories deeper than MAX_DEPTH: the first MAX_DEPTH levels are made,
    the next is refused (one refusal that covers the rest), nothing below it is looked at."""
    chain = ["/".join(["d"] * n) for n in range(1, MAX_DEPTH + 4)]
    bottom = f"{chain[-1]}/f"
    snap = snapshot(host, MountLimits())
    entries = [*_checked(_dir("sub"), _file("keep.txt", b"keep"), _file("sub/a.txt", b"a"),
                         *map(_dir, chain), _file(bottom, b"x"))]  # fmt: skip
    plan = plan_changes(snap, entries, MountLimits())
    assert plan.created_dirs == chain[:MAX_DEPTH]
    assert plan.refused == [{"path": chain[MAX_DEPTH], "change": "created", "reason": TOO_DEEP}]
    assert plan.writes == {} and plan.deleted_files == [] and plan.deleted_dirs == []


@pytest.mark.parametrize(
    ("path", "too_deep"),
    [("/".join(["d"] * MAX_DEPTH), False), ("/".join(["d"] * (MAX_DEPTH + 1)), True),
     ("x" * MAX_PATH_CHARS, False), ("x" * (MAX_PATH_CHARS + 1), True)],
    ids=["at-depth-cap", "past-depth-cap", "at-length-cap", "past-length-cap"],
)  # fmt: skip
def test_the_scan_check_marks_paths_past_the_caps(path: str, too_deep: bool) -> None:
    """checked_scan keeps a path at the caps as it is and marks one past them 'too deep'."""
    [entry] = _checked(_file(path, b"x"))
    assert (entry["type"] == "too deep") is too_deep


@pytest.mark.parametrize(
    ("entries", "refused"),
    [([_file("nodir/f", b"f")], "nodir/f"),
     ([_dir("nodir/inner")], "nodir/inner"),
     ([_file("keep.txt", b"keep"), _file("keep.txt/x", b"x")], "keep.txt/x")],
    ids=["file-without-its-directory", "directory-without-its-parent", "file-below-a-file"],
)  # fmt: skip
def test_an_entry_whose_directory_is_not_in_the_scan_is_refused(
    host: Path, entries: list[dict[str, Any]], refused: str
) -> None:
    """A forged entry below a path the scan does not list as a directory is refused with a
    reason, and applying the plan makes no directory for it."""
    snap = snapshot(host, MountLimits())
    base = [_dir("sub"), _file("sub/a.txt", b"a")]
    if not any(e["path"] == "keep.txt" for e in entries):
        base.append(_file("keep.txt", b"keep"))
    plan = plan_changes(snap, _checked(*base, *entries), MountLimits())
    assert [(r["path"], "not a directory in the scan" in r["reason"])
            for r in plan.refused] == [(refused, True)]  # fmt: skip
    changed, _ = apply_changes(snap, plan, {})
    assert changed == [] and not (host / "nodir").exists()
    assert (host / "keep.txt").read_text() == "keep"


def test_a_file_whose_host_directory_went_away_is_refused_not_made(host: Path) -> None:
    """sub/ is removed on the host during the run: the code's sub/new.txt is refused (its
    directory is not there) and sub/ is not made again."""
    snap = snapshot(host, MountLimits())
    entries = _checked(_file("keep.txt", b"keep"), _dir("sub"), _file("sub/a.txt", b"a"),
                       _file("sub/new.txt", b"n"))  # fmt: skip
    plan = plan_changes(snap, entries, MountLimits())
    (host / "sub" / "a.txt").unlink()
    (host / "sub").rmdir()
    changed, refused = apply_changes(snap, plan, {"sub/new.txt": b"n"})
    assert changed == [] and [r["path"] for r in refused] == ["sub/new.txt"]
    assert "not there on the host" in refused[0]["reason"]
    assert not (host / "sub").exists()


def test_a_write_refused_at_fetch_keeps_the_host_entries_it_would_replace(host: Path) -> None:
    """The file 'sub' that replaced the host's sub/ is refused when fetched: sub/ and its
    files leave the plan's deletions; keep.txt's deletion stays."""
    snap = snapshot(host, MountLimits())
    plan = plan_changes(snap, _checked(_file("sub", b"flat")), MountLimits())
    assert plan.deleted_files == ["sub/a.txt", "keep.txt"] and plan.deleted_dirs == ["sub"]
    refuse_writes(plan, snap, {"sub": "changed while it was being copied back"})
    assert plan.writes == {} and plan.deleted_dirs == []
    assert plan.deleted_files == ["keep.txt"]
    assert plan.refused == [{"path": "sub", "change": "created",
                             "reason": "changed while it was being copied back"}]  # fmt: skip


def test_a_step_that_fails_mid_apply_is_refused_and_the_rest_applies(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One write raising an unexpected error is refused with its type named; a forged
    non-int mode gives 0644; the deletion before it and the write after it are reported."""
    import harombe.mounts_host as mounts_host

    real = mounts_host._replace

    def flaky(dir_fd: int, name: str, data: bytes, mode: int) -> None:
        if name == "bad.txt":
            raise ValueError("no")
        real(dir_fd, name, data, mode)

    monkeypatch.setattr(mounts_host, "_replace", flaky)
    snap = snapshot(host, MountLimits())
    plan = Plan(deleted_files=["keep.txt"])
    plan.writes = {
        "bad.txt": {**_file("bad.txt", b"b"), "change": "created"},
        "odd.txt": {**_file("odd.txt", b"o", mode="x"), "change": "created"},
    }
    changed, refused = apply_changes(snap, plan, {"bad.txt": b"b", "odd.txt": b"o"})
    assert [c["path"] for c in changed] == ["keep.txt", "odd.txt"]
    assert refused == [{"path": "bad.txt", "change": "created",
                        "reason": "could not be applied (ValueError)"}]  # fmt: skip
    assert os.stat(host / "odd.txt").st_mode & 0o7777 == 0o644


@pytest.mark.parametrize(
    "script_path",
    ["/mnt/../etc/passwd", "/mnt/.", "/mnt/sub/../../x.py", "/mnt/", "//mnt/x.py"],
    ids=["climbs-out", "mnt-itself", "climbs-from-sub", "trailing-slash", "double-slash"],
)
def test_a_script_path_not_below_mnt_after_normalizing_is_refused(
    tmp_path: Path, script_path: str
) -> None:
    """script_path is normalized first: one that is /mnt itself or climbs out of it is a
    UsageError saying to give a path under /mnt, before any sandbox."""
    (tmp_path / "passwd").write_text("print(1)")
    with pytest.raises(UsageError, match="give a path under /mnt"):
        run_sandboxed(script_path=script_path, mnt_dir=tmp_path)


def test_a_script_path_that_normalizes_below_mnt_is_looked_up_there(tmp_path: Path) -> None:
    """'/mnt/./a/../code.py' is /mnt/code.py: checked against mnt_dir's files, not refused."""
    said = re.escape("'/mnt/./a/../code.py' is not a file in mnt_dir")
    with pytest.raises(UsageError, match=said):
        run_sandboxed(script_path="/mnt/./a/../code.py", mnt_dir=tmp_path)


@pytest.mark.parametrize(
    ("mount_error", "code", "exit_code"),
    [(None, 0, 0), ("lost", 0, 1), ("lost", 3, 3), (None, 124, 124)],
    ids=["fine", "nothing-came-back", "program-failed-too", "timeout"],
)
def test_mnt_exit_code(mount_error: str | None, code: int, exit_code: int) -> None:
    """A run that succeeded but brought nothing back exits 1; a failing program keeps its own."""
    assert mnt_exit_code({"mount_error": mount_error}, code) == exit_code


def test_cli_run_mnt_exits_1_when_nothing_came_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``harombe run --mnt DIR x.py``: the program exits 0 but its changes could not be
    brought back: exit 1, with the reason on stderr."""
    from harombe.cli import main as cli_main

    async def mounted(*_: Any, **__: Any) -> dict[str, Any]:
        why = "mnt_dir was replaced during the run"
        return {"status": "ok", "exit_code": 0, "stdout": "", "stderr": "", "refused": [],
                "mnt_changed": [], "mount_error": why}  # fmt: skip

    monkeypatch.setattr("harombe.cli.run.run_mounted", mounted)
    program = tmp_path / "x.py"
    program.write_text("print(1)")
    assert cli_main(["run", "--mnt", str(tmp_path), str(program)]) == 1
    assert "mnt: mnt_dir was replaced during the run" in capsys.readouterr().err


def test_a_host_tree_past_the_depth_cap_is_a_mount_error_and_leaks_no_descriptor(
    tmp_path: Path,
) -> None:
    """A host tree deeper than MAX_DEPTH: a MountError saying how deep, and every directory
    descriptor the walk opened is closed again; one exactly MAX_DEPTH deep is read whole."""
    root = tmp_path / "host"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(MAX_DEPTH + 5):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(MountError, match=f"more than {MAX_DEPTH} directories deep"):
        snapshot(root, MountLimits())
    assert len(os.listdir("/proc/self/fd")) == before
    at_cap = snapshot(root / "d" / "d" / "d" / "d" / "d", MountLimits())  # MAX_DEPTH below
    assert len(at_cap.dirs) == MAX_DEPTH and "/".join(["d"] * MAX_DEPTH) in at_cap.dirs

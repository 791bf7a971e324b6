"""The supervisor's inotify watch of the workspace, without Docker: after each file operation its
answer must be the full walk's (``scan_workspace``), and it must walk again whenever the events
cannot be trusted. Runs on the host's own inotify, on a temporary directory."""

from __future__ import annotations

import ctypes  # noqa: F401 - the watch uses it, as the hardened supervisor has it loaded
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.security.guest import SUPERVISOR_PARTS, load

SUPERVISOR = load(SUPERVISOR_PARTS, "harombe_supervisor_watch")
Op = Callable[[Path], Any]


def write(rel: str, text: str = "x", mode: str = "w") -> Op:
    def op(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(root / rel, mode) as f:
            f.write(text)

    return op


def sh(script: str) -> Op:
    return lambda root: subprocess.run(["sh", "-c", script], cwd=root, check=True)


def seeded(root: Path) -> None:
    """A small tree the operations work on."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("one")
    (root / "top.txt").write_text("top")
    (root / ".harombe").mkdir()
    (root / ".harombe" / "own").write_text("h")


#: (id, operations, whether the watch may answer without walking again)
CASES: list[tuple[str, list[Op], bool]] = [
    ("nothing", [], True),
    ("create", [write("new.txt")], True),
    ("append", [write("top.txt", "more", "a")], True),
    ("truncate", [lambda r: os.truncate(r / "top.txt", 1)], True),
    ("same-size-rewrite", [write("top.txt", "TOP")], True),
    ("rename-file", [lambda r: os.rename(r / "top.txt", r / "moved.txt")], True),
    ("rename-over", [write("other", "o"), lambda r: os.replace(r / "other", r / "top.txt")], True),
    ("mkdir-p-deep", [write("d1/d2/d3/d4/g.txt", "deep")], True),
    ("rm-rf", [lambda r: shutil.rmtree(r / "a")], True),
    ("rename-dir", [lambda r: os.rename(r / "a", r / "z")], True),
    (
        "dir-moved-in",
        [write(".harombe/in/sub/m", "m"), lambda r: os.rename(r / ".harombe/in", r / "in")],
        True,
    ),
    ("dir-moved-out", [lambda r: os.rename(r / "a", r / ".harombe/a")], True),
    (
        "dir-replaced-by-symlink",
        [lambda r: shutil.rmtree(r / "a"), lambda r: os.symlink("/etc", r / "a")],
        True,
    ),
    (
        "hard-link-written-elsewhere",
        [
            lambda r: os.link(r / "top.txt", r / ".harombe/hl"),
            write(".harombe/hl", "via link", "a"),
        ],
        True,
    ),
    (
        "hard-link-inside",
        [lambda r: os.link(r / "top.txt", r / "a/hl"), write("top.txt", "both", "a")],
        True,
    ),
    ("chmod-file", [lambda r: os.chmod(r / "top.txt", 0o600)], True),
    (
        "write-only-file",
        [lambda r: os.chmod(r / "top.txt", 0o200), write("top.txt", "w", "a")],
        True,
    ),
    ("unreadable-dir", [lambda r: os.chmod(r / "a", 0o300), write("a/hidden", "h")], True),
    (
        "dir-readable-again",
        [
            lambda r: os.chmod(r / "a", 0o300),
            write("a/hidden", "h"),
            lambda r: os.chmod(r / "a", 0o755),
        ],
        True,
    ),
    ("utime-old-mtime", [lambda r: os.utime(r / "top.txt", (1_000_000_000, 1_000_000_000))], True),
    ("file-becomes-dir", [lambda r: os.unlink(r / "top.txt"), write("top.txt/inner", "i")], True),
    (
        "harombe-becomes-file",
        [lambda r: shutil.rmtree(r / ".harombe"), write(".harombe", "f")],
        True,
    ),
    (
        "symlink-fifo",
        [lambda r: os.symlink("top.txt", r / "s"), lambda r: os.mkfifo(r / "p")],
        True,
    ),
    (
        "background-writer",
        [sh("(i=0; while [ $i -lt 50 ]; do echo $i >> bg; i=$((i+1)); done) & wait")],
        True,
    ),
    ("workspace-chmod", [lambda r: os.chmod(r, 0o700)], False),
]


def run_case(tmp_path: Path, ops: list[Op]) -> Any:
    root = tmp_path / "ws"
    root.mkdir()
    seeded(root)
    watch = SUPERVISOR.Watch(str(root))
    assert watch.scan() == SUPERVISOR.scan_workspace(str(root))
    for op in ops:
        op(root)
        got = watch.scan()
        assert got == SUPERVISOR.scan_workspace(str(root))
    return watch


@pytest.mark.parametrize(("ops", "trusted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_watch_answers_as_the_walk_does(tmp_path: Path, ops: list[Op], trusted: bool) -> None:
    """After each operation the watch's (files, cut) is the full walk's, from events alone
    where they can be trusted."""
    try:
        watch = run_case(tmp_path, ops)
        assert (watch.walks == 1) is trusted
    finally:
        for path in [tmp_path / "ws", *(tmp_path / "ws").rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o755)
    watch.reset()


@pytest.mark.parametrize(
    ("cap", "value", "command"),
    [
        ("MAX_EVENTS", 50, "for i in $(seq 1 40); do echo $i > f$i; done"),
        ("MAX_DIRTY", 5, "for i in $(seq 1 20); do : > f$i; done"),
    ],
    ids=["too-many-events", "too-many-paths"],
)
def test_past_a_cap_the_walk_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: str, value: int, command: str
) -> None:
    """Past MAX_EVENTS (the queue is dropped, its descriptor closed) or MAX_DIRTY paths named
    since the last scan, the walk answers, and the watch it rebuilds works."""
    monkeypatch.setitem(SUPERVISOR.__dict__, cap, value)
    watch = run_case(tmp_path, [sh(command)])
    assert watch.walks == 2
    watch.drain()  # a watch rebuilt by the walk, whose queue is empty
    assert (watch.broken, watch.fd is not None) == (False, True)
    watch.reset()


def test_an_overflowed_queue_is_never_trusted(tmp_path: Path) -> None:
    """IN_Q_OVERFLOW marks the watch broken: the next scan walks."""
    watch = run_case(tmp_path, [])
    watch.note(-1, SUPERVISOR.IN_Q_OVERFLOW, "")
    assert watch.scan() == SUPERVISOR.scan_workspace(str(tmp_path / "ws"))
    assert watch.walks == 2
    watch.reset()


def test_a_workspace_over_the_cap_is_walked_and_says_cut(tmp_path: Path) -> None:
    """Growing past the walk's cap gives the walk's cut answer; the walks after it watch
    nothing until the workspace is back under the cap."""
    root = tmp_path / "ws"
    root.mkdir()
    watch = SUPERVISOR.Watch(str(root), cap=10)
    assert watch.scan() == ({}, False)
    for i in range(12):
        (root / f"f{i}").write_text("")
    assert watch.scan() == SUPERVISOR.scan_workspace(str(root), cap=10)
    assert watch.scan()[1] is True and watch.fd is None
    for i in range(6):
        (root / f"f{i}").unlink()
    assert watch.scan() == SUPERVISOR.scan_workspace(str(root), cap=10)
    walks = watch.walks
    (root / "f0").write_text("")
    assert watch.scan() == SUPERVISOR.scan_workspace(str(root), cap=10)
    assert watch.walks in (walks, walks + 1) and watch.fd is not None
    watch.reset()


def test_a_failing_watch_walks_and_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any exception inside the watch gives the walk's answer and a fresh watch."""
    monkeypatch.setitem(SUPERVISOR.__dict__, "WORKSPACE_ROOT", str(tmp_path))
    monkeypatch.setitem(SUPERVISOR.__dict__, "GVISOR", True)
    monkeypatch.setitem(SUPERVISOR.__dict__, "WATCH", [None])
    (tmp_path / "a").write_text("a")
    assert SUPERVISOR.watched_scan() == SUPERVISOR.scan_workspace(str(tmp_path))
    watch = SUPERVISOR.WATCH[0]

    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(watch, "update", broken)
    (tmp_path / "b").write_text("b")
    assert SUPERVISOR.watched_scan() == SUPERVISOR.scan_workspace(str(tmp_path))
    assert watch.walks == 2 and watch.fd is not None
    monkeypatch.setattr(watch, "scan", broken)
    (tmp_path / "c").write_text("c")
    assert SUPERVISOR.watched_scan() == SUPERVISOR.scan_workspace(str(tmp_path))
    assert watch.fd is None and watch.dirs is None


def test_the_inotify_descriptor_is_close_on_exec(tmp_path: Path) -> None:
    """User code never inherits the watch: its descriptor is close-on-exec and non-blocking."""
    watch = run_case(tmp_path, [])
    assert fcntl.fcntl(watch.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert os.get_blocking(watch.fd) is False
    watch.reset()


def test_the_supervisor_installs_the_watched_scan() -> None:
    """The joined supervisor looks at the workspace through the watch."""
    assert SUPERVISOR.SCAN[0] is SUPERVISOR.watched_scan

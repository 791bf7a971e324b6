"""Attacks on the supervisor's inotify watch of the workspace (``supervisor_watch.py``), without
Docker: on the host's own inotify, on a temporary directory. Its answer must stay the full
walk's (``scan_workspace``) whatever the operations between two scans, and the work one drain
or one scan does must stay bounded by what the workspace holds, not by how its names are
shaped."""

from __future__ import annotations

import ctypes  # noqa: F401 - the watch uses it, as the hardened supervisor has it loaded
import os
import random
import shutil
import stat
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from harombe.security.guest import SUPERVISOR_PARTS, load

SUPERVISOR = load(SUPERVISOR_PARTS, "harombe_supervisor_watch_review")


def walk(root: Path) -> Any:
    return SUPERVISOR.scan_workspace(str(root))


def loosen(root: Path) -> None:
    """Make every directory below ``root`` readable again (for the walk and the clean-up)."""
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o755)


@pytest.mark.parametrize(
    ("old", "new"),
    [("a", "0"), ("a", "z"), ("a", "b/0"), ("b", ".harombe/0"), ("a/c", "0")],
    ids=["earlier-name", "later-name", "into-a-sibling", "out-and-back", "up-a-level"],
)
def test_a_renamed_directory_keeps_its_watch(tmp_path: Path, old: str, new: str) -> None:
    """A directory renamed to a name looked at before its old one is still watched: files
    created in it (and below it) afterwards are listed, from events alone."""
    root = tmp_path / "ws"
    for rel in ("a/c/d", "b", ".harombe"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    (root / "a/c/d/f").write_text("f")
    watch = SUPERVISOR.Watch(str(root))
    assert watch.scan() == walk(root)
    os.rename(root / old, root / new)
    if new.startswith(".harombe"):  # and back under another name, in the next call
        assert watch.scan() == walk(root)
        os.rename(root / new, root / "0")
        new = "0"
    assert watch.scan() == walk(root)
    (root / new / "created").write_text("new")
    for sub in (root / new).rglob("*"):
        if sub.is_dir():
            (sub / "created").write_text("new")
    assert watch.scan() == walk(root)
    assert watch.walks == 1
    watch.reset()


NAMES = ["a", "b", "c", ".harombe", "0"]


def inside(root: Path, path: str) -> bool:
    """Whether ``path``, every link in it followed, stays below ``root``."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base + "/")


def random_op(root: Path, rng: random.Random, *, decoys: tuple[Path, Path]) -> None:
    """One random file operation below ``root``; failures (a missing path) are ignored. The
    tree holds links out of ``root`` — to ``decoys``, two directories beside it standing for
    / and /proc (the test may run as root, so its links never name the host's own) — and an
    operation that would reach outside ``root`` through one is not done either."""

    def pick() -> str:
        return str(root / "/".join(rng.choice(NAMES) for _ in range(rng.randint(1, 3))))

    p, q, kind = pick(), pick(), rng.randrange(11)
    follows = kind in (0, 1, 2, 7, 10)  # the last component's link is followed
    if not (inside(root, os.path.dirname(p)) and inside(root, os.path.dirname(q))):
        return
    if follows and not inside(root, p):
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK  # a FIFO never blocks the test
    try:
        if kind == 0:
            os.makedirs(p, exist_ok=True)
        elif kind in (1, 2):
            fd = os.open(p, flags | (os.O_APPEND if kind == 1 else os.O_TRUNC))
            os.write(fd, b"x" * rng.randint(0, 3))
            os.close(fd)
        elif kind == 3:
            os.rename(p, q)
        elif kind == 4:
            if os.path.isdir(p) and not os.path.islink(p):  # inside: its parent is
                shutil.rmtree(p)
            else:
                os.unlink(p)
        elif kind == 5:
            os.link(p, q, follow_symlinks=False)
        elif kind == 6:
            os.symlink(rng.choice([str(decoys[0]), str(decoys[1]), "a", str(root)]), p)
        elif kind == 7:
            os.chmod(p, rng.choice([0o755, 0o700, 0o300, 0o200, 0o000]))
        elif kind == 8:
            os.utime(p, (1, rng.choice([1, 2])), follow_symlinks=False)
        elif kind == 9:
            os.mkfifo(p)
        elif not stat.S_ISFIFO(os.lstat(p).st_mode):
            os.truncate(p, 0)
    except OSError:
        pass


@pytest.mark.parametrize("seed", range(80))
def test_random_operations_leave_the_watch_equal_to_the_walk(tmp_path: Path, seed: int) -> None:
    """Renames across directories in both directions, hard links, symlinks out of the tree,
    chmods, FIFOs in any mix: after each batch the watch answers as the walk does."""
    rng = random.Random(seed)
    root = tmp_path / "ws"
    root.mkdir()
    decoys = (tmp_path / "slash", tmp_path / "proc")
    for decoy in decoys:
        (decoy / "sub").mkdir(parents=True)
        (decoy / "file").write_text("outside")
    watch = SUPERVISOR.Watch(str(root))
    try:
        assert watch.scan() == walk(root)
        for step in range(40):
            for _ in range(rng.randint(1, 4)):
                random_op(root, rng, decoys=decoys)
            assert (step, watch.scan()) == (step, walk(root))
    finally:
        watch.reset()
        loosen(root)


def c_calls_of_a_scan(tmp_path: Path, depth: int, files: int) -> int:
    """Calls to built-in functions made by the scan after ``files`` are created at the bottom
    of a chain of ``depth`` directories."""
    root = tmp_path / f"ws{depth}"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):  # deeper than a path can be opened by: one level at a time
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
    watch = SUPERVISOR.Watch(str(root))
    watch.scan()
    for i in range(files):
        os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    calls = [0]

    def count(frame: FrameType, event: str, arg: Any) -> None:
        calls[0] += event == "c_call"

    sys.setprofile(count)
    try:
        got = watch.scan()
    finally:
        sys.setprofile(None)
    assert (len(got[0]), got[1], watch.walks) == (files, False, 1)
    watch.reset()
    return calls[0]


def test_a_deep_dirty_path_costs_no_more_than_a_shallow_one(tmp_path: Path) -> None:
    """Looking again at a path named by an event does not grow with its depth: with the
    ancestors built per path, 4,000 files at the bottom of 2,000 directories held the
    supervisor for minutes after the call (a quadratic cost per file)."""
    shallow = c_calls_of_a_scan(tmp_path, 100, 100)
    deep = c_calls_of_a_scan(tmp_path, 200, 100)
    assert deep < shallow * 1.5, (shallow, deep)


def c_calls_of_a_drain(tmp_path: Path, links: int, writes: int) -> int:
    """Calls to built-in functions made by the drain after ``writes`` writes to each of two
    files with ``links`` hard links each."""
    root = tmp_path / f"ws{links}"
    root.mkdir()
    for name in ("x", "y"):
        (root / name).write_text("")
        for i in range(links):
            os.link(root / name, root / f"{name}{i}")
    watch = SUPERVISOR.Watch(str(root))
    assert watch.scan() == walk(root)
    with open(root / "x", "ab", buffering=0) as fx, open(root / "y", "ab", buffering=0) as fy:
        for _ in range(writes):  # in turns: the kernel merges no event
            fx.write(b"1")
            fy.write(b"1")
    calls = [0]

    def count(frame: FrameType, event: str, arg: Any) -> None:
        calls[0] += event == "c_call"

    sys.setprofile(count)
    try:
        watch.drain()
    finally:
        sys.setprofile(None)
    assert (watch.broken, watch.fd is not None) == (False, True)
    assert watch.scan() == walk(root)
    assert watch.walks == 1
    watch.reset()
    return calls[0]


def test_events_on_a_much_linked_file_cost_no_more_than_on_a_single_one(tmp_path: Path) -> None:
    """An event on a file names every one of its links, but the drain notes them once per
    scan, not once per event: two files of 2,000 links each, written in turns for a second,
    held gVisor's supervisor in one 50 ms poll for 21 s (the sandbox was lost)."""
    few = c_calls_of_a_drain(tmp_path, 20, 300)
    many = c_calls_of_a_drain(tmp_path, 200, 300)
    assert many < few * 1.5, (few, many)

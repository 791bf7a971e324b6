"""The supervisor's file operations run on a host directory (no Docker): the walk never
follows a link out, never blocks, never recurses; listings are capped; writes are atomic."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from harombe.errors import WorkspacePathError
from harombe.security.guest import FILE_PARTS, load
from harombe.security.runtime import files

#: The supervisor's file operations, run on the host as the sandbox joins them.
sf = load(FILE_PARTS)


def run(op: str, root: Path, path: str, blob: bytes = b"", **extra: Any) -> tuple[dict, bytes]:  # type: ignore[type-arg]
    msg = {"op": op, "root": str(root), "path": path, "max_bytes": 1 << 20, **extra}
    return sf.FILE_OPS[op](msg, blob)  # type: ignore[no-any-return]


def refused(op: str, root: Path, path: str, blob: bytes = b"", **extra: Any) -> sf.Refused:
    with pytest.raises(sf.Refused) as info:
        run(op, root, path, blob, **extra)
    return info.value


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "workspace"
    (work / "real").mkdir(parents=True)
    (work / "real" / "f.txt").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "v").write_text("orig")
    return work


def test_host_and_supervisor_agree_on_the_caps() -> None:
    """The host's depth and listing caps are the supervisor's."""
    assert files.MAX_PATH_DEPTH == sf.MAX_PATH_DEPTH
    assert files.MAX_LIST_ENTRIES == sf.MAX_LIST_ENTRIES


def test_loading_the_supervisor_parts_changes_nothing_on_the_host() -> None:
    """Dropping supplementary groups happens only when it runs as the supervisor."""
    before = os.getgroups()
    load(FILE_PARTS)
    assert os.getgroups() == before


def test_the_host_refuses_paths_deeper_than_the_cap() -> None:
    """128 directories pass, 129 are refused with a clear WorkspacePathError."""
    assert files.checked_relative("/".join(["d"] * files.MAX_PATH_DEPTH))
    with pytest.raises(WorkspacePathError, match="deep"):
        files.checked_relative("/".join(["d"] * (files.MAX_PATH_DEPTH + 1)))


@pytest.mark.parametrize(
    ("link", "target", "path"),
    [
        ("out", "{outside}", "out/v"),
        ("file", "{outside}/v", "file"),
        ("up", "..", "up/outside/v"),
        ("abs_dotdot", "{root}/../outside", "abs_dotdot/v"),
        ("deep_up", "real/../../outside", "deep_up/v"),
    ],
    ids=["dir-out", "file-out", "dotdot", "absolute-dotdot", "dotdot-inside-target"],
)
@pytest.mark.parametrize("op", ["read", "write", "list"])
def test_links_out_are_refused(root: Path, link: str, target: str, path: str, op: str) -> None:
    """Every way a symlink leads out is refused, and the outside file keeps its content."""
    outside = root.parent / "outside"
    os.symlink(target.format(outside=outside, root=root), root / link)
    assert refused(op, root, path, b"pwned").kind in ("WorkspacePathError", "NotADirectoryError")
    assert (outside / "v").read_text() == "orig"


def test_links_are_never_followed_even_inside(root: Path) -> None:
    """Relative, absolute and chained links that stay inside are refused, naming the link and
    its target, and a write to a link changes neither the link nor its target."""
    os.symlink("real", root / "alias")
    os.symlink(str(root / "real" / "f.txt"), root / "abs")
    os.symlink("alias", root / "chain")
    for path in ("alias/f.txt", "abs", "chain/f.txt", "chain/../real/f.txt"):
        error = refused("read", root, path)
        assert error.kind == "WorkspacePathError" and "symbolic link" in str(error), path
    assert "symbolic link" in str(refused("write", root, "abs", b"new"))
    assert (root / "real" / "f.txt").read_text() == "inside" and (root / "abs").is_symlink()
    assert run("read", root, "real/f.txt")[1] == b"inside"


def test_link_loops_and_deep_paths_end_in_a_refusal(root: Path) -> None:
    """A symlink loop and a 1000-level path are refused, never recursed into."""
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    assert "symbolic link" in str(refused("read", root, "a"))
    assert "deep" in str(refused("write", root, "/".join(["x"] * 1000), b"x"))
    assert not (root / "x").exists()


def test_a_fifo_is_refused_without_blocking(root: Path) -> None:
    """Reading or writing a FIFO with no writer returns at once with NotARegularFileError."""
    os.mkfifo(root / "p")
    outcome: list[str] = []

    def attempt() -> None:
        for op in ("read", "write"):
            outcome.append(refused(op, root, "p", b"x").kind)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert outcome == ["NotARegularFileError", "NotARegularFileError"]


def test_writes_replace_atomically_and_keep_the_mode(root: Path) -> None:
    """A write replaces the name (a hard link's other name keeps the old bytes), keeps the
    replaced file's mode, and leaves no temporary file."""
    target = root / "real" / "f.txt"
    target.chmod(0o751)
    os.link(target, root / "other")
    run("write", root, "real/f.txt", b"v2")
    assert target.read_bytes() == b"v2" and (root / "other").read_bytes() == b"inside"
    assert target.stat().st_mode & 0o777 == 0o751
    assert sorted(os.listdir(root / "real")) == ["f.txt"]
    run("write", root, "new/dir/g.txt", b"g")
    assert (root / "new" / "dir" / "g.txt").read_bytes() == b"g"


def test_listing_is_capped_sorted_and_reports_links(root: Path) -> None:
    """The first max_entries names by name, the total, and symlinks with their targets."""
    for i in range(30):
        (root / "real" / f"n{i:02d}").touch()
    os.symlink("/etc", root / "real" / "a_link")
    reply, _ = run("list", root, "real", max_entries=5)
    assert [e["name"] for e in reply["entries"]] == ["a_link", "f.txt", "n00", "n01", "n02"]
    assert reply["entries"][0] == {"name": "a_link", "type": "symlink", "size": 4, "target": "/etc"}
    assert reply["total"] == 32 and reply["truncated"] is True


def test_a_listing_of_long_odd_names_stays_under_its_byte_budget(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names that escape to six bytes per character stop the listing at its byte budget."""
    monkeypatch.setattr(sf, "MAX_LIST_REPLY_BYTES", 50_000)
    for i in range(40):
        (root / "real" / (f"{i:02d}" + "\x01" * 200)).touch()
    reply, _ = run("list", root, "real")
    assert 0 < len(reply["entries"]) < 40 and reply["truncated"] is True


def test_a_file_over_the_read_cap_is_refused_with_how_to(root: Path) -> None:
    """A file over max_bytes is refused before it is read, saying how to read it."""
    (root / "big").write_bytes(b"x" * 101)
    error = refused("read", root, "big", max_bytes=100)
    assert error.kind == "FileTooLargeError" and "head -c" in str(error)


@pytest.mark.parametrize(
    "msg",
    [
        {"op": "read"},
        {"op": "read", "root": "/nonexistent", "path": "f", "max_bytes": 1},
        {"op": "write", "root": "/", "path": 5},
        {"op": "list", "root": "/", "path": ".", "max_entries": []},
        {"op": "read", "root": "/", "path": "a\x00b", "max_bytes": 1},
    ],
    ids=["no-fields", "no-root", "path-not-text", "bad-cap", "nul"],
)
def test_any_failure_becomes_a_refusal(msg: dict[str, Any]) -> None:
    """Nothing a request holds raises anything but Refused (an error reply)."""
    with pytest.raises(sf.Refused):
        sf.FILE_OPS[msg["op"]](msg, b"")

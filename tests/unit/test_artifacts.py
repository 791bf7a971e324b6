"""What a call leaves behind, without Docker: the host's checks of a ``done`` reply's changed
files and images, the supervisor's workspace walk and image split (run on the host as the
sandbox joins them), and the Python worker's image collection."""

from __future__ import annotations

import base64
import os
import socket
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from harombe.security.guest import SUPERVISOR_PARTS, load
from harombe.security.guest.wire import MAX_ARTIFACT_BYTES
from harombe.security.runtime.artifacts import (
    MAX_CHANGED_FILES,
    MAX_IMAGE_PIXELS,
    binary_content,
    changed_files,
    left_behind,
    mime_type,
    oversized,
    split_images,
)


def png_header(width: int, height: int) -> bytes:
    """The signature and IHDR chunk of a PNG of ``width`` x ``height`` (no pixel data)."""
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + len(ihdr).to_bytes(4, "big") + b"IHDR" + ihdr + b"crc!"


PNG = png_header(2, 3) + b"body"
SUPERVISOR = load(
    ("wire.py", "supervisor_io.py", "supervisor_procs.py", "supervisor_paths.py",
     "supervisor_files.py", "supervisor_artifacts.py", "supervisor_workers.py"),
    "harombe_supervisor_artifacts",
)  # fmt: skip
WORKER = load(("wire.py", "pyworker_artifacts.py"), "harombe_worker_artifacts")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("plot.png", "image/png"),
        ("data/table.csv", "text/csv"),
        ("notes.txt", "text/plain"),
        ("main.py", "text/x-python"),
        ("archive.tar.gz", "application/x-tar"),
        ("no_extension", "application/octet-stream"),
        ("weird.zzz-unknown", "application/octet-stream"),
    ],
    ids=["png", "csv", "txt", "py", "tar.gz", "none", "unknown"],
)
def test_media_types_come_from_the_name(path: str, expected: str) -> None:
    """The media type is the built-in table's answer for the name, else octet-stream."""
    assert mime_type(path) == expected


def test_changed_files_become_result_items() -> None:
    """Each [path, size, change] becomes a result item with its media type."""
    files, cut = changed_files(
        {"changed_files": [["a.png", 3, "created"], ["b/c.txt", 0, "modified"]],
         "changed_files_truncated": True}
    )  # fmt: skip
    assert files == [
        {"path": "a.png", "size_bytes": 3, "mime_type": "image/png", "change": "created"},
        {"path": "b/c.txt", "size_bytes": 0, "mime_type": "text/plain", "change": "modified"},
    ]
    assert cut is True
    assert changed_files({}) == ([], False)


@pytest.mark.parametrize(
    "listed",
    [
        "a.txt",
        [["a.txt", 1]],
        [["a.txt", -1, "created"]],
        [["a.txt", True, "created"]],
        [["a.txt", 1, "deleted"]],
        [[1, 1, "created"]],
        [["a", 1, "created"]] * (MAX_CHANGED_FILES + 1),
    ],
    ids=["not-a-list", "short", "negative", "bool-size", "unknown-change", "int-path", "too-many"],
)
def test_a_malformed_changed_file_list_breaks_the_protocol(listed: Any) -> None:
    """The list comes from inside the sandbox: anything out of shape is a protocol error."""
    with pytest.raises(ValueError, match="changed"):
        changed_files({"changed_files": listed})


def test_images_follow_the_output_in_the_blob() -> None:
    """Images are cut from the blob after the output, base64-encoded; a non-PNG is dropped
    with a warning."""
    blob = b"outerr" + PNG + b"GIF89a" + PNG
    reply = {"artifacts": [["matplotlib figure 1", len(PNG)], ["forged", 6], ["final expression",
             len(PNG)]]}  # fmt: skip
    images, warnings = split_images(reply, blob, 6)
    assert [(i["source"], base64.b64decode(i["data"])) for i in images] == [
        ("matplotlib figure 1", PNG),
        ("final expression", PNG),
    ]
    assert {(i["kind"], i["mime_type"]) for i in images} == {("image", "image/png")}
    assert warnings == ["an image from 'forged' was dropped: it is not a PNG"]


@pytest.mark.parametrize(
    ("listed", "blob"),
    [
        ([["a", len(PNG)]], b"out" + PNG + b"x"),
        ([["a", len(PNG) + 1]], b"out" + PNG),
        ([["a", 0]], b"out"),
        ([["a", MAX_ARTIFACT_BYTES + 1]], b"out"),
        ([["a"]], b"out"),
        ("a", b"out"),
    ],
    ids=["bytes-left-over", "short-blob", "empty-image", "over-cap", "no-size", "not-a-list"],
)
def test_images_that_do_not_fit_the_blob_break_the_protocol(listed: Any, blob: bytes) -> None:
    """Sizes must be positive, within the cap, and fill the blob after the output exactly."""
    with pytest.raises(ValueError, match="artifact"):
        split_images({"artifacts": listed}, blob, 3)


def test_a_reply_without_artifacts_keeps_its_whole_blob() -> None:
    """A reply that lists no images (an older supervisor, the fake guest) is all output."""
    blob, fields, warnings = left_behind({"stdout_len": 1}, b"oe", 1)
    assert (blob, warnings) == (b"oe", [])
    assert fields == {"changed_files": [], "changed_files_truncated": False, "artifacts": []}
    kept, fields, _ = left_behind({"stderr_len": 1, "artifacts": [["a", len(PNG)]]},
                                  b"oe" + PNG, 1)  # fmt: skip
    assert kept == b"oe" and len(fields["artifacts"]) == 1


def test_a_binary_read_is_base64_with_size_and_media_type() -> None:
    """Every byte survives base64; the media type comes from the name."""
    data = bytes(range(256))
    fields = binary_content("d/x.bin", data)
    assert base64.b64decode(fields["content"]) == data
    assert (fields["encoding"], fields["size_bytes"], fields["mime_type"]) == (
        "base64", 256, "application/octet-stream")  # fmt: skip


def test_the_host_and_the_supervisor_agree_on_the_caps() -> None:
    assert SUPERVISOR.MAX_CHANGED_FILES == MAX_CHANGED_FILES


def make_tree(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "d" / "e" / "b.bin").write_bytes(b"bb")
    (root / ".harombe" / "output").mkdir(parents=True)
    (root / ".harombe" / "output" / "call-1.stdout").write_text("x")
    (root / "d" / ".harombe").mkdir()
    (root / "d" / ".harombe" / "kept").write_text("k")
    (root / "up").symlink_to(root.parent)
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))


def test_the_walk_lists_regular_files_and_follows_no_link(tmp_path: Path) -> None:
    """Regular files only, by path; symlinks, FIFOs and sockets are not followed or opened,
    and only the top-level .harombe is skipped."""
    make_tree(tmp_path)
    files, cut = SUPERVISOR.scan_workspace(str(tmp_path))
    assert sorted(files) == ["a.txt", "d/.harombe/kept", "d/e/b.bin"]
    assert cut is False
    assert files["d/e/b.bin"][1] == 2


def test_the_walk_stops_at_its_cap(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i}").write_text("")
    files, cut = SUPERVISOR.scan_workspace(str(tmp_path), cap=10)
    assert (len(files), cut) == (10, True)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (({}, False), {"a": (1, 1, 1)}, [["a", 1, "created"]]),
        (({"a": (1, 1, 1)}, False), {"a": (1, 1, 1)}, []),
        (({"a": (1, 1, 1)}, False), {"a": (2, 1, 1)}, [["a", 1, "modified"]]),
        (({"a": (1, 1, 1)}, False), {"a": (1, 2, 1)}, [["a", 2, "modified"]]),
        (({"a": (1, 1, 1)}, False), {"a": (1, 1, 9)}, [["a", 1, "modified"]]),
        (({}, True), {"old": (5, 1, 1), "new": (100, 1, 2)}, [["new", 1, "modified"]]),
    ],
    ids=["created", "same", "mtime", "size", "inode-replaced", "cut-walk-uses-mtime"],
)
def test_changes_are_found_by_mtime_size_and_inode(
    before: Any, after: dict[str, Any], expected: list[Any]
) -> None:
    """A file is changed when (mtime, size, inode) differs; after a cut walk, a file not seen
    before counts only if touched during the call."""
    assert SUPERVISOR.changed_files(before, after, 100) == expected


def test_an_undecodable_name_is_shown_escaped() -> None:
    name = b"bad\xff.txt".decode("utf-8", "surrogateescape")
    assert SUPERVISOR.printable_path(name) == "bad\\xff.txt"


def test_the_supervisors_own_writes_drop_the_kept_walk() -> None:
    """After a write or untar the next call walks again: the files are not the call's."""
    SUPERVISOR.LAST_SCAN[0] = ({}, False)
    op = SUPERVISOR.forgetting(lambda msg, blob: ({}, b""))
    op({}, b"")
    assert SUPERVISOR.LAST_SCAN[0] is None
    assert SUPERVISOR.FILE_OPS["write"].__name__ == "changing"


def test_the_supervisor_splits_a_workers_images_from_its_stdout() -> None:
    stdout, images, notes = SUPERVISOR.take_images(
        {"artifacts": [["matplotlib figure 1", 3]], "artifact_notes": ["n"]}, b"out" + b"png"
    )
    assert (stdout, images, notes) == (b"out", [("matplotlib figure 1", b"png")], ["n"])
    assert SUPERVISOR.take_images({}, b"out") == (b"out", [], [])


@pytest.mark.parametrize(
    "reply",
    [
        {"artifacts": [["a", 10]]},
        {"artifacts": [["a", 0]]},
        {"artifacts": [["a" * 65, 1]]},
        {"artifacts": [["a", 1, 2]]},
        {"artifacts": {}},
        {"artifact_notes": ["x" * 301]},
        {"artifact_notes": ["n"] * 9},
    ],
    ids=["larger-than-blob", "empty", "long-source", "extra-field", "not-a-list",
         "long-note", "many-notes"],
)  # fmt: skip
def test_a_worker_that_lies_about_its_images_is_a_violation(reply: dict[str, Any]) -> None:
    """The worker runs user code: images that do not fit what it sent kill it."""
    with pytest.raises(SUPERVISOR.Violation):
        SUPERVISOR.take_images(reply, b"out")


def test_the_worker_accepts_its_image_fields() -> None:
    """The reply check lets the image fields through."""
    SUPERVISOR.check_reply({"cell": 1, "exit_code": 0, "artifacts": [], "artifact_notes": []}, 1)


class FakeImage:
    """Stands in for PIL.Image.Image: saves as PNG unless its mode cannot be."""

    def __init__(self, mode: str = "RGB") -> None:
        self.mode = mode

    def save(self, buffer: Any, format: str) -> None:
        if self.mode == "CMYK":
            raise OSError("cannot write mode CMYK as PNG")
        buffer.write(PNG + self.mode.encode())

    def convert(self, mode: str) -> FakeImage:
        return FakeImage(mode)


@pytest.fixture
def fake_pil(monkeypatch: pytest.MonkeyPatch) -> None:
    module = ModuleType("PIL.Image")
    module.Image = FakeImage  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "PIL.Image", module)


def test_a_pil_image_final_expression_is_sent(fake_pil: None) -> None:
    """An image is rendered as PNG; one PNG cannot hold is converted; other values are not."""
    WORKER.image_of_value(FakeImage())
    WORKER.image_of_value(FakeImage("CMYK"))
    WORKER.image_of_value("not an image")
    reply: dict[str, Any] = {}
    blob = WORKER.IMAGES.reply_fields(reply)
    assert reply == {"artifacts": [["final expression", len(PNG) + 3],
                                   ["final expression", len(PNG) + 4]]}  # fmt: skip
    assert blob == PNG + b"RGB" + PNG + b"RGBA"
    assert WORKER.IMAGES.reply_fields({}) == b""  # sent once


def test_images_past_the_cap_are_noted_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the per-call cap an image is dropped and a note says so; a render that fails
    (even interrupted) is noted, never raised."""
    monkeypatch.setattr(WORKER, "MAX_ARTIFACT_BYTES", 10)
    WORKER.IMAGES.add("first", lambda: b"x" * 8)
    WORKER.IMAGES.add("second", lambda: b"y" * 8)

    def interrupted() -> bytes:
        raise KeyboardInterrupt

    WORKER.IMAGES.add("third", interrupted)
    reply: dict[str, Any] = {}
    assert WORKER.IMAGES.reply_fields(reply) == b"x" * 8
    assert reply["artifacts"] == [["first", 8]]
    assert reply["artifact_notes"] == [
        "second was not sent: the call's images would exceed 10 bytes",
        "third was not sent: rendering it as PNG failed (KeyboardInterrupt: )",
    ]


def test_pyplot_gets_the_workers_show_when_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finder hooks matplotlib.pyplot's loader, and no other module's."""
    package = tmp_path / "matplotlib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pyplot.py").write_text("def show():\n    return 'original'\n")
    (package / "other.py").write_text("def show():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [WORKER._PyplotFinder(), *sys.meta_path])
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import matplotlib.other  # type: ignore[import-not-found]
    import matplotlib.pyplot  # type: ignore[import-not-found]

    assert matplotlib.pyplot.show is WORKER.show
    assert matplotlib.other.show() == "original"
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.other"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("png", "refused"),
    [
        (png_header(640, 480), None),
        (png_header(1, MAX_IMAGE_PIXELS), None),
        (png_header(100_000, 100_000), "more than"),
        (png_header(2**32 - 1, 2**32 - 1), "more than"),
        (png_header(0, 10), "more than"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIDAT" + bytes(8), "not a PNG image header"),
        (b"\x89PNG\r\n\x1a\n", "not a PNG image header"),
    ],
    ids=["vga", "at-the-cap", "10-gigapixels", "max-u32", "zero-width", "no-ihdr", "truncated"],
)
def test_an_image_that_would_decode_to_gigabytes_is_refused(
    png: bytes, refused: str | None
) -> None:
    """A small PNG claiming huge dimensions (a decompression bomb for the client) is refused."""
    reason = oversized(png)
    assert (reason is None) if refused is None else (refused in str(reason))


def test_a_bomb_is_dropped_with_a_warning_not_sent() -> None:
    """split_images drops an image over the pixel cap and says why."""
    bomb = png_header(100_000, 100_000)
    images, warnings = split_images({"artifacts": [["final expression", len(bomb)]]}, bomb, 0)
    assert images == [] and "pixels is more than" in warnings[0]


JOINED = load(SUPERVISOR_PARTS, "harombe_supervisor_joined")


@pytest.mark.parametrize(
    ("language", "reply", "allowed"),
    [
        ("python", {"artifacts": [["matplotlib figure 1", 3]]}, True),
        ("javascript", {"artifacts": [["matplotlib figure 1", 3]]}, False),
        ("javascript", {"artifact_notes": ["forged note"]}, False),
        ("javascript", {}, True),
    ],
    ids=["python-images", "js-images", "js-notes", "js-none"],
)
def test_only_the_python_worker_may_send_images(
    language: str, reply: dict[str, Any], allowed: bool
) -> None:
    """A JavaScript worker's reply that claims images is a protocol violation."""
    run = SimpleNamespace(worker=SimpleNamespace(language=language), peak_rss=0)
    full = {"exit_code": 0, **reply}
    if allowed:
        JOINED.SessionRun.replied(run, full, b"outpng")
        assert run.exit_code == 0
    else:
        with pytest.raises(JOINED.Violation):
            JOINED.SessionRun.replied(run, full, b"outpng")

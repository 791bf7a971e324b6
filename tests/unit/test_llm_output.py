"""Output mode ``llm``: the head/tail/marker logic on the host (pure), the supervisor's
capture of a stream (its guest code run on the host) and the checks of its reply."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from harombe.config import Limits, parse_config
from harombe.errors import ConfigError, HarombeError, UsageError
from harombe.security.guest import load
from harombe.security.runtime.llm_output import (
    Saved,
    cut_head,
    cut_tail,
    fit_sizes,
    llm_request,
    shape,
)
from harombe.security.runtime.results import result_from_reply
from harombe.security.runtime.runs import check_output_mode
from harombe.tools.params import CodeExecuteArgs, parse_args

PATH = ".harombe/output/call-3.stdout"
NUMBERED = b"".join(b"line %d\n" % i for i in range(1, 100_001))


def parts(text: str) -> tuple[str, str, str]:
    """Head, marker line and tail of a shaped stream."""
    start = text.index("[harombe: ")
    end = text.index("\n", start)
    return text[:start], text[start:end], text[end + 1 :]


def saved(**fields: Any) -> Saved:
    base = {"head_bytes": 0, "lines": 0, "path": PATH, "saved_bytes": 0, "error": None}
    return Saved(**{**base, **fields})


# --- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "tail", "cap", "expected"),
    [
        (4096, 4096, 1_048_576, (4096, 4096)),
        (4096, 4096, 8192, (4096, 4096)),
        (4096, 4096, 1000, (500, 500)),
        (3000, 1000, 400, (300, 100)),
        (0, 4096, 100, (0, 100)),
    ],
    ids=["fits", "exactly-the-cap", "halved", "proportional", "tail-only"],
)
def test_head_and_tail_fit_within_the_byte_cap(
    head: int, tail: int, cap: int, expected: tuple[int, int]
) -> None:
    """Head and tail together never exceed max_output_bytes; their proportion is kept."""
    assert fit_sizes(head, tail, cap) == expected
    assert sum(fit_sizes(head, tail, cap)) <= cap


def test_the_request_carries_the_configured_sizes() -> None:
    """The run request's output field: mode llm and the sizes, capped by max_output_bytes."""
    limits = Limits(max_output_bytes=6000, llm_output_head_bytes=4000, llm_output_tail_bytes=8000)
    assert llm_request(limits) == {"mode": "llm", "head_bytes": 2000, "tail_bytes": 4000}


# --- cutting the ends ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "kept"),
    [
        (b"one\ntwo\nthr", b"one\ntwo\n"),
        (b"a\n" + b"x" * 20, b"a\n" + b"x" * 20),
        (b"abc\xc3", b"abc"),
        (b"abc\xc3\xa9", b"abc\xc3\xa9"),
        (b"ab\xe2\x82", b"ab"),
        (b"ab\xe2\x82\xac", b"ab\xe2\x82\xac"),
        (b"a\xf0\x9f\x98", b"a"),
        (b"a\xf0\x9f\x98\x80", b"a\xf0\x9f\x98\x80"),
        (b"", b""),
        (b"\xff\xfe", b"\xff\xfe"),
    ],
    ids=["at-last-newline", "newline-too-early", "half-2-byte", "whole-2-byte", "half-euro",
         "whole-euro", "3-of-4-byte", "whole-emoji", "empty", "not-utf8"],
)  # fmt: skip
def test_the_head_ends_on_a_line_or_a_whole_character(head: bytes, kept: bytes) -> None:
    """The head ends after its last newline when that is in its second half, else after its
    last whole UTF-8 character: a multi-byte character is never split."""
    assert cut_head(head) == kept


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        (b"ne 7\nline 8\nline 9\n", b"line 8\nline 9\n"),
        (b"x" * 20 + b"\nend", b"x" * 20 + b"\nend"),
        (b"\xa9abc", b"abc"),
        (b"\x82\xacab", b"ab"),
        (b"\x9f\x98\x80z", b"z"),
        (b"\xc3\xa9z", b"\xc3\xa9z"),
        (b"", b""),
    ],
    ids=["after-first-newline", "newline-too-late", "cut-2-byte", "cut-euro", "cut-emoji",
         "whole-first-char", "empty"],
)  # fmt: skip
def test_the_tail_starts_on_a_line_or_a_whole_character(tail: bytes, kept: bytes) -> None:
    """The tail starts after its first newline when that is in its first half, else at its
    first whole UTF-8 character."""
    assert cut_tail(tail) == kept


def test_shape_keeps_first_and_last_lines_and_counts_what_it_cut() -> None:
    """100,000 numbered lines: head from line 1, tail to the last line, and the marker's
    bytes and lines are exactly what is missing between them."""
    data = NUMBERED[:4096] + NUMBERED[-4096:]
    info = saved(head_bytes=4096, lines=100_000, saved_bytes=len(NUMBERED))
    text = shape("stdout", data, total_bytes=len(NUMBERED), saved=info)
    head, marker, tail = parts(text)
    assert head.startswith("line 1\nline 2\n") and head.endswith("\n")
    assert tail.endswith("line 100000\n")
    kept_lines = head.count("\n") + tail.count("\n")
    cut_bytes = len(NUMBERED) - len(head) - len(tail)
    assert f"{cut_bytes:,} bytes ({100_000 - kept_lines:,} lines) of stdout cut here" in marker
    assert f"/workspace/{PATH}" in marker and f"code_read_file(file_path='{PATH}')" in marker
    assert f"sed -n '1,200p' {PATH}" in marker
    # No line is broken: what is kept is whole lines of the original, in order.
    assert NUMBERED.decode().startswith(head) and NUMBERED.decode().endswith(tail)


def test_shape_never_splits_a_multibyte_character() -> None:
    """A stream of 2-, 3- and 4-byte characters and no newline, cut at arbitrary byte
    offsets, decodes without a replacement character on either side."""
    text = "é€😀" * 3000
    data = text.encode()
    for head_bytes, tail_bytes in ((4096, 4096), (4097, 4095), (4099, 4093), (1, 2)):
        blob = data[:head_bytes] + data[-tail_bytes:]
        info = saved(head_bytes=head_bytes, saved_bytes=len(data))
        shaped = shape("stdout", blob, total_bytes=len(data), saved=info)
        head, _, tail = parts(shaped)
        assert "\ufffd" not in shaped
        assert text.startswith(head.rstrip("\n")) and text.endswith(tail)


@pytest.mark.parametrize(
    ("info", "says"),
    [
        (saved(saved_bytes=10), "is saved in /workspace/.harombe/output/call-3.stdout"),
        (saved(saved_bytes=5, error="OSError: No space left on device"),
         "only the first 5 bytes of the full stdout (20 bytes, 0 lines) were saved, in "
         "/workspace/.harombe/output/call-3.stdout (OSError: No space left on device); the "
         "saved file is incomplete"),
        (saved(path=None, error="OSError: No space left on device"),
         "the full stdout (20 bytes, 0 lines) could not be saved: OSError: No space left"),
    ],
    ids=["saved", "incomplete", "not-saved"],
)  # fmt: skip
def test_the_marker_says_whether_the_full_text_was_saved(info: Saved, says: str) -> None:
    """A full disk is said in the marker: the saved copy is incomplete, or missing."""
    assert says in shape("stdout", b"0123456789", total_bytes=20, saved=info)


# --- the reply, checked ----------------------------------------------------------------------

BOX = SimpleNamespace(sandbox_id="sandbox-0123456789ab", runtime="runsc")


def llm_done(**llm: Any) -> tuple[dict[str, Any], bytes]:
    blob = NUMBERED[:4096] + NUMBERED[-4096:]
    field = {"head_bytes": 4096, "lines": 100_000, "path": PATH,
             "saved_bytes": len(NUMBERED), "error": None, **llm}  # fmt: skip
    reply = {
        "op": "done", "id": 1, "status": "ok", "exit_code": 0, "signal": None,
        "stdout_len": len(blob), "stderr_len": 0, "stdout_total": len(NUMBERED),
        "stderr_total": 0, "stdout_llm": field,
    }  # fmt: skip
    return reply, blob


def mapped(reply: dict[str, Any], blob: bytes) -> Any:
    return result_from_reply(
        BOX, reply, blob, language="python", timeout_s=5.0, elapsed_s=0.5,  # type: ignore[arg-type]
        limits=Limits(),
    )  # fmt: skip


def test_a_cut_stream_reports_its_saved_file() -> None:
    """A cut stdout is shaped, marked as cut, and its saved copy is in output_files."""
    result = mapped(*llm_done())
    assert result.output_files == {"stdout": PATH}
    assert result.stdout_truncated and result.stdout_bytes == len(NUMBERED)
    assert result.stdout.startswith("line 1\n") and result.stdout.endswith("line 100000\n")
    assert result.to_dict()["output_files"] == {"stdout": PATH}


def test_an_uncut_stream_has_no_output_files() -> None:
    """Without an llm field the stream is as sent and output_files is empty."""
    reply, blob = llm_done()
    del reply["stdout_llm"]
    reply["stdout_total"] = len(blob)
    result = mapped(reply, blob)
    assert result.output_files == {} and not result.stdout_truncated
    assert result.stdout == blob.decode()


@pytest.mark.parametrize(
    "llm",
    [
        {"path": "../../etc/passwd"},
        {"path": "/etc/passwd"},
        {"path": ".harombe/output/call-1.stdout\n"},
        {"head_bytes": 10**9},
        {"lines": -1},
        {"saved_bytes": True},
        {"error": 42},
    ],
    ids=["dotdot-path", "absolute-path", "path-newline", "head-beyond-blob", "negative-lines",
         "bool-count", "error-not-text"],
)  # fmt: skip
def test_a_malformed_llm_field_breaks_the_protocol(llm: dict[str, Any]) -> None:
    """The llm field comes from inside the sandbox: anything out of range is refused."""
    with pytest.raises(ValueError, match="llm output"):
        mapped(*llm_done(**llm))


def test_an_llm_field_that_is_not_an_object_is_refused() -> None:
    """A list instead of the object is refused too."""
    reply, blob = llm_done()
    reply["stdout_llm"] = [1]
    with pytest.raises(ValueError, match="not an object"):
        mapped(reply, blob)


# --- the parameter and the config ------------------------------------------------------------

EXEC = {"language": "python", "code": "print(1)"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("full", "full"), ("llm", "llm")],
    ids=["default", "full", "llm"],
)
def test_output_mode_accepts_full_llm_or_none(value: object, expected: object) -> None:
    """None (the config's default), "full" and "llm" are the accepted values."""
    args = parse_args(CodeExecuteArgs, {**EXEC, "output_mode": value})
    assert args.output_mode == expected


@pytest.mark.parametrize(
    "value", ["LLM", "Full", " llm", "", 1, True, ["llm"]],
    ids=["upper", "capitalised", "space", "empty", "int", "bool", "list"],
)  # fmt: skip
def test_output_mode_refuses_anything_else(value: object) -> None:
    """Other values are refused with the accepted ones in the message."""
    with pytest.raises(HarombeError, match="output_mode must be 'full'"):
        parse_args(CodeExecuteArgs, {**EXEC, "output_mode": value})


def test_the_manager_api_checks_the_mode_too() -> None:
    """Runs refuses a bad mode given straight to the manager."""
    assert check_output_mode("llm") == "llm"
    with pytest.raises(UsageError, match="output_mode must be 'full' or 'llm'"):
        check_output_mode("LLM")


@pytest.mark.parametrize(
    "data",
    [
        {"security": {"sandbox": {"output_mode": "LLM"}}},
        {"security": {"sandbox": {"limits": {"llm_output_head_bytes": -1}}}},
        {"security": {"sandbox": {"limits": {"llm_output_tail_bytes": "4k"}}}},
    ],
    ids=["mode-upper", "negative-head", "tail-not-a-number"],
)
def test_bad_config_values_are_refused(data: dict[str, Any]) -> None:
    """The config's default mode and sizes are validated like the other limits."""
    with pytest.raises(ConfigError):
        parse_config(data)


def test_the_config_defaults() -> None:
    """Defaults: full output; 4 KiB head and 4 KiB tail in llm mode."""
    sandbox = parse_config({}).security.sandbox
    assert sandbox.output_mode == "full"
    assert (sandbox.limits.llm_output_head_bytes, sandbox.limits.llm_output_tail_bytes) == (
        4096,
        4096,
    )


# --- the supervisor's side, run on the host ---------------------------------------------------


@pytest.fixture
def guest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.delenv("HAROMBE_RUN_AS", raising=False)  # AsUser does nothing off the sandbox
    module = load(
        ("supervisor_procs.py", "supervisor_paths.py", "supervisor_files.py",
         "supervisor_output.py"),
        "harombe_guest_output",
    )  # fmt: skip
    module.OUTPUT_ROOT = str(tmp_path)
    return module


def feed_all(stream: Any, data: bytes, chunk: int = 65536) -> None:
    for i in range(0, len(data), chunk):
        stream.feed(data[i : i + chunk])


def test_a_short_stream_comes_back_whole_and_saves_nothing(guest: ModuleType) -> None:
    """At most head + tail bytes: all of it in the reply, no llm field, no file."""
    stream = guest.LlmStream("stdout", 1, 4096, 4096)
    feed_all(stream, NUMBERED[:8192], chunk=1000)
    assert stream.finish() == (NUMBERED[:8192], None)
    assert not (Path(guest.OUTPUT_ROOT) / ".harombe").exists()


def test_a_long_stream_is_saved_whole_and_memory_stays_bounded(guest: ModuleType) -> None:
    """The file holds every byte; the head and tail are what the reply carries; the tail
    window never grows past about twice its size plus a chunk."""
    stream = guest.LlmStream("stdout", 7, 4096, 4096)
    biggest = 0
    for i in range(0, len(NUMBERED), 4000):
        stream.feed(NUMBERED[i : i + 4000])
        biggest = max(biggest, len(stream.tail))
    blob, info = stream.finish()
    assert blob == NUMBERED[:4096] + NUMBERED[-4096:]
    assert info == {"head_bytes": 4096, "lines": 100_000, "path": ".harombe/output/call-7.stdout",
                    "saved_bytes": len(NUMBERED), "error": None}  # fmt: skip
    saved_file = Path(guest.OUTPUT_ROOT) / info["path"]
    assert saved_file.read_bytes() == NUMBERED
    assert oct(saved_file.stat().st_mode & 0o777) == "0o644"
    assert biggest <= 2 * 4096 + 65536 + 4000


def test_a_full_disk_leaves_the_copy_incomplete_not_the_run(
    guest: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (ENOSPC, as /dev/full gives) stops the copy and says why."""
    full = os.open("/dev/full", os.O_WRONLY)
    monkeypatch.setattr(guest, "open_output_file", lambda name, n: (full, PATH))
    stream = guest.LlmStream("stdout", 3, 100, 100)
    feed_all(stream, NUMBERED[:50_000], chunk=1000)
    blob, info = stream.finish()
    assert blob == NUMBERED[:100] + NUMBERED[49_900:50_000]
    assert info["path"] == PATH and info["saved_bytes"] == 0
    assert "No space left on device" in info["error"]


def test_only_the_last_calls_output_files_are_kept(guest: ModuleType) -> None:
    """Making call 9's file keeps the files of the newest KEEP_CALLS calls, and other names."""
    folder = Path(guest.OUTPUT_ROOT) / ".harombe" / "output"
    folder.mkdir(parents=True)
    for n in range(1, 9):
        (folder / f"call-{n}.stdout").write_text("x")
        (folder / f"call-{n}.stderr").write_text("x")
    (folder / "notes.txt").write_text("mine")
    (folder / "call-x.stdout").write_text("mine")
    fd, path = guest.open_output_file("stdout", 9)
    os.close(fd)
    kept = sorted(p.name for p in folder.iterdir())
    newest = [f"call-{n}.{s}" for n in range(5, 9) for s in ("stderr", "stdout")]
    assert guest.KEEP_CALLS == 5
    assert kept == sorted([*newest, "call-9.stdout", "notes.txt", "call-x.stdout"])
    assert path == ".harombe/output/call-9.stdout"


def test_a_symlinked_output_folder_is_not_followed(guest: ModuleType, tmp_path: Path) -> None:
    """User code cannot redirect the saved copy: a symlink on the way is refused, and the
    stream is still returned (the marker says it could not be saved)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = Path(guest.OUTPUT_ROOT) / "root"
    root.mkdir()
    (root / ".harombe").symlink_to(elsewhere)
    guest.OUTPUT_ROOT = str(root)
    stream = guest.LlmStream("stderr", 2, 10, 10)
    feed_all(stream, b"e" * 1000, chunk=7)
    blob, info = stream.finish()
    assert blob == b"e" * 20 and info["path"] is None
    assert "symbolic link" in info["error"] and list(elsewhere.iterdir()) == []

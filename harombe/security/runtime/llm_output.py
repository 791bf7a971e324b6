"""Output mode ``llm``: a long stream comes back as its head, a marker line and its tail. Pure.

The supervisor keeps a stream's first ``head_bytes`` and last ``tail_bytes`` bytes and, once the
stream is longer than both together, saves its full text in the sandbox (see
``guest/supervisor_output.py``). Here the two ends are cut on character boundaries (a
multi-byte UTF-8 character is never split) and, where a line boundary lies in the outer half of
each end, on line boundaries, and the marker between them says how many bytes and lines were
left out and where the full text is, so an agent can page through it with ``code_read_file``
or ``sed -n``. A stream that fits comes back whole and unmarked.

Sizes: the head and tail share ``max_output_bytes`` (the byte cap of the ``full`` mode), so an
``llm`` result never carries more of a stream than the cap, plus the one marker line.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any

from harombe.config import Limits
from harombe.security.runtime.artifacts import utf8_text

#: The only paths a supervisor may report for a saved stream (relative to /workspace).
SAVED_PATH = re.compile(r"\.harombe/output/call-[0-9]{1,12}\.(stdout|stderr)")
WORKSPACE = "/workspace"
MAX_ERROR_CHARS = 200


def fit_sizes(head_bytes: int, tail_bytes: int, cap_bytes: int) -> tuple[int, int]:
    """Head and tail sizes within ``cap_bytes`` together, in the configured proportion."""
    whole = head_bytes + tail_bytes
    if whole <= cap_bytes:
        return head_bytes, tail_bytes
    head = cap_bytes * head_bytes // whole
    return head, cap_bytes - head


def llm_request(limits: Limits) -> dict[str, Any]:
    """The ``output`` field of a run request in ``llm`` mode, under ``limits``."""
    head, tail = fit_sizes(
        limits.llm_output_head_bytes, limits.llm_output_tail_bytes, limits.max_output_bytes
    )
    return {"mode": "llm", "head_bytes": head, "tail_bytes": tail}


def _char_end(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # ASCII or a lead byte: the last character starts here
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            complete = byte < 0x80 or byte >> 3 > 0b11110 or back >= need
            return len(data) if complete else len(data) - back
    return len(data)  # no lead byte in reach: not UTF-8 there, nothing to protect


def _char_start(data: bytes) -> int:
    """Offset of the first byte of ``data`` that does not continue a cut UTF-8 character."""
    for i in range(min(3, len(data))):
        if data[i] & 0xC0 != 0x80:
            return i
    return min(3, len(data))


def cut_head(head: bytes) -> bytes:
    """``head`` ending after its last newline if that lies in its second half, else after
    its last whole character."""
    newline = head.rfind(b"\n")
    if newline >= 0 and newline + 1 >= len(head) // 2:
        return head[: newline + 1]
    return head[: _char_end(head)]


def cut_tail(tail: bytes) -> bytes:
    """``tail`` starting after its first newline if that lies in its first half, else at its
    first whole character."""
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) // 2:
        return tail[newline + 1 :]
    return tail[_char_start(tail) :]


@dataclass(frozen=True)
class Saved:
    """What the supervisor reports about a cut stream (the ``<stream>_llm`` reply field)."""

    head_bytes: int
    lines: int
    path: str | None
    saved_bytes: int
    error: str | None

    @classmethod
    def from_reply(cls, value: object, *, kept_bytes: int, total_bytes: int) -> Saved:
        """Checked field by field (it comes from inside the sandbox): ``ValueError`` when out
        of the protocol."""
        if not isinstance(value, dict):
            raise ValueError("a done reply whose llm output field is not an object")
        counts = {}
        for key, high in (("head_bytes", kept_bytes), ("lines", total_bytes),
                          ("saved_bytes", total_bytes)):  # fmt: skip
            count = value.get(key)
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= high:
                raise ValueError(f"a done reply whose llm output {key} is {str(count)[:40]!r}")
            counts[key] = count
        path, error = value.get("path"), value.get("error")
        if path is not None and not (isinstance(path, str) and SAVED_PATH.fullmatch(path)):
            raise ValueError(f"a done reply whose llm output path is {str(path)[:80]!r}")
        if error is not None and not isinstance(error, str):
            raise ValueError("a done reply whose llm output error is not text")
        return cls(path=path, error=error and utf8_text(error[:MAX_ERROR_CHARS]), **counts)


def marker(stream: str, *, cut_bytes: int, cut_lines: int, total_bytes: int,
           total_lines: int, saved: Saved) -> str:  # fmt: skip
    """The line that stands for the middle of a cut stream."""
    what = f"[harombe: {cut_bytes:,} bytes ({cut_lines:,} lines) of {stream} cut here; "
    size = f"{total_bytes:,} bytes, {total_lines:,} lines"
    if saved.path is None:
        return what + f"the full {stream} ({size}) could not be saved: {saved.error}]"
    where = f"{WORKSPACE}/{saved.path}"
    if saved.error is not None:
        return what + (
            f"only the first {saved.saved_bytes:,} bytes of the full {stream} ({size}) were "
            f"saved, in {where} ({saved.error}); the saved file is incomplete]"
        )
    return what + (
        f"the full {stream} ({size}) is saved in {where}: read it with "
        f"code_read_file(file_path='{saved.path}'), or page it with "
        f"code_execute(language='shell', code=\"sed -n '1,200p' {saved.path}\")]"
    )


def shape(stream: str, data: bytes, *, total_bytes: int, saved: Saved) -> str:
    """Head + marker line + tail of a cut stream, from the supervisor's head and tail bytes."""
    head = cut_head(data[: saved.head_bytes])
    tail = cut_tail(data[saved.head_bytes :])
    cut_bytes = total_bytes - len(head) - len(tail)
    cut_lines = saved.lines - head.count(b"\n") - tail.count(b"\n")
    line = marker(
        stream, cut_bytes=cut_bytes, cut_lines=max(cut_lines, 0), total_bytes=total_bytes,
        total_lines=saved.lines, saved=saved,
    )  # fmt: skip
    text = codecs.decode(head, "utf-8", "replace")
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line + "\n" + codecs.decode(tail, "utf-8", "replace")


def decode_llm(
    reply: dict[str, Any], stream: str, data: bytes, total_bytes: int
) -> tuple[str, str | None] | None:
    """The text of ``stream`` and the path of its saved copy when the supervisor cut it in the
    ``llm`` mode (its reply has ``<stream>_llm``); None when it did not."""
    value = reply.get(f"{stream}_llm")
    if value is None:
        return None
    saved = Saved.from_reply(value, kept_bytes=len(data), total_bytes=total_bytes)
    text = shape(stream, data, total_bytes=total_bytes, saved=saved)
    return text, saved.path

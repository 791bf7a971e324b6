"""The frame codec is one for host and guest (no Docker): the host decodes what the supervisor,
the Python worker and the JavaScript worker write, and they decode what the host writes.

The guest side runs the real joined sources (``SUPERVISOR_SOURCE``, ``PY_WORKER_SOURCE``) in
a separate interpreter, and ``jsworker.js`` under ``node``, as the sandbox runs them.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harombe.security.guest import JS_WORKER_SOURCE, PY_WORKER_SOURCE, SUPERVISOR_SOURCE, wire
from harombe.security.runtime import channel

#: Frames that cover the protocol's shapes: nested values, every JSON type the protocol uses,
#: text outside ASCII and the BMP, escapes, a blob of every byte value, an empty blob, a blob
#: larger than a pipe's buffer.
FRAMES: list[tuple[dict[str, Any], bytes]] = [
    ({"op": "run", "id": 1, "argv": ["python3", "-"], "env": {"A": "b"}}, b"print('hi')\n"),
    ({"op": "hello", "n": -(2**40), "f": 0.25, "t": True, "no": False, "none": None}, b""),
    ({"op": "result", "text": 'héllo ✓ 𝄞 "q" \\ \n\t\x00\x7f'}, bytes(range(256))),
    ({"op": "out", "id": 7, "stream": "stdout", "nested": [[1, [2, {}]], []]}, b"\x00" * 200_000),
    ({}, b""),
]

#: How long to wait for a guest process before giving up (it hangs only when broken).
HANG_GUARD_S = 120.0
#: Runs in a separate interpreter as the guest: loads one joined guest source, echoes every
#: frame it reads on stdin back on stdout with that source's own reader and writer.
GUEST_ECHO = r"""
import sys

source = open(sys.argv[1], encoding="utf-8").read()
scope = {"__name__": "harombe_guest_echo"}
exec(compile(source, "<guest>", "exec"), scope)
if sys.argv[2] == "worker":  # pyworker.py's read_frame / write_frame
    read_frame, write_frame = scope["read_frame"], scope["write_frame"]
    while True:
        frame = read_frame(0)
        if frame is None:
            break
        write_frame(1, frame[0], frame[1])
else:  # the supervisor's decoder for host requests, and its send()
    import os

    decoder = scope["FrameDecoder"](max_json_bytes=None, max_blob_bytes=None)
    while True:
        chunk = os.read(0, 7)  # small reads: frames arrive split at any byte
        if not chunk:
            break
        decoder.add(chunk)
        frame = decoder.next_frame()
        while frame is not None:
            scope["send"](frame[0], frame[1])
            frame = decoder.next_frame()
"""


@functools.cache
def python38() -> str:
    """A working Python 3.8 (the oldest the sandbox supports): on PATH or installed by pyenv.

    Missing, the tests that need it fail (never skip): the guest code's claim to run there
    would otherwise go unchecked."""
    candidates = [shutil.which("python3.8"), *map(str, sorted(PYENV.glob("3.8*/bin/python3.8")))]
    for exe in filter(None, candidates):
        probe = subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                               capture_output=True, check=False)  # fmt: skip
        if probe.returncode == 0:
            return exe
    raise AssertionError(
        "no working Python 3.8 on this machine: install one (e.g. `pyenv install 3.8`) to check "
        "that the guest code runs on the oldest Python the sandbox image may have"
    )


PYENV = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
INTERPRETERS = [
    pytest.param(sys.executable, id="host-python"),
    pytest.param("python3.8", id="python3.8"),
]


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` cut into pieces of 1 to 13 bytes, then the rest in one."""
    offset, size = 0, 1
    while offset < len(data) and size <= 13:
        yield data[offset : offset + size]
        offset, size = offset + size, size + 1
    yield data[offset:]


def decode_split(data: bytes) -> list[tuple[dict[str, Any], bytes]]:
    decoder = wire.FrameDecoder()
    frames = []
    for piece in pieces(data):
        frames += decoder.feed(piece)
    assert decoder.buffered == 0
    return frames


def echo(interpreter: str, source: str, kind: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "guest.py"
        path.write_text(source, encoding="utf-8")
        stream = b"".join(wire.encode(msg, blob) for msg, blob in FRAMES)
        done = subprocess.run(
            [interpreter, "-I", "-S", "-c", GUEST_ECHO, str(path), kind],
            input=stream,
            capture_output=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


@pytest.mark.parametrize("interpreter", INTERPRETERS)
@pytest.mark.parametrize(
    ("source", "kind"),
    [(SUPERVISOR_SOURCE, "supervisor"), (PY_WORKER_SOURCE, "worker")],
    ids=["supervisor", "pyworker"],
)
def test_the_guest_reads_the_hosts_frames_and_the_host_reads_the_guests(
    interpreter: str, source: str, kind: str
) -> None:
    """Host encode -> guest decoder -> guest writer -> host decoder gives back every frame."""
    out = echo(python38() if interpreter == "python3.8" else interpreter, source, kind)
    assert decode_split(out) == FRAMES
    assert channel.FrameDecoder().feed(out) == FRAMES  # the host's import path is the same codec


def test_the_guest_writes_what_the_host_wrote_before_the_codec_was_shared() -> None:
    """Frames are byte for byte compact, ASCII-escaped ``json.dumps`` output."""
    for msg, blob in FRAMES:
        data = json.dumps(msg, separators=(",", ":")).encode()
        assert wire.encode(msg, blob) == wire.HEADER.pack(len(data), len(blob)) + data + blob


def test_non_finite_floats_are_written_as_null() -> None:
    """The output is strict JSON whatever a float holds (the host refuses such values earlier)."""
    assert wire.dumps([float("nan"), float("inf"), -float("inf")]) == b"[null,null,null]"


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (wire.HEADER.pack(9, 0) + b"[1,2,3,4]", "not a JSON object"),
        (wire.HEADER.pack(3, 0) + b"{x}", "not JSON"),
        (wire.HEADER.pack(0, 0), "not JSON"),
        (wire.HEADER.pack(2, 0) + b"\xff\xfe", "not JSON"),
        (wire.HEADER.pack(4, 0) + b"{}{}", "not JSON"),
        (wire.HEADER.pack(1 << 30, 0), "over the caps"),
        (wire.HEADER.pack(2, 1 << 30), "over the caps"),
    ],
)
def test_a_bad_frame_is_a_protocol_error(frame: bytes, why: str) -> None:
    """Over the caps (known from the header alone), not JSON, or not an object: refused."""
    with pytest.raises(wire.ProtocolError, match=why):
        wire.FrameDecoder(max_json_bytes=1024, max_blob_bytes=1024).feed(frame)
    assert channel.ProtocolError is wire.ProtocolError


def test_deep_nesting_is_a_protocol_error_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    frame = wire.HEADER.pack(len(body), 0) + body
    with pytest.raises(wire.ProtocolError):
        wire.FrameDecoder(max_json_bytes=len(body)).feed(frame)


def test_no_caps_for_a_side_that_reads_only_the_host() -> None:
    big = b"x" * (wire.MAX_BLOB_BYTES + 1)
    assert wire.FrameDecoder(max_json_bytes=None, max_blob_bytes=None).feed(
        wire.encode({"op": "write"}, big)
    ) == [({"op": "write"}, big)]


def read_frames(fd: int, count: int) -> list[tuple[dict[str, Any], bytes]]:
    """Up to ``count`` frames from ``fd``, fewer if it ends first (or after a generous wait:
    a guard against hanging the suite, not a timing check)."""
    decoder = wire.FrameDecoder()
    frames: list[tuple[dict[str, Any], bytes]] = []
    while len(frames) < count and select.select([fd], [], [], HANG_GUARD_S)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        frames += decoder.feed(chunk)
    return frames


def test_the_javascript_worker_speaks_the_same_frames() -> None:
    """jsworker.js under node: it reads the host's frames (split across writes) and the host
    decodes its replies, text outside ASCII included."""
    node = shutil.which("node")
    assert node, "node is not on PATH: this test checks jsworker.js's frames and needs it"
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    with tempfile.TemporaryFile() as err:
        # The worker reads fd 3 and writes fd 4, as under the supervisor.
        proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" --expose-internals -e "$1" 3<&{req_r} 4>&{rep_w}',
             node, JS_WORKER_SOURCE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=(req_r, rep_w),
        )  # fmt: skip
        os.close(req_r)
        os.close(rep_w)
        try:
            stream = wire.encode({"cell": 1, "stream": False}, "'héllo ✓ 𝄞'".encode())
            stream += wire.encode({"cell": 2, "stream": False}, b"")
            for piece in pieces(stream):
                os.write(req_w, piece)
            frames = read_frames(rep_r, 3)
        finally:
            os.close(req_w)  # end of input: the worker exits
            proc.wait(timeout=HANG_GUARD_S)
            os.close(rep_r)
            err.seek(0)
            stderr = err.read().decode(errors="replace")
    assert len(frames) == 3, stderr
    (ready, _), (first, blob1), (second, blob2) = frames
    assert ready["ready"] is True and ready["threads"], ready
    assert (first["cell"], first["exit_code"], first["result"]) == (1, 0, "'héllo ✓ 𝄞'"), first
    assert (second["cell"], second["exit_code"], second["result"]) == (2, 0, None), second
    assert blob1 == blob2 == b""

"""Result mapping: the supervisor's ``done`` reply and output blob to an ExecutionResult (pure)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harombe.config import Limits
from harombe.errors import InfrastructureError
from harombe.security.runtime.results import TRUNCATION_MARK, result_from_reply
from harombe.security.runtime.sandbox import ExecutionResult

BOX = SimpleNamespace(sandbox_id="sandbox-0123456789ab", runtime="runsc")
LIMITS = Limits(max_memory_mb=256)


def done(out: bytes = b"", err: bytes = b"", **fields: Any) -> tuple[dict[str, Any], bytes]:
    """A ``done`` reply as the supervisor sends it, for output kept whole unless told."""
    reply = {
        "op": "done", "id": 1, "status": "ok", "exit_code": 0, "signal": None,
        "stdout_len": len(out), "stderr_len": len(err),
        "stdout_total": len(out), "stderr_total": len(err),
        "duration_s": 0.01, "cpu_s": 0.25, "peak_memory_mb": 12.5,
    }  # fmt: skip
    reply.update(fields)
    return reply, out + err


def mapped(reply: dict[str, Any], blob: bytes, **kw: Any) -> ExecutionResult:
    return result_from_reply(
        BOX,  # type: ignore[arg-type]
        reply, blob, language="python", timeout_s=kw.pop("timeout_s", 5.0), elapsed_s=0.5,
        limits=LIMITS, **kw,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            done(b"hi\n"),
            {"success": True, "status": "ok", "exit_code": 0, "error": None, "stdout": "hi\n"},
        ),
        (
            done(b"", b"boom\n", status="error", exit_code=3),
            {"success": False, "status": "error", "exit_code": 3, "stderr": "boom\n",
             "error": "process exited with code 3"},
        ),
        (
            done(b"partial", status="timeout", exit_code=143),
            {"success": False, "status": "timeout", "exit_code": -1, "stdout": "partial",
             "stderr": "\n[harombe] execution timed out after 5s", "error": "TimeoutError"},
        ),
        (
            done(status="oom", exit_code=137),
            {"success": False, "status": "oom", "exit_code": 137,
             "error": "MemoryError: the run used more than max_memory_mb=256 and was killed"},
        ),
        (
            done(status="cancelled", exit_code=143),
            {"success": False, "status": "cancelled", "exit_code": 143,
             "error": "CancelledError: the run was cancelled"},
        ),
    ],
    ids=["ok", "error", "timeout", "oom", "cancelled"],
)  # fmt: skip
def test_status_maps_to_success_exit_code_and_error(
    reply: tuple[dict[str, Any], bytes], expected: dict[str, Any]
) -> None:
    """Each status of the supervisor gives its own success flag, exit code and error text."""
    result = mapped(*reply)
    assert {k: getattr(result, k) for k in expected} == expected
    assert (result.cpu_s, result.peak_memory_mb, result.timeout_s) == (0.25, 12.5, 5.0)
    assert result.sandbox_id == BOX.sandbox_id and result.runtime == "runsc"


NAIVE = "naïve".encode()  # "ï" is two bytes: b"na\xc3\xafve"


@pytest.mark.parametrize(
    ("out", "total", "stdout", "truncated"),
    [
        (b"abc", 3, "abc", False),
        (b"abc", 10, "abc" + TRUNCATION_MARK, True),
        (NAIVE[:3], 100, "na" + TRUNCATION_MARK, True),
        (NAIVE, len(NAIVE), "naïve", False),
        (b"a\xff", 2, "a\ufffd", False),
    ],
    ids=["whole", "cut", "multibyte-cut-dropped", "multibyte-whole", "invalid-byte-replaced"],
)
def test_truncation_is_marked_and_a_cut_character_dropped(
    out: bytes, total: int, stdout: str, truncated: bool
) -> None:
    """A cut is marked and half a character at it dropped; merely invalid bytes are replaced."""
    result = mapped(*done(out, stdout_total=total))
    assert (result.stdout, result.stdout_truncated, result.stdout_bytes) == (
        stdout,
        truncated,
        total,
    )


def test_stdout_and_stderr_are_split_by_stdout_len() -> None:
    """The blob is stdout then stderr; each has its own truncation flag and total."""
    reply, blob = done(b"out", b"err", stderr_total=50)
    result = mapped(reply, blob)
    assert (result.stdout, result.stdout_truncated) == ("out", False)
    assert (result.stderr, result.stderr_truncated, result.stderr_bytes) == (
        "err" + TRUNCATION_MARK,
        True,
        50,
    )


def test_session_fields_and_warnings_are_carried() -> None:
    """A session run's result, state_lost and warnings reach the result, after the host's."""
    reply, blob = done(result="42", state_lost=True, session=True, warnings=["restarted"])
    result = mapped(reply, blob, warnings=["capped"])
    assert (result.result, result.state_lost, result.stateful) == ("42", True, True)
    assert result.warnings == ["capped", "restarted"]


def test_a_refusal_is_an_infrastructure_error() -> None:
    """A ``result`` reply instead of ``done`` (the supervisor refused the run) raises."""
    with pytest.raises(InfrastructureError, match="sandbox refused the run: a run is active"):
        mapped({"op": "result", "ok": False, "error": "Busy", "message": "a run is active"}, b"")

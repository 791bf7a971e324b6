"""From the supervisor's replies to results: the mapping of a ``done`` reply, checked field by
field (it comes from inside the sandbox), and the result of a call whose sandbox was lost.

Pure: no I/O. A reply that breaks the protocol raises ``ValueError`` / ``TypeError``, which the
caller turns into a lost sandbox.
"""

from __future__ import annotations

import codecs
from typing import Any

from harombe.config import Limits
from harombe.errors import InfrastructureError
from harombe.security.runtime.artifacts import left_behind, utf8_text
from harombe.security.runtime.llm_output import decode_llm
from harombe.security.runtime.sandbox import ExecutionResult, Sandbox

TRUNCATION_MARK = "\n[OUTPUT TRUNCATED]"
#: The statuses a supervisor reports; ``ok`` means exit code 0, ``error`` any other.
STATUSES = ("ok", "error", "timeout", "oom", "cancelled")
#: Exit codes are 32-bit on every system harombe runs on.
EXIT_CODE_RANGE = (-(2**31), 2**31)
#: Counts and amounts beyond this are not measurements.
MAX_COUNT = 2**63


def _decode(data: bytes, total: int) -> tuple[str, bool]:
    truncated = total > len(data)
    # An incremental decoder drops a multi-byte character cut in half by the byte cap.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not truncated)
    return (text + TRUNCATION_MARK if truncated else text), truncated


def _stream(
    reply: dict[str, Any], name: str, data: bytes, total: int, files: dict[str, str]
) -> tuple[str, bool]:
    """A stream's text and whether it was cut: head, marker and tail when the supervisor cut
    it in the ``llm`` output mode (the saved copy's path goes into ``files``), else as capped."""
    shaped = decode_llm(reply, name, data, total)
    if shaped is None:
        return _decode(data, total)
    text, path = shaped
    if path is not None:
        files[name] = path
    return text, True


def _error_of(status: str, exit_code: int, limits: Limits) -> str | None:
    if status == "timeout":
        return "TimeoutError"
    if status == "oom":
        return (
            f"MemoryError: the run used more than max_memory_mb={limits.max_memory_mb} "
            "and was killed"
        )
    if status == "cancelled":
        return "CancelledError: the run was cancelled"
    if exit_code != 0:
        return f"process exited with code {exit_code}"
    return None


def _count(reply: dict[str, Any], key: str, *, low: int = 0) -> int:
    """``reply[key]``, an integer in range (bool and float are not counts)."""
    value = reply[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < MAX_COUNT:
        raise ValueError(f"a done reply whose {key} is {str(value)[:40]!r}")
    return value


def _amount(reply: dict[str, Any], key: str) -> float:
    """``reply[key]`` (absent: 0), a finite number of at least 0."""
    value = reply.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a done reply whose {key} is {str(value)[:40]!r}")
    if not 0 <= value < MAX_COUNT:  # a 400-digit int is below infinity, yet no float
        raise ValueError(f"a done reply whose {key} is {value!r}")
    return float(value)


def _status_of(reply: dict[str, Any]) -> tuple[str, int]:
    """A ``done`` reply's status and exit code, checked against each other."""
    status = reply["status"]
    if status not in STATUSES:
        raise ValueError(f"a done reply whose status is {str(status)[:40]!r}")
    # A timed-out run's own exit code is not reported (it may be absent): -1 says "killed".
    exit_code = -1 if status == "timeout" else _count(reply, "exit_code", low=EXIT_CODE_RANGE[0])
    inconsistent = (status == "ok") != (exit_code == 0) and status in ("ok", "error")
    if exit_code >= EXIT_CODE_RANGE[1] or inconsistent:
        raise ValueError(f"a done reply with status {status} and exit code {exit_code}")
    return status, exit_code


def result_from_reply(
    box: Sandbox,
    reply: dict[str, Any],
    blob: bytes,
    *,
    language: str,
    timeout_s: float,
    elapsed_s: float,
    limits: Limits,
    warnings: list[str] | None = None,
) -> ExecutionResult:
    """The result of a run from the supervisor's ``done`` reply and its output blob. Pure.

    The reply comes from inside the sandbox: a field of the wrong type or out of range raises
    ``ValueError`` / ``TypeError`` (the caller treats the sandbox as broken)."""
    if reply.get("op") != "done":
        # The supervisor refused (a run still active after a cancel): not the caller's misuse.
        raise InfrastructureError(f"sandbox refused the run: {str(reply.get('message'))[:200]}")
    out_len = _count(reply, "stdout_len")
    blob, left, left_warnings = left_behind(reply, blob, out_len)  # files, images
    stdout_total, stderr_total = _count(reply, "stdout_total"), _count(reply, "stderr_total")
    files: dict[str, str] = {}  # output mode llm: where the full text of a cut stream is
    stdout, out_cut = _stream(reply, "stdout", blob[:out_len], stdout_total, files)
    stderr, err_cut = _stream(reply, "stderr", blob[out_len:], stderr_total, files)
    status, exit_code = _status_of(reply)
    if out_len > stdout_total or len(blob) - out_len > stderr_total:
        raise ValueError("a done reply that kept more output than it counted")
    result, warnings_in = reply.get("result"), reply.get("warnings") or []
    if not (result is None or isinstance(result, str)) or not isinstance(warnings_in, list):
        raise TypeError("a done reply whose result is not text or whose warnings are no list")
    if status == "timeout":
        stderr += f"\n[harombe] execution timed out after {timeout_s:g}s"
    return ExecutionResult(
        success=status == "ok",
        sandbox_id=box.sandbox_id,
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        execution_time=round(elapsed_s, 6),
        error=_error_of(status, exit_code, limits),
        status=status,
        language=language,
        runtime=box.runtime,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        stdout_bytes=stdout_total,
        stderr_bytes=stderr_total,
        cpu_s=_amount(reply, "cpu_s"),
        peak_memory_mb=_amount(reply, "peak_memory_mb"),
        timeout_s=timeout_s,
        warnings=list(warnings or []) + [utf8_text(str(w)) for w in warnings_in] + left_warnings,
        result=None if result is None else utf8_text(result),
        state_lost=bool(reply.get("state_lost")),
        stateful=bool(reply.get("session")),
        **left,
        output_files=files,
    )


def lost_result(
    box: Sandbox, replacement_id: str, reason: str, *, language: str, elapsed_s: float
) -> ExecutionResult:
    """The result of a call whose sandbox ``box`` died, replaced by ``replacement_id``."""
    return ExecutionResult(
        success=False,
        sandbox_id=replacement_id,
        stdout="",
        stderr="",
        exit_code=-1,
        execution_time=round(elapsed_s, 6),
        error=(
            f"SandboxLostError: {reason}; its files and state are gone, and sandbox "
            f"{replacement_id} replaces it"
        ),
        status="lost",
        language=language,
        runtime=box.runtime,
        replaced_sandbox_id=box.sandbox_id,
    )

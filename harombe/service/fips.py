"""The fips-agents code-sandbox sidecar contract: ``GET /healthz``, ``GET /profile``,
``POST /execute``, answered exactly as that sidecar answers them, so an agent written against
it works unchanged with ``SANDBOX_URL`` pointing here.

``POST /execute`` runs the code in a fresh gVisor sandbox from the warm pool of the active
profile (``SANDBOX_PROFILE``, else ``service.profile``; a request may name another with
``profile``), after the profile's scan stages, and the sandbox is removed afterwards: nothing
one request leaves is seen by the next. Each stream is cut at 50 KB. The 200 answer also
carries ``result``, the repr of the code's final expression (``null`` when there is none).
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from harombe.errors import ConfigError
from harombe.service import deps
from harombe.service.problems import status_for
from harombe.tools.profiles import disabled_message

log = structlog.get_logger(__name__)
router = APIRouter(tags=["fips sidecar"])

#: Each stream of an answer is cut at this many bytes, with :data:`TRUNCATION_NOTE` appended.
MAX_STREAM_BYTES = 50 * 1024
TRUNCATION_NOTE = "\n[output truncated at 50 KB]"
#: The exit code a killed (timed out) run reports, as the sidecar's does.
KILLED_EXIT_CODE = -9
#: What stderr says of a run that was killed for another reason than its timeout.
KILLED_BECAUSE = {
    "lost": "the run was killed: its sandbox was lost",
    "oom": "the run was killed: it ran out of memory",
}


class ExecuteRequest(BaseModel):
    """``POST /execute``'s body. Other fields are ignored, as by the sidecar."""

    code: str = Field(description="Python source to run.")
    timeout: float = Field(
        10.0, gt=0, le=30.0, description="Seconds the run may take (capped by the profile)."
    )
    profile: str | None = Field(
        None, description="A profile to run under instead of the active one."
    )


def cut(text: str) -> str:
    """``text`` cut at :data:`MAX_STREAM_BYTES` bytes of output, with the note when cut.

    The bytes counted are those the program wrote: a character that stands for one byte that
    was not UTF-8 (U+FFFD, or a lone surrogate escape) counts as that one byte."""
    if len(text) <= MAX_STREAM_BYTES // 4 or text.isascii():
        if len(text) <= MAX_STREAM_BYTES:
            return text
        return text[:MAX_STREAM_BYTES] + TRUNCATION_NOTE
    used = 0
    for index, char in enumerate(text):
        used += _raw_bytes(char)
        if used > MAX_STREAM_BYTES:
            return text[:index] + TRUNCATION_NOTE
    return text


def _raw_bytes(char: str) -> int:
    code = ord(char)
    if code < 0x80 or code == 0xFFFD or 0xDC80 <= code <= 0xDCFF:
        return 1
    return 2 if code < 0x800 else 3 if code < 0x10000 else 4


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: 200 ``{"status": "ok"}``."""
    return {"status": "ok"}


@router.get("/profile")
async def profile(request: Request) -> dict[str, Any]:
    """The active profile: name, description, allowed imports, blocklist size, scan stages."""
    deps.caller(request)
    return deps.service_of(request).profile.describe()


@router.post("/execute", response_model=None)
async def execute(body: ExecuteRequest, request: Request) -> JSONResponse | dict[str, Any]:
    """Scan and run ``code``: 200 with the output, 400 when refused (see the module doc)."""
    tenant = deps.caller(request)
    svc = deps.service_of(request)
    if not body.code.strip():
        return JSONResponse({"error": "No code provided"}, status_code=400)
    name = body.profile or svc.profile_name
    choosable = {svc.profile_name, *svc.config.service.request_profiles}
    chosen = svc.profiles.get(name) if name in choosable else None
    if name in choosable and name in svc.profile_set.disabled:
        reason = disabled_message(name, svc.profile_set.disabled[name])
        return JSONResponse({"error": reason}, status_code=status_for(ConfigError))
    if chosen is None:
        known = ", ".join(sorted(p for p in choosable if p in svc.profiles))
        return JSONResponse(
            {"error": f"Profile {name[:80]!r} cannot be chosen here; use one of {known} "
                      "(service.request_profiles lists the others a request may name)"},
            status_code=400,
        )  # fmt: skip
    timeout_s = min(body.timeout, chosen.resources.timeout_max_s)
    with tenant.run_slot():
        result = await svc.tools.code_execute(
            language="python", code=body.code, timeout=timeout_s, profile=name
        )
    svc.feed.publish(deps.tool_event("execute", tenant, result))
    sandbox_id = result.get("sandbox_id")
    if isinstance(sandbox_id, str) and sandbox_id in svc.manager.sandboxes:
        svc.remove_later(sandbox_id)
    if result.get("violations"):
        return JSONResponse(
            {"error": "Code validation failed", "violations": list(result["violations"])},
            status_code=400,
        )
    if result.get("status") is None:  # refused before it ran: denied, or the service is unwell
        problem = deps.problem_in_result(result)
        status = problem.status if problem is not None else 503
        return JSONResponse({"error": str(result.get("error"))}, status_code=status)
    return _answer(result, timeout_s)


def _answer(result: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    timed_out = result.get("status") == "timeout"
    exit_code = result.get("exit_code")
    stderr = cut(str(result.get("stderr") or ""))
    if timed_out:
        exit_code, stderr = KILLED_EXIT_CODE, f"Execution timed out after {timeout_s}s"
    elif result.get("status") in ("lost", "oom") or not isinstance(exit_code, int):
        exit_code = KILLED_EXIT_CODE  # killed for memory, or the sandbox was lost
        why = KILLED_BECAUSE.get(str(result.get("status")), "the run was killed")
        note = f"{why}: {result.get('error') or 'no reason given'}"
        stderr = f"{stderr}\n{note}" if stderr else note
    return {
        "stdout": cut(str(result.get("stdout") or "")),
        "stderr": stderr,
        "exit_code": exit_code,
        "timed_out": timed_out,
        "result": result.get("result"),
    }

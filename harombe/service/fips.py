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

from harombe.service import deps

log = structlog.get_logger(__name__)
router = APIRouter(tags=["fips sidecar"])

#: Each stream of an answer is cut at this many bytes, with :data:`TRUNCATION_NOTE` appended.
MAX_STREAM_BYTES = 50 * 1024
TRUNCATION_NOTE = "\n[output truncated at 50 KB]"
#: The exit code a killed (timed out) run reports, as the sidecar's does.
KILLED_EXIT_CODE = -9


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
    """``text`` cut at :data:`MAX_STREAM_BYTES` bytes of UTF-8, with the note when cut."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_STREAM_BYTES:
        return text
    return raw[:MAX_STREAM_BYTES].decode("utf-8", "replace") + TRUNCATION_NOTE


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
    chosen = svc.profiles.get(name)
    if chosen is None:
        known = ", ".join(sorted(svc.profiles))
        return JSONResponse(
            {"error": f"Unknown profile {name[:80]!r}; use one of {known}"}, status_code=400
        )
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
    if "status" not in result:  # refused before it ran: denied, or the service is unwell
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
    elif not isinstance(exit_code, int):  # killed for memory, or the sandbox was lost
        exit_code = KILLED_EXIT_CODE
        stderr = (stderr + "\n" if stderr else "") + str(result.get("error") or "")
    return {
        "stdout": cut(str(result.get("stdout") or "")),
        "stderr": stderr,
        "exit_code": exit_code,
        "timed_out": timed_out,
        "result": result.get("result"),
    }

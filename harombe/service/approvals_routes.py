"""Routes of approvals: the list, one approval, a decision, the live feed, and the page.

Listing is open to clients (their own held calls, read-only) and to approvers (all of them);
deciding and following the feed need an approver's credential (:func:`deps.approver`). The
page (``GET /approvals``) is static: it reads the key from its URL (``?key=…``, printed by
``harombe serve`` at start) and calls these routes with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from harombe.service import deps
from harombe.service.models import Decide, problems
from harombe.service.problems import HTTPProblem

router = APIRouter(tags=["approvals"])
ApprovalId = Path(max_length=64, description="An approval id from GET /v1/approvals.")


def _visible_to(request: Request) -> str | None:
    """``None`` (all) for an approver; else the calling client's tenant name."""
    try:
        deps.approver(request)
    except HTTPProblem:
        return deps.caller(request).name
    return None


def _gone(approval_id: str) -> HTTPProblem:
    return HTTPProblem(
        404,
        "ApprovalNotFound",
        f"no held approval {approval_id[:64]!r}: it was decided, timed out, or never existed; "
        "list held ones with GET /v1/approvals",
    )


@router.get("/v1/approvals")
async def list_approvals(request: Request) -> dict[str, list[dict[str, Any]]]:
    """Held approvals, oldest first (a client sees only its own)."""
    tenant = _visible_to(request)
    return {"approvals": deps.service_of(request).broker.pending(tenant)}


@router.get("/v1/approvals/events", responses={200: {"content": {"text/event-stream": {}}}})
async def follow(request: Request) -> StreamingResponse:
    """Server-sent events: recent approvals and tool calls, then new ones as they happen."""
    deps.approver(request)
    feed = deps.service_of(request).feed

    async def events() -> AsyncIterator[bytes]:
        async for event in feed.follow():
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/v1/approvals/{approval_id}", responses=problems(404))
async def get_approval(request: Request, approval_id: str = ApprovalId) -> dict[str, Any]:
    tenant = _visible_to(request)
    held = deps.service_of(request).broker.get(approval_id, tenant)
    if held is None:
        raise _gone(approval_id)
    return held


@router.post("/v1/approvals/{approval_id}", responses=problems(401, 403, 404))
async def decide(body: Decide, request: Request, approval_id: str = ApprovalId) -> dict[str, Any]:
    """Approve once, approve for the sandbox, or deny a held call."""
    by = deps.approver(request)
    decided = deps.service_of(request).broker.decide(
        approval_id, body.decision, by=by, comment=body.comment
    )
    if decided is None:
        raise _gone(approval_id)
    return decided


@router.get("/approvals", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    """The approvals page (static; its script talks to the routes above)."""
    return HTMLResponse(_static("approvals.html"), headers=HEADERS)


@router.get("/approvals/app.js", include_in_schema=False)
async def script() -> Response:
    """The page's script: a file of its own, so the page's CSP allows no inline script."""
    return Response(_static("approvals.js"), media_type="text/javascript", headers=HEADERS)


def _static(name: str) -> str:
    return resources.files("harombe.service").joinpath(f"static/{name}").read_text()


#: The page runs only its own script file and talks only to this service.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-store",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}  # fmt: skip

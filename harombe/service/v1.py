"""``/v1``: sandboxes, execute (JSON and server-sent events), installs, health and version.

Every route names its caller first (:func:`~harombe.service.deps.caller`), and a sandbox that is
not the caller's is answered 404, as one that does not exist. Calls go through the same
:class:`~harombe.tools.code_execution.CodeExecutionTools` as the library, so the gate, the
profiles and the audit events are the same; a tool result that reports a refusal becomes the
error answer of its kind (:mod:`.problems`), and a run — failed or not — is a 200.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import StreamingResponse

from harombe.service import deps
from harombe.service.auth import Tenant
from harombe.service.gatekeeper import identify
from harombe.service.models import (
    CreateSandbox,
    Execute,
    Health,
    Install,
    SandboxList,
    SandboxView,
    ToolResult,
    Version,
    problems,
)
from harombe.service.problems import HTTPProblem
from harombe.service.state import Service
from harombe.service.version import VERSION as __version__

router = APIRouter(prefix="/v1", tags=["v1"])
SandboxId = Path(max_length=64, description="A sandbox id from POST /v1/sandboxes.")


def not_found(sandbox_id: str) -> HTTPProblem:
    return HTTPProblem(
        404,
        "SandboxNotFoundError",
        f"Sandbox not found: {sandbox_id[:64]} does not exist, was destroyed, or is not yours; "
        "list yours with GET /v1/sandboxes or create one with POST /v1/sandboxes",
    )


def owned(request: Request, sandbox_id: str) -> tuple[Service, Tenant]:
    """The service and the caller, when ``sandbox_id`` is the caller's live sandbox."""
    tenant = deps.caller(request)
    svc = deps.service_of(request)
    if not svc.owned(tenant, sandbox_id):
        raise not_found(sandbox_id)
    return svc, tenant


def answer(svc: Service, tool: str, tenant: Tenant, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` as the answer: recorded in the feed; a refusal raised as its problem."""
    svc.adopt(tenant, result)
    svc.feed.publish(deps.tool_event(tool, tenant, result))
    problem = deps.problem_in_result(result)
    if problem is not None:
        raise problem
    return result


def view(svc: Service, sandbox_id: str) -> SandboxView:
    box = svc.manager.get(sandbox_id)
    return SandboxView(
        sandbox_id=box.sandbox_id,
        language=box.language,
        network_enabled=box.network_enabled,
        allowed_domains=list(box.allowed_domains),
        profile=box.profile.name if box.profile is not None else None,
        created_at=box.created_at,
    )


@router.post(
    "/sandboxes", status_code=201, response_model=SandboxView, responses=problems(400, 403, 429)
)
async def create_sandbox(body: CreateSandbox, request: Request) -> SandboxView:
    """Create a sandbox (through the gate: a network-enabled one needs approval)."""
    tenant = deps.caller(request)
    svc = deps.service_of(request)
    svc.live(tenant)  # a sandbox lost meanwhile no longer counts against the limit
    with tenant.creation_slot(), tenant.run_slot():
        result = await svc.tools.code_execute(
            language=body.language,
            code="",
            network_enabled=body.network_enabled,
            allowed_domains=body.allowed_domains,
            profile=body.profile,
        )
        answer(svc, "create_sandbox", tenant, result)
    sandbox_id = result.get("sandbox_id")
    if not isinstance(sandbox_id, str) or sandbox_id not in svc.manager.sandboxes:
        raise HTTPProblem(503, "SandboxStartError", str(result.get("error") or "not created"))
    return view(svc, sandbox_id)


@router.get("/sandboxes", response_model=SandboxList)
async def list_sandboxes(request: Request) -> SandboxList:
    """The caller's live sandboxes."""
    tenant = deps.caller(request)
    svc = deps.service_of(request)
    return SandboxList(sandboxes=[view(svc, sid) for sid in svc.live(tenant)])


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxView, responses=problems(404))
async def get_sandbox(request: Request, sandbox_id: str = SandboxId) -> SandboxView:
    svc, _ = owned(request, sandbox_id)
    return view(svc, sandbox_id)


@router.delete("/sandboxes/{sandbox_id}", status_code=204, responses=problems(404))
async def delete_sandbox(request: Request, sandbox_id: str = SandboxId) -> Response:
    """Destroy the sandbox and everything in it."""
    svc, tenant = owned(request, sandbox_id)
    result = await svc.tools.code_destroy_sandbox(sandbox_id)
    svc.disown(sandbox_id)
    answer(svc, "destroy_sandbox", tenant, result)
    return Response(status_code=204)


@router.post(
    "/sandboxes/{sandbox_id}/execute",
    response_model=ToolResult,
    responses=problems(400, 403, 404, 429),
)
async def execute(body: Execute, request: Request, sandbox_id: str = SandboxId) -> Any:
    """Run code in the sandbox; its outcome (failed code included) is the 200 answer."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        result = await svc.tools.code_execute(
            language=body.language,
            code=body.code,
            sandbox_id=sandbox_id,
            timeout=body.timeout,
            fresh=body.fresh,
            output_mode=body.output_mode,
        )
    return answer(svc, "execute", tenant, result)


@router.post(
    "/sandboxes/{sandbox_id}/execute/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **problems(400, 404, 429)},
)
async def execute_stream(
    body: Execute, request: Request, sandbox_id: str = SandboxId
) -> StreamingResponse:
    """Run code, streaming ``stdout`` / ``stderr`` events as it prints, then one ``result``
    event (the JSON result). Closing the connection cancels the run."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        pass  # 429 now, before the stream starts, when every run slot is taken

    async def events() -> AsyncIterator[bytes]:
        try:
            with tenant.run_slot():
                stream = svc.tools.code_execute_stream(
                    language=body.language,
                    code=body.code,
                    sandbox_id=sandbox_id,
                    timeout=body.timeout,
                    fresh=body.fresh,
                    output_mode=body.output_mode,
                )
                async for item in stream:
                    kind = item.pop("type")
                    if kind == "result":
                        svc.adopt(tenant, item)
                        svc.feed.publish(deps.tool_event("execute", tenant, item))
                    yield _event(kind, item)
        except HTTPProblem as problem:  # the slot was taken between the check and the start
            yield _event("error", {"kind": problem.kind, "message": problem.message})

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


@router.post(
    "/sandboxes/{sandbox_id}/packages",
    response_model=ToolResult,
    responses=problems(400, 403, 404, 429, 502),
)
async def install(body: Install, request: Request, sandbox_id: str = SandboxId) -> Any:
    """Install a package from pypi or npm into the sandbox."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        result = await svc.tools.code_install_package(sandbox_id, body.package, body.registry)
    return answer(svc, "install_package", tenant, result)


@router.post(
    "/sandboxes/{sandbox_id}/packages/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **problems(400, 404, 429)},
)
async def install_stream(
    body: Install, request: Request, sandbox_id: str = SandboxId
) -> StreamingResponse:
    """Install a package, streaming a ``progress`` event for each step (``{"stage",
    "package", "bytes", "message"}``: resolving, downloading, unpacking, compiling,
    installing, linking, checking, done), then one ``result`` event (the JSON result, as
    ``POST .../packages`` answers it, a refusal included). Closing the connection cancels
    the install."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        pass  # 429 now, before the stream starts, when every run slot is taken

    async def events() -> AsyncIterator[bytes]:
        steps: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        try:
            with tenant.run_slot():
                task = asyncio.ensure_future(
                    svc.tools.code_install_package(
                        sandbox_id, body.package, body.registry, on_progress=steps.put_nowait
                    )
                )
                try:
                    while not task.done() or not steps.empty():
                        getter = asyncio.ensure_future(steps.get())
                        await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                        if getter.done():
                            yield _event("progress", getter.result())
                        else:
                            getter.cancel()
                    result = task.result()
                finally:
                    task.cancel()
                svc.adopt(tenant, result)
                svc.feed.publish(deps.tool_event("install_package", tenant, result))
                yield _event("result", result)
        except HTTPProblem as problem:  # the slot was taken between the check and the start
            yield _event("error", {"kind": problem.kind, "message": problem.message})

    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/health", response_model=Health)
async def health(request: Request) -> Health:
    """Whether the service is up, its fips profile, and the caller's own live sandboxes and
    running calls; an approver's token or the approval key sees the whole service's."""
    svc = deps.service_of(request)
    status: Literal["ok", "starting"] = "ok" if svc.started else "starting"
    identity = identify(svc, request.scope)
    tenant = identity.tenant
    if identity.approval_key or tenant is None or tenant.role == "approver":
        sandboxes, runs = len(svc.manager.sandboxes), sum(t.running for t in svc.tokens.tenants())
        return Health(
            status=status, sandboxes=sandboxes, runs=runs, scope="service", profile=svc.profile_name
        )
    return Health(
        status=status,
        sandboxes=len(svc.live(tenant)),
        runs=tenant.running,
        scope="tenant",
        profile=svc.profile_name,
    )


@router.get("/version", response_model=Version)
async def version(request: Request) -> Version:
    svc = deps.service_of(request)
    sandbox = svc.config.security.sandbox
    return Version(harombe=__version__, runtime=sandbox.runtime, image=sandbox.image_for("python"))

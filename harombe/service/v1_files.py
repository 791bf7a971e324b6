"""``/v1`` files: list, write and read, as text (JSON) or as raw bytes (upload and download).

Text goes through the library's ``code_write_file`` / ``code_read_file``. Raw bytes take the
same path rules (``params``' readers: normalised, refused when ambiguous or outside
``/workspace``) and the same gate, which is shown the bytes as text (undecodable bytes
replaced), then move through the manager. Sizes: a request body is at most
``service.max_request_bytes``; a file at most ``limits.max_file_bytes``.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from harombe.errors import HarombeError
from harombe.security.approval.gate import Operation
from harombe.service import deps
from harombe.service.auth import Tenant
from harombe.service.models import ToolResult, WriteText, problems
from harombe.service.problems import HTTPProblem, problem_from
from harombe.service.state import Service
from harombe.service.v1 import SandboxId, answer, owned
from harombe.tools.params import ReadFileArgs, WriteFileArgs, parse_args

log = structlog.get_logger(__name__)
router = APIRouter(prefix="/v1", tags=["v1 files"])
FilePath = Path(max_length=4096, description="Path relative to /workspace.")


@router.get(
    "/sandboxes/{sandbox_id}/files", response_model=ToolResult, responses=problems(400, 404)
)
async def list_files(
    request: Request,
    sandbox_id: str = SandboxId,
    path: str = Query(".", max_length=4096, description="A directory under /workspace."),
) -> Any:
    """Names and details of a workspace directory's entries."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        result = await svc.tools.code_list_files(sandbox_id, path)
    return answer(svc, "list_files", tenant, result)


@router.post(
    "/sandboxes/{sandbox_id}/files", response_model=ToolResult, responses=problems(400, 403, 404)
)
async def write_text(body: WriteText, request: Request, sandbox_id: str = SandboxId) -> Any:
    """Write UTF-8 text to a file (parents created; the write is atomic)."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        result = await svc.tools.code_write_file(sandbox_id, body.path, body.content)
    return answer(svc, "write_file", tenant, result)


@router.put(
    "/sandboxes/{sandbox_id}/files/{file_path:path}",
    response_model=ToolResult,
    responses=problems(400, 403, 404, 413),
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {}}}}},
)
async def upload(request: Request, sandbox_id: str = SandboxId, file_path: str = FilePath) -> Any:
    """Write the request body, as raw bytes, to a file."""
    svc, tenant = owned(request, sandbox_id)
    with tenant.run_slot():
        return await _upload(svc, tenant, sandbox_id, file_path, await request.body())


async def _upload(
    svc: Service, tenant: Tenant, sandbox_id: str, file_path: str, data: bytes
) -> dict[str, Any]:
    limit = svc.manager.limits.max_file_bytes
    if len(data) > limit:
        raise HTTPProblem(
            413, "FileError", f"the file is {len(data)} bytes, over max_file_bytes ({limit})"
        )
    args = _checked(svc, WriteFileArgs, sandbox_id, file_path, content="")
    shown = {"sandbox_id": sandbox_id, "file_path": args.file_path,
             "content": data.decode("utf-8", "replace")}  # fmt: skip
    await _approved(svc, tenant, "code_write_file", shown)
    written = await _files(svc, svc.manager.write_file(sandbox_id, args.file_path, data))
    result = {"success": True, "sandbox_id": sandbox_id, "file_path": args.file_path,
              "written_bytes": written, "error": None}  # fmt: skip
    svc.feed.publish(deps.tool_event("upload", tenant, result))
    return result


@router.get(
    "/sandboxes/{sandbox_id}/files/{file_path:path}",
    responses={200: {"content": {"application/octet-stream": {}}}, **problems(400, 403, 404)},
)
async def download(
    request: Request, sandbox_id: str = SandboxId, file_path: str = FilePath
) -> Response:
    """The file's bytes (``application/octet-stream``)."""
    svc, tenant = owned(request, sandbox_id)
    args = _checked(svc, ReadFileArgs, sandbox_id, file_path)
    shown = {"sandbox_id": sandbox_id, "file_path": args.file_path}
    with tenant.run_slot():
        await _approved(svc, tenant, "code_read_file", shown)
        data = await _files(svc, svc.manager.read_file(sandbox_id, args.file_path))
    result = {"success": True, "sandbox_id": sandbox_id, "read_bytes": len(data)}
    svc.feed.publish(deps.tool_event("download", tenant, result))
    return Response(data, media_type="application/octet-stream")


def _checked(svc: Service, model: Any, sandbox_id: str, file_path: str, **extra: Any) -> Any:
    try:
        raw = {"sandbox_id": sandbox_id, "file_path": file_path, **extra}
        return parse_args(model, raw, max_bytes=svc.manager.limits.max_file_bytes)
    except HarombeError as err:
        raise problem_from(err) from None


async def _approved(svc: Service, tenant: Tenant, tool: str, params: dict[str, Any]) -> None:
    """Ask the gate as the library's tool would; a refusal is 403 with its reasons."""
    if svc.gate is None:
        return
    decision = await svc.gate.check_approval(Operation(tool, params))
    if not decision.approved:
        err = decision.error()
        svc.feed.publish({"type": "tool.called", "tool": tool, "tenant": tenant.name,
                          "sandbox_id": params["sandbox_id"], "success": False,
                          "approval": decision.status.value, "error": err.kind})  # fmt: skip
        raise problem_from(err)


async def _files(svc: Service, operation: Any) -> Any:
    try:
        return await operation
    except HarombeError as err:
        raise problem_from(err) from None

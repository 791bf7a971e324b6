"""The FastAPI app: its parts' lifespan, who is calling, and errors as JSON.

:func:`create_app` builds the app over a :class:`~harombe.service.state.Service`; starting the
app (uvicorn's lifespan) starts the service, and shutting it down removes every sandbox it
made. Request bodies above ``service.max_request_bytes`` are refused with 413 before they are
read whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Mapping

import structlog
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from harombe.config import HarombeConfig, load_config
from harombe.errors import HarombeError
from harombe.service import approvals_routes, fips, v1, v1_files
from harombe.service.body_limit import BodyLimit
from harombe.service.gatekeeper import Gatekeeper
from harombe.service.mcp_http import PATH as MCP_PATH
from harombe.service.mcp_http import McpEndpoint
from harombe.service.problems import HTTPProblem, problem_from
from harombe.service.state import Service
from harombe.service.version import VERSION as __version__

log = structlog.get_logger(__name__)


def create_app(
    config: HarombeConfig | None = None,
    *,
    service: Service | None = None,
    environ: Mapping[str, str] | None = None,
) -> FastAPI:
    """The service's app. Give a ``service`` to share one (tests), else one is made from
    ``config`` (or :func:`~harombe.config.load_config`)."""
    svc = service or Service(config or load_config(), environ=environ)
    mcp_endpoint = McpEndpoint(svc)  # streamable HTTP MCP at /mcp, guarded as /v1 is

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await svc.start()
        except HarombeError as err:
            # uvicorn reports a failed start as a traceback; say what to fix first, plainly.
            log.error("service.start_failed", error=f"{err.kind}: {err}")
            await svc.stop()
            raise
        try:
            async with mcp_endpoint.running():  # MCP sessions end before the sandboxes go
                yield
        finally:
            await svc.stop()

    app = FastAPI(
        title="harombe",
        version=__version__,
        description="Run LLM-written code in gVisor sandboxes behind a human-in-the-loop gate.",
        lifespan=lifespan,
    )
    app.state.service = svc
    app.add_middleware(BodyLimit, max_bytes=svc.config.service.max_request_bytes)
    app.add_middleware(Gatekeeper, service=svc)  # added last: runs first, before bodies
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(HTTPProblem)(_problem)
    app.exception_handler(HarombeError)(_harombe_error)
    app.exception_handler(RequestValidationError)(_invalid_request)
    app.include_router(fips.router)
    app.include_router(v1.router)
    app.include_router(v1_files.router)
    app.include_router(approvals_routes.router)
    app.router.routes.append(Route(MCP_PATH, endpoint=mcp_endpoint))
    return app


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPProblem)
    return exc.response()


async def _harombe_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HarombeError)
    return problem_from(exc).response()


def _safe(value: object, depth: int = 0) -> object:
    """``value`` as plain JSON: non-finite numbers and text that is not Unicode become their
    repr, containers are walked (a few levels), anything else becomes its repr, all cut short."""
    if value is None or isinstance(value, bool | int):
        return value if not isinstance(value, int) or abs(value) < 1 << 63 else repr(value)[:80]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        text = value[:1000]
        return text if text.encode("utf-8", "replace").decode() == text else repr(text)[:1000]
    if isinstance(value, dict) and depth < 4:
        return {str(_safe(k, depth + 1)): _safe(v, depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list | tuple) and depth < 4:
        return [_safe(v, depth + 1) for v in list(value)[:50]]
    return repr(value)[:200]


#: Starlette's error statuses → (kind, how to fix) of the /v1 answer.
_STARLETTE_ERRORS = {
    404: ("NotFound", "; see /openapi.json for the routes"),
    405: ("MethodNotAllowed", "; see /openapi.json for each route's methods"),
    400: ("BadRequest", "; send a JSON body as /openapi.json describes it"),
}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no route, wrong method, a body it could not parse): on ``/v1``
    in the ``{"kind", "message"}`` shape, elsewhere as FastAPI answers them."""
    assert isinstance(exc, StarletteHTTPException)
    if not request.url.path.startswith("/v1"):
        return await http_exception_handler(request, exc)
    kind, fix = _STARLETTE_ERRORS.get(exc.status_code, ("HTTPError", ""))
    body = {"kind": kind, "message": f"{exc.detail}{fix}"}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    """The fips endpoints keep FastAPI's own 422 shape (their contract); ``/v1`` answers
    ``{"kind", "message"}`` naming each bad field."""
    assert isinstance(exc, RequestValidationError)
    if not request.url.path.startswith("/v1"):
        # FastAPI's own shape (the fips contract), with each echoed input made JSON-safe: a
        # NaN, an infinity or a lone surrogate in it must not turn a 422 into a 500.
        detail = [{**item, "input": _safe(item.get("input"))} for item in exc.errors()]
        detail = [{k: v for k, v in item.items() if k != "ctx"} for item in detail]
        return JSONResponse({"detail": detail}, status_code=422)
    problems = []
    for item in exc.errors()[:10]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {item.get('msg', 'invalid')}")
    message = "; ".join(problems) + " — see /openapi.json for the request's schema"
    return JSONResponse({"kind": "InvalidRequest", "message": message}, status_code=422)

"""The FastAPI app: its parts' lifespan, who is calling, and errors as JSON.

:func:`create_app` builds the app over a :class:`~harombe.service.state.Service`; starting the
app (uvicorn's lifespan) starts the service, and shutting it down removes every sandbox it
made. Request bodies above ``service.max_request_bytes`` are refused with 413 before they are
read whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import structlog
from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from harombe.config import HarombeConfig, load_config
from harombe.errors import HarombeError
from harombe.service import approvals_routes, fips, v1, v1_files
from harombe.service.body_limit import BodyLimit
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

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        try:
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
    app.exception_handler(HTTPProblem)(_problem)
    app.exception_handler(HarombeError)(_harombe_error)
    app.exception_handler(RequestValidationError)(_invalid_request)
    app.include_router(fips.router)
    app.include_router(v1.router)
    app.include_router(v1_files.router)
    app.include_router(approvals_routes.router)
    return app


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPProblem)
    return exc.response()


async def _harombe_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HarombeError)
    return problem_from(exc).response()


async def _invalid_request(request: Request, exc: Exception) -> Response:
    """The fips endpoints keep FastAPI's own 422 shape (their contract); ``/v1`` answers
    ``{"kind", "message"}`` naming each bad field."""
    assert isinstance(exc, RequestValidationError)
    if not request.url.path.startswith("/v1"):
        return await request_validation_exception_handler(request, exc)
    problems = []
    for item in exc.errors()[:10]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {item.get('msg', 'invalid')}")
    message = "; ".join(problems) + " — see /openapi.json for the request's schema"
    return JSONResponse({"kind": "InvalidRequest", "message": message}, status_code=422)

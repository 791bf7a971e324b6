"""Errors as HTTP answers: one JSON shape, one table from harombe's error kinds to statuses.

Every error answer of the ``/v1`` API is ``{"kind": ..., "message": ...}`` where the message
says how to fix the request. A user-code failure is not an error (200 with the result); a
policy refusal is 403; what a client sent wrong is 4xx; harombe's own infrastructure trouble is
502/503. Nothing a client can send is answered with 500.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from harombe import errors
from harombe.host_paths import scrub_host_paths

#: A harombe error class → HTTP status; the first class in an error's MRO found here wins.
STATUS_BY_ERROR: dict[type[errors.HarombeError], int] = {
    errors.SandboxNotFoundError: 404,
    errors.FileError: 400,
    errors.InvalidArgumentError: 400,
    errors.UsageError: 400,
    errors.PolicyError: 403,
    errors.PackageNotFoundError: 422,
    errors.PackageFetchError: 502,
    errors.InfrastructureError: 503,
    errors.ConfigError: 503,
    errors.HarombeError: 503,
}
_KINDS = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, errors.HarombeError)
}


class HTTPProblem(HTTPException):
    """Raised by a route to answer ``status`` with ``{"kind", "message"}`` (and headers).

    A Starlette ``HTTPException``, so FastAPI lets it through where it wraps other errors
    (reading a body)."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status, message, headers or {})
        self.status, self.kind, self.message = status, kind, message
        self.extra = extra or {}

    def response(self) -> JSONResponse:
        """The answer; this host's paths never reach a caller (:mod:`harombe.host_paths`)."""
        body = {"kind": self.kind, "message": scrub_host_paths(self.message), **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def status_for(err: errors.HarombeError | type[errors.HarombeError]) -> int:
    """The HTTP status of a harombe error (by class, never by message text)."""
    cls = err if isinstance(err, type) else type(err)
    for base in cls.__mro__:
        if base in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[base]
    return 503


def problem_from(err: errors.HarombeError) -> HTTPProblem:
    return HTTPProblem(status_for(err), err.kind, str(err))


def problem_in_result(result: dict[str, Any]) -> HTTPProblem | None:
    """The problem a failed tool result reports, or ``None`` when it is an answer (success,
    or code that ran and failed: those are 200 with the result)."""
    if result.get("success") or result.get("status") is not None:
        return None  # a run happened: its outcome, failed or lost, is the answer
    text = str(result.get("error") or "")
    kind, _, message = text.partition(": ")
    cls = _KINDS.get(kind)
    if cls is None:
        return None  # not a harombe error: the call ran and its failure is data
    # A guardrail refusal lists what it found, as the result did.
    extra = {"violations": list(result["violations"])} if result.get("violations") else None
    return HTTPProblem(status_for(cls), kind, message or text, extra=extra)

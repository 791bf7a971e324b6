"""Who may talk to the service at all, decided before a request's body is read.

Every path but the public ones (liveness, the API's description, the approvals page's static
files) needs a credential: a configured token, or the approval key. Without configured tokens the
service is for this machine only: the peer must be a loopback address **and** the ``Host``
header must name loopback, so a web page that rebinds its own host name to 127.0.0.1 (DNS
rebinding) is refused. Routes then check roles (:mod:`.deps`): a client runs code, an approver
decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from harombe.service.auth import Tenant, bearer, is_loopback, unauthorized
from harombe.service.problems import HTTPProblem
from harombe.service.state import Service

#: Paths answered without a credential.
PUBLIC = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                    "/approvals", "/approvals/app.js"})  # fmt: skip


def host_name(header: str | None) -> str | None:
    """The host part of a ``Host`` header as DNS reads it (``[::1]:8000`` → ``::1``,
    ``LocalHost.`` → ``localhost``); ``None`` when it is not one host and at most a port."""
    if not header:
        return None
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1 :] if end > 0 else "?"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None  # "[::1].attacker.example": not a bracketed address and a port
        return header[1:end]
    name, _, port = header.partition(":")
    if port and not port.isdigit():
        return None
    return name.lower().removesuffix(".") or None


@dataclass(frozen=True)
class Identity:
    """Who sent a request, decided once per request: the tenant of its token (the anonymous
    tenant without tokens; ``None`` for the approval key alone), and what it presented."""

    tenant: Tenant | None
    presented: str | None
    approval_key: bool


#: Where a request's :class:`Identity` is kept once decided (``scope["state"]``, which is
#: Starlette's ``request.state``).
_STATE_KEY = "harombe_identity"


def identify(service: Service, scope: Scope) -> Identity:
    """The request's :class:`Identity`, or the :class:`HTTPProblem` refusing it (401 without a
    known credential; 403 from off this machine, or by a non-loopback name, without tokens).
    Decided once per request (the gatekeeper's), then read back."""
    state = scope.setdefault("state", {})
    known = state.get(_STATE_KEY)
    if isinstance(known, Identity):
        return known
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
    presented = bearer(headers.get("authorization"))
    is_key = presented is not None and service.is_approval_key(presented)
    if not service.tokens.enabled:
        peer = (scope.get("client") or (None, None))[0]
        if not is_loopback(peer) or not is_loopback(host_name(headers.get("host"))):
            raise HTTPProblem(
                403,
                "Forbidden",
                "this service has no tokens configured, so it answers only this machine, "
                "addressed by a loopback name (127.0.0.1, localhost, [::1]); configure "
                "service.tokens to accept other callers",
            )
        tenant: Tenant | None = service.tokens.anonymous
    elif presented is None:
        raise unauthorized("a bearer token is required")
    else:
        tenant = service.tokens.lookup(presented)
        if tenant is None and not is_key:
            raise unauthorized("the bearer token is not known")
    identity = Identity(tenant, presented, is_key)
    state[_STATE_KEY] = identity
    return identity


class Gatekeeper:
    """ASGI middleware: :func:`identify` every non-public HTTP request before its body is
    read; a request it refuses never reaches a route."""

    def __init__(self, app: ASGIApp, *, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in PUBLIC:
            try:
                identify(self.service, scope)
            except HTTPProblem as problem:
                await problem.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

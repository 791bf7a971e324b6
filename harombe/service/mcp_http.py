"""The MCP server inside ``harombe serve``: streamable HTTP at ``/mcp``.

Who may call it is decided exactly as for ``/v1``: the gatekeeper refuses a request without a
known token (or, without configured tokens, one from off this machine) before its body is
read, and :class:`McpEndpoint` then refuses an approver's credential (it decides approvals and
runs nothing). Every call runs on behalf of the caller's tenant, with the tenant's limits:

* a sandbox belongs to the tenant that made it; another tenant's, or an unknown one, is
  ``SandboxNotFoundError``, as on ``/v1``;
* past ``max_sandboxes`` or ``max_concurrent_runs`` the call is a tool error saying so;
* every call is published to the audit feed (``tool.called``) as ``/v1`` calls are.

An MCP session is bound to the tenant that opened it: another credential presenting its id is
answered 404, as an unknown session. A tenant holds at most :data:`MAX_SESSIONS_PER_TENANT`
open sessions (429 past it), so one client cannot fill the server's session table; sessions
end when deleted or after the SDK's idle timeout (30 minutes). Calls the gate holds are asked
of the person at the client through elicitation when the client supports it; otherwise they
wait on the approvals page, as ``/v1`` calls do. With tokens configured, a client's own
elicitation answer approves nothing unless its token is marked ``human: true``: an agent
cannot approve itself, so its held calls wait on the approvals page (where only an approver
token or the approval key decides). Without tokens the one caller is this machine's user.

The SDK's session manager runs inside the app's lifespan (:meth:`McpEndpoint.running`): it
starts after the service and stops before the service removes its sandboxes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import structlog
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Message, Receive, Scope, Send

from harombe.service import deps
from harombe.service.approvals import current_tenant
from harombe.service.auth import Tenant
from harombe.service.gatekeeper import identify
from harombe.service.mcp import build_server
from harombe.service.mcp_approval import ElicitingApprover, current_asker
from harombe.service.problems import HTTPProblem
from harombe.service.state import Service
from harombe.tools import schemas
from harombe.tools.shapes import TEMPLATES, shaped

log = structlog.get_logger(__name__)

PATH = "/mcp"
#: Without tokens the service answers loopback names only; the SDK also checks Origin then.
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*",
                    "http://127.0.0.1", "http://localhost", "http://[::1]"]  # fmt: skip
#: Open MCP sessions one tenant may hold; past it a new one is refused (429) until one ends.
MAX_SESSIONS_PER_TENANT = 64


def client_tenant(service: Service, scope: Scope) -> Tenant:
    """The client tenant calling (identified by the gatekeeper); the :class:`HTTPProblem`
    refusing an approver's credential."""
    tenant = identify(service, scope).tenant
    if tenant is None or tenant.role == "approver":
        who = "the approval key" if tenant is None else f"token {tenant.name!r}"
        raise HTTPProblem(
            403,
            "Forbidden",
            f"{who} is an approver's: it decides approvals and runs nothing; connect to /mcp "
            "with a client token",
        )
    return tenant


def _refused(tool: str, kind: str, message: str, sandbox_id: object = None) -> dict[str, Any]:
    sid = sandbox_id if isinstance(sandbox_id, str) else None
    refused = {"success": False, "sandbox_id": sid, "error": f"{kind}: {message}"}
    return shaped(tool, refused) if tool in TEMPLATES else refused


class ServiceHost:
    """Runs MCP tool calls on the service's tools, for the calling tenant (module docstring)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, *, on_output: Any, request: Any
    ) -> dict[str, Any]:
        svc = self.service
        tenant = client_tenant(svc, request.scope)
        current_tenant.set(tenant.name)
        if svc.tokens.enabled and not tenant.human:
            # No self-approval: an agent's token answering its own elicitation would approve
            # its own call. Its held calls go to the approvals page instead.
            current_asker.set(None)
        sid = arguments.get("sandbox_id") if isinstance(arguments, Mapping) else None
        if isinstance(sid, str) and not svc.owned(tenant, sid):
            return _refused(
                name,
                "SandboxNotFoundError",
                f"{sid[:64]} does not exist, was destroyed, or is not yours; leave sandbox_id "
                "out of code_execute to create one",
                sid,
            )
        try:
            with self._slots(tenant, creates=name == "code_execute" and sid is None):
                result = await schemas.dispatch(svc.tools, name, arguments, on_output=on_output)
        except HTTPProblem as problem:
            return _refused(name, problem.kind, problem.message, sid)
        if name == "code_destroy_sandbox" and isinstance(sid, str) and result.get("success"):
            svc.disown(sid)
        svc.adopt(tenant, result)
        svc.feed.publish(deps.tool_event(name, tenant, result))
        return result

    @contextlib.contextmanager
    def _slots(self, tenant: Tenant, *, creates: bool) -> Iterator[None]:
        """One of the tenant's runs, and room for one more sandbox when the call makes one."""
        with contextlib.ExitStack() as stack:
            if creates:
                self.service.live(tenant)  # a sandbox lost meanwhile no longer counts
                stack.enter_context(tenant.creation_slot())
            stack.enter_context(tenant.run_slot())
            yield


class McpEndpoint:
    """The ASGI app at ``/mcp`` (module docstring). Building it makes the service's gate ask
    MCP clients by elicitation first (its approvals page stays the fallback), unless
    ``security.hitl.approver`` names another approver, which then decides every call."""

    def __init__(self, service: Service) -> None:
        self.service = service
        gate = service.gate
        if gate is not None and gate.approver is service.broker:
            who = (
                "a client whose token is marked human" if service.tokens.enabled else ("the client")
            )
            gate.approver = ElicitingApprover(fallback=gate.approver, who=who)
        security = None
        if not service.tokens.enabled:
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=LOOPBACK_HOSTS,
                allowed_origins=LOOPBACK_ORIGINS,
            )
        self.server = build_server(ServiceHost(service))
        self.sessions = StreamableHTTPSessionManager(app=self.server, security_settings=security)
        self._owners: dict[str, str] = {}  # MCP session id → the tenant that opened it
        self._opening: dict[str, int] = {}  # tenant → its requests that may open a session

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, for the app's lifespan."""
        async with self.sessions.run():
            log.info("mcp.started", transport="streamable-http", path=PATH)
            yield
        log.info("mcp.stopped", transport="streamable-http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            tenant = client_tenant(self.service, scope)
            session_id = _header(scope, MCP_SESSION_ID_HEADER)
            owner = self._owners.get(session_id) if session_id else None
            if owner is not None and owner != tenant.name:
                raise HTTPProblem(404, "NotFound", "no such MCP session; start a new one")
            if session_id is None:
                self._room_for_one_more(tenant)
        except HTTPProblem as problem:
            await problem.response()(scope, receive, send)
            return

        async def send_and_bind(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._bind(scope, message, tenant)
            await send(message)

        opening = session_id is None
        self._opening[tenant.name] = self._opening.get(tenant.name, 0) + opening
        try:
            await self.sessions.handle_request(scope, receive, send_and_bind)
        finally:
            self._opening[tenant.name] -= opening

    def _room_for_one_more(self, tenant: Tenant) -> None:
        """Forget sessions the SDK has ended (idle, crashed, deleted); the 429 refusing a new
        one when ``tenant`` holds (or is opening) its share of the session table."""
        live = self.sessions._server_instances  # the SDK's table of open sessions
        for ended in [sid for sid in self._owners if sid not in live]:
            del self._owners[ended]
        held = sum(owner == tenant.name for owner in self._owners.values())
        held += self._opening.get(tenant.name, 0)
        if held >= MAX_SESSIONS_PER_TENANT:
            raise HTTPProblem(
                429,
                "TooManySessions",
                f"{tenant.name} holds {held} open MCP sessions (the limit is "
                f"{MAX_SESSIONS_PER_TENANT}); end unused ones (an HTTP DELETE of /mcp with their "
                "mcp-session-id) or let them expire, and retry",
                headers={"Retry-After": "60"},
            )

    def _bind(self, scope: Scope, start: Message, tenant: Tenant) -> None:
        """Record who opened a session (the response that names a new id); forget a deleted
        one."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in start.get("headers") or []}  # fmt: skip
        minted = headers.get(MCP_SESSION_ID_HEADER)
        if minted and minted not in self._owners and start.get("status", 500) < 400:
            self._owners[minted] = tenant.name
        if scope.get("method") == "DELETE" and start.get("status", 500) < 300:
            self._owners.pop(_header(scope, MCP_SESSION_ID_HEADER) or "", None)


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    for key, value in scope.get("headers") or []:
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None

"""What each route needs first: the service, the calling tenant, an approver's credential,
and the audit feed's record of a tool call."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from harombe.service.approvals import current_tenant
from harombe.service.auth import Tenant, unauthorized
from harombe.service.gatekeeper import identify
from harombe.service.problems import HTTPProblem, problem_in_result
from harombe.service.state import Service

__all__ = ["approver", "caller", "problem_in_result", "service_of", "tool_event"]


def service_of(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


def caller(request: Request) -> Tenant:
    """The client tenant of this request (see :func:`.gatekeeper.identify`); 403 for an
    approver's credential, which decides approvals and runs nothing."""
    identity = identify(service_of(request), request.scope)
    tenant = identity.tenant
    if tenant is None or tenant.role == "approver":
        who = "the approval key" if tenant is None else f"token {tenant.name!r}"
        raise HTTPProblem(
            403,
            "Forbidden",
            f"{who} is an approver's: it decides approvals and runs nothing; call with a "
            "client token",
        )
    current_tenant.set(tenant.name)
    return tenant


def approver(request: Request) -> str:
    """The name of who may decide approvals: an approver token or the approval key."""
    identity = identify(service_of(request), request.scope)
    if identity.tenant is not None and identity.tenant.role == "approver":
        return identity.tenant.name
    if identity.approval_key:
        return "approvals_page"
    if identity.presented is None:
        raise unauthorized("deciding approvals needs an approver's credential")
    raise HTTPProblem(
        403,
        "Forbidden",
        "only an approver token or the service's approval key may decide approvals; a client "
        "token cannot approve calls",
    )


def tool_event(tool: str, tenant: Tenant, result: dict[str, Any]) -> dict[str, Any]:
    """The audit feed's record of one tool call: who, what, and how it ended (no code)."""
    approval = result.get("approval") or {}
    return {
        "type": "tool.called",
        "tool": tool,
        "tenant": tenant.name,
        "sandbox_id": result.get("sandbox_id"),
        "success": bool(result.get("success")),
        "status": result.get("status"),
        "exit_code": result.get("exit_code"),
        "approval": approval.get("status"),
        "risk": approval.get("risk"),
        "error": (str(result.get("error") or "").split(":", 1)[0] or None),
    }

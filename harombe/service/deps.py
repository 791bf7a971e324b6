"""What each route needs first: the service, the calling tenant, an approver's credential,
and the audit feed's record of a tool call."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from harombe.service.approvals import current_tenant
from harombe.service.auth import Tenant, bearer, unauthorized
from harombe.service.gatekeeper import refusal
from harombe.service.problems import HTTPProblem, problem_in_result
from harombe.service.state import Service

__all__ = ["approver", "caller", "problem_in_result", "service_of", "tool_event"]


def service_of(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


def caller(request: Request) -> Tenant:
    """The tenant of this request (401 without a valid token, when tokens are configured)."""
    svc = service_of(request)
    presented = bearer(request.headers.get("authorization"))
    if not svc.tokens.enabled:
        problem = refusal(svc, request.scope)  # the gatekeeper's check, again: routes alone
        if problem is not None:
            raise problem
        tenant = svc.tokens.anonymous
    else:
        found = svc.tokens.lookup(presented) if presented else None
        if found is None:
            raise unauthorized("a valid bearer token is required" if presented is None
                               else "the bearer token is not known")  # fmt: skip
        if found.role == "approver":
            raise HTTPProblem(
                403,
                "Forbidden",
                f"token {found.name!r} is an approver's: it decides approvals and runs nothing; "
                "call with a client token",
            )
        tenant = found
    current_tenant.set(tenant.name)
    return tenant


def approver(request: Request) -> str:
    """The name of who may decide approvals: an approver token or the approval key."""
    svc = service_of(request)
    presented = bearer(request.headers.get("authorization"))
    if presented is None:
        raise unauthorized("deciding approvals needs an approver's credential")
    tenant = svc.tokens.lookup(presented)
    if tenant is not None and tenant.role == "approver":
        return tenant.name
    if svc.is_approval_key(presented):
        return "approvals_page"
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

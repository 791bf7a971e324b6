"""Approvals for calls that come over MCP: ask the person at the client (elicitation).

:class:`ElicitingApprover` is the HITL gate's approver while the MCP server runs. For a call
whose client declared the ``elicitation`` capability (and whose connection can carry a request
back to it), it sends an ``elicitation/create`` form showing what the gate shows a terminal —
tool, sandbox, risk, reasons, the code with line numbers — with one field, ``decision``:

* ``approve`` runs the call once; ``approve_sandbox`` also approves the same findings for the
  rest of the sandbox's life (a new finding is asked about again);
* ``deny``, declining or dismissing the form, a client error, or no answer within the rule's
  timeout: denied, and nothing runs.

Any other call goes to the ``fallback`` approver (``harombe serve``'s approvals page), and
without one it is denied with a reason saying how to get approvals (fail closed). The MCP call
being served is known through :data:`current_asker`, set for the duration of each tool call.
"""

from __future__ import annotations

import contextvars
import inspect
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import structlog

from harombe.security.approval.approvers import render_request
from harombe.security.approval.gate import ApprovalRequest, ApprovalResponse, Approver
from harombe.tools.schemas import plain_json

log = structlog.get_logger(__name__)

NAME = "mcp_elicitation"
#: The elicitation form: one choice, denial the default.
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "approve: run it this once; approve_sandbox: also approve the same "
            "findings for the rest of this sandbox's life; deny: do not run it",
            "enum": ["approve", "approve_sandbox", "deny"],
            "default": "deny",
        }
    },
    "required": ["decision"],
}
#: Why a call is denied when nobody can be asked.
NOBODY_TO_ASK = (
    "nobody can be asked to approve this call: the MCP client did not declare the elicitation "
    "capability (or its connection cannot carry a request back to it); use a client that "
    "supports elicitation, serve MCP from `harombe serve` (its approvals page decides), name "
    "an approver callable in security.hitl.approver, or raise "
    "security.hitl.auto_approve_up_to (HAROMBE__SECURITY__HITL__AUTO_APPROVE_UP_TO=critical) "
    "if calls like this may run unasked"
)


@dataclass(frozen=True)
class Asker:
    """The MCP call being served: its session (the way back to the client) and request id."""

    session: Any  # mcp.server.session.ServerSession
    request_id: types.RequestId | None


#: Set while a tool call from an elicitation-capable client runs; ``None`` otherwise.
current_asker: contextvars.ContextVar[Asker | None] = contextvars.ContextVar(
    "harombe_mcp_asker", default=None
)


def can_elicit(session: Any) -> bool:
    """Whether ``session``'s client can be asked: it declared elicitation (form mode, which an
    empty ``elicitation: {}`` means too) and its connection can carry a request to it."""
    capabilities = getattr(session, "client_capabilities", None)
    elicitation = getattr(capabilities, "elicitation", None)
    if elicitation is None or not getattr(session, "can_send_request", False):
        return False
    return elicitation.form is not None or elicitation.url is None


def prompt(request: ApprovalRequest) -> str:
    """The text shown in the elicitation form (always encodable as UTF-8: a lone surrogate
    would fail the request to the client, and over stdio end the server)."""
    text = render_request(request).strip("\n")
    return (
        str(plain_json(text)) + f"\n\nAnswer within {request.timeout_s:g} s; no answer denies it."
    )


def answer_of(result: types.ElicitResult) -> ApprovalResponse:
    """The approval an elicitation result gives: only an accepted ``approve`` or
    ``approve_sandbox`` approves."""
    if result.action != "accept":
        verb = "declined" if result.action == "decline" else "dismissed"
        return ApprovalResponse(False, approver=NAME, comment=f"the user {verb} the request")
    decision = (result.content or {}).get("decision")
    if decision == "approve":
        return ApprovalResponse(True, approver=NAME)
    if decision == "approve_sandbox":
        return ApprovalResponse(True, scope="sandbox", approver=NAME)
    # The client's text, cut short: it goes into the result, the audit feed and the log.
    return ApprovalResponse(False, approver=NAME, comment=f"the user chose {repr(decision)[:80]}")


class ElicitingApprover:
    """The gate's approver under MCP; see the module docstring."""

    name = NAME

    def __init__(self, fallback: Approver | None = None, *, who: str = "the client") -> None:
        self.fallback = fallback
        #: Whose elicitation answers count, for the policy line.
        self.who = who

    @property
    def held_calls(self) -> str:
        """Where the policy line says held calls go."""
        rest = getattr(self.fallback, "held_calls", None) if self.fallback else "denied"
        rest = rest or "sent to the fallback approver"
        return f"asked through MCP elicitation when {self.who} supports it, else {rest}"

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse | bool:
        asker = current_asker.get()
        if asker is not None:
            result = await asker.session.elicit_form(
                prompt(request), DECISION_SCHEMA, related_request_id=asker.request_id
            )
            answer = answer_of(result)
            log.info("mcp.elicitation_answered", tool=request.operation.tool_name,
                     action=result.action, approved=answer.approved)  # fmt: skip
            return answer
        if self.fallback is None:
            return ApprovalResponse(False, approver="mcp", comment=NOBODY_TO_ASK)
        # The fallback (the approvals page's broker) is async; a sync one must answer at once.
        fallback: Any = self.fallback(request)
        if inspect.isawaitable(fallback):
            fallback = await fallback
        return fallback  # type: ignore[no-any-return]  # the gate checks what it is

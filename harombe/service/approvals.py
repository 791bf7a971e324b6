"""Approvals over HTTP: the gate's approver when the service has no terminal.

:class:`ApprovalBroker` is an async approver (see :class:`~harombe.security.approval.gate.
HITLGate`): each request it is asked about waits, as a pending approval, until a person decides
it — on the page at ``/approvals`` or with ``POST /v1/approvals/{id}`` — or until the rule's
timeout, when the gate denies it. Deciding needs an approver's credential (an ``approver``
token, or the service's approval key): a client token can list its own pending calls but never
decide them, so an agent cannot approve itself.

:class:`AuditFeed` keeps the last events (approvals asked, decided, expired; tool calls) and
hands them to live subscribers (the page's server-sent events); a subscriber that falls behind
is dropped rather than let memory grow.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from harombe.security.approval.gate import ApprovalRequest, ApprovalResponse

log = structlog.get_logger(__name__)

#: The tenant on whose behalf the current request runs (set by the service per request).
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "harombe_tenant", default=None
)
Decision = Literal["approve", "approve_sandbox", "deny"]
#: Characters of a parameter value shown on the page (code beyond is cut, with a marker).
MAX_SHOWN_CHARS = 20_000


class _Subscriber:
    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(size)
        self.dropped = False

    def offer(self, event: dict[str, Any] | None) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:  # too slow: it ends, and a reconnect reads `recent`
            self.dropped = True


class AuditFeed:
    """The last ``keep`` events, and live subscribers of new ones."""

    def __init__(self, *, keep: int = 200, subscriber_queue: int = 256) -> None:
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._subscribers: set[_Subscriber] = set()
        self._queue_size = subscriber_queue
        self._seq = 0
        self._closed = False

    def publish(self, event: dict[str, Any]) -> None:
        self._seq += 1
        event = {"seq": self._seq, "at": round(time.time(), 3), **event}
        self.recent.append(event)
        for subscriber in list(self._subscribers):
            subscriber.offer(event)
            if subscriber.dropped:
                self._subscribers.discard(subscriber)

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Recent events, then new ones as they come; ends when the subscriber falls behind
        or the feed closes."""
        subscriber = _Subscriber(self._queue_size)
        if self._closed:
            subscriber.offer(None)  # closed: the recent events, then the end
        else:
            self._subscribers.add(subscriber)
        try:
            for event in list(self.recent):
                yield event
            while not (subscriber.dropped and subscriber.queue.empty()):
                new = await subscriber.queue.get()
                if new is None:
                    return
                yield new
        finally:
            self._subscribers.discard(subscriber)

    def close(self) -> None:
        """End every subscriber's stream, and those of later followers (at shutdown)."""
        self._closed = True
        for subscriber in list(self._subscribers):
            subscriber.offer(None)
        self._subscribers.clear()


@dataclass
class Pending:
    """One held call: the gate's request, whose it is, and the answer once given."""

    approval_id: str
    request: ApprovalRequest
    tenant: str | None
    created_at: float
    answer: asyncio.Future[ApprovalResponse] = field(repr=False)

    def view(self) -> dict[str, Any]:
        """The approval as the page and ``GET /v1/approvals`` show it."""
        op = self.request.operation
        params = {key: _shown(value) for key, value in op.params.items()}
        return {
            "id": self.approval_id,
            "tool": op.tool_name,
            "sandbox_id": op.sandbox_id,
            "tenant": self.tenant,
            "risk": str(self.request.risk),
            "reasons": [
                {**reason.to_dict(), "text": str(reason)} for reason in self.request.reasons
            ],
            "params": params,
            "timeout_s": self.request.timeout_s,
            "created_at": round(self.created_at, 3),
            "expires_at": round(self.created_at + self.request.timeout_s, 3),
        }


def _shown(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS:
        return value[:MAX_SHOWN_CHARS] + f"\n… ({len(value) - MAX_SHOWN_CHARS} more characters)"
    return value


class ApprovalBroker:
    """The gate's approver: holds each request until it is decided (see the module doc)."""

    name = "approvals_page"

    def __init__(self, feed: AuditFeed, *, url: str | None = None) -> None:
        self.feed = feed
        #: The page's address, for the start-up policy line (``harombe serve`` sets it).
        self.url = url
        self._pending: dict[str, Pending] = {}
        self._closed: str | None = None

    @property
    def held_calls(self) -> str:
        """Where the policy line says held calls go."""
        return f"held on {self.url or 'the approvals page'} and denied after the rule's timeout"

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        if self._closed is not None:  # shutting down: nobody will come to decide it
            return ApprovalResponse(False, approver=self.name, comment=self._closed)
        answer: asyncio.Future[ApprovalResponse] = asyncio.get_running_loop().create_future()
        pending = Pending(secrets.token_hex(8), request, current_tenant.get(), time.time(), answer)
        self._pending[pending.approval_id] = pending
        self.feed.publish({"type": "approval.requested", "approval": pending.view()})
        log.info(
            "approval.requested",
            approval_id=pending.approval_id,
            tool=request.operation.tool_name,
            risk=str(request.risk),
            tenant=pending.tenant,
        )
        try:
            return await answer
        finally:
            self._pending.pop(pending.approval_id, None)
            # The gate's timeout (or the caller going away) cancels the wait, and the future
            # with it: undecided.
            if answer.cancelled() or not answer.done():
                answer.cancel()
                self.feed.publish({"type": "approval.expired", "id": pending.approval_id})
                log.info("approval.expired", approval_id=pending.approval_id)

    def deny_all(self, why: str) -> int:
        """Deny every held approval, and every later request, with ``why`` (at shutdown);
        how many were held."""
        self._closed = why
        held = [p for p in self._pending.values() if not p.answer.done()]
        for pending in held:
            pending.answer.set_result(ApprovalResponse(False, approver=self.name, comment=why))
        return len(held)

    def pending(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Held approvals, oldest first; only ``tenant``'s when given."""
        held = sorted(self._pending.values(), key=lambda p: p.created_at)
        return [p.view() for p in held if tenant is None or p.tenant == tenant]

    def get(self, approval_id: str, tenant: str | None = None) -> dict[str, Any] | None:
        held = self._pending.get(approval_id)
        if held is None or (tenant is not None and held.tenant != tenant):
            return None
        return held.view()

    def decide(
        self, approval_id: str, decision: Decision, *, by: str, comment: str | None = None
    ) -> dict[str, Any] | None:
        """Answer a held approval; ``None`` when it is not (or no longer) held."""
        held = self._pending.get(approval_id)
        if held is None or held.answer.done():
            return None
        approved = decision != "deny"
        scope: Literal["once", "sandbox"] = "sandbox" if decision == "approve_sandbox" else "once"
        held.answer.set_result(ApprovalResponse(approved, scope, approver=by, comment=comment))
        event = {"type": "approval.decided", "id": approval_id, "decision": decision, "by": by}
        self.feed.publish(event)
        log.info("approval.decided", approval_id=approval_id, decision=decision, by=by)
        return {**held.view(), "decision": decision, "decided_by": by}

"""What an approver is asked and what it answers: the contract between the HITL gate
(:mod:`harombe.security.approval.gate`, which re-exports these) and every approver."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from harombe.security.policy.rules import Operation, Reason, RiskLevel


@dataclass(frozen=True)
class ApprovalRequest:
    """What an approver is shown: the operation, its risk, why, and how long it has."""

    operation: Operation
    risk: RiskLevel
    reasons: tuple[Reason, ...]
    timeout_s: float


@dataclass(frozen=True)
class ApprovalResponse:
    """An approver's answer. ``scope="sandbox"`` approves the same findings (each reason's
    :attr:`Reason.grant_key`) for the rest of the sandbox's life, never a new one;
    ``approver`` names who answered (for the audit log)."""

    approved: bool
    scope: Literal["once", "sandbox"] = "once"
    approver: str | None = None
    comment: str | None = None


#: Any callable taking an :class:`ApprovalRequest` and returning (or resolving to) a bool or
#: an :class:`ApprovalResponse`. Sync callables run in a worker thread, so one that blocks (on
#: a terminal, a queue, a web request) does not stall the event loop.
Approver: TypeAlias = Callable[
    [ApprovalRequest], "bool | ApprovalResponse | Awaitable[bool | ApprovalResponse]"
]

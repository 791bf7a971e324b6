"""Human-in-the-loop gate: classify an operation's risk, then ask an injected approver.

Two halves, kept apart on purpose:

* **Policy** (:class:`HITLRule`, :class:`RiskClassifier`) is pure: given an :class:`Operation` it
  says which rules match, the resulting :class:`RiskLevel` (the highest matching rule wins), the
  approval timeout and the reasons. No I/O, no clock. It lives in
  :mod:`harombe.security.policy` and is re-exported here.
* **Decision** (:class:`HITLGate`) turns that into an :class:`ApprovalDecision`: auto-approve
  calls at or below the gate's automatic level (``auto_approve_up_to``) and rules that need no
  approval, reuse an "approve for this sandbox" grant (which covers the same findings only,
  see :attr:`Reason.grant_key`), or call the approver and wait at most the rule's timeout.
  Silence is a denial (``TIMEOUT``); so is a failing approver. A gate made without an
  approver asks on the terminal when stdin is one (a
  :class:`~harombe.security.approval.approvers.TerminalApprover`) and otherwise denies at
  once, saying how to get approvals. :mod:`harombe.security.approval.approvers` has the
  ready-made approvers; :func:`gate_from_config` picks the one ``security.hitl.approver``
  names.

Every decision is logged once as ``hitl.decided`` with the tool, risk, reasons, decision, who
decided and how long it took.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from harombe.errors import ApprovalDeniedError
from harombe.security.approval.approvers import (
    TerminalApprover,
    approver_from_config,
    stdin_is_tty,
)
from harombe.security.approval.request import ApprovalRequest, ApprovalResponse, Approver
from harombe.security.policy.classifier import Assessment, RiskClassifier
from harombe.security.policy.risk_table import get_sandbox_hitl_rules
from harombe.security.policy.rules import (
    CONDITION_OPERATORS,
    DEFAULT_TIMEOUTS_S,
    Check,
    GrantKey,
    HITLRule,
    Operation,
    Reason,
    RiskLevel,
)

log = structlog.get_logger(__name__)

__all__ = [
    "CONDITION_OPERATORS", "DEFAULT_TIMEOUTS_S", "ApprovalDecision", "ApprovalRequest",
    "ApprovalResponse", "ApprovalStatus", "Approver", "Assessment", "Check", "GrantKey",
    "HITLGate", "HITLRule", "Operation", "Reason", "RiskClassifier", "RiskLevel",
    "gate_from_config",
]  # fmt: skip


class ApprovalStatus(enum.StrEnum):
    APPROVED = "approved"
    DENIED = "denied"
    TIMEOUT = "timeout"
    AUTO_APPROVED = "auto_approved"


@dataclass(frozen=True)
class ApprovalDecision:
    """The gate's verdict on one operation; ``approved`` is True for APPROVED and AUTO_APPROVED."""

    status: ApprovalStatus
    operation: Operation
    risk: RiskLevel
    reasons: tuple[Reason, ...]
    decided_by: str
    latency_s: float
    timeout_s: float
    scope: Literal["once", "sandbox"] = "once"
    comment: str | None = None
    rule_ids: frozenset[int] = frozenset()
    grant_keys: frozenset[GrantKey] = frozenset()

    @property
    def approved(self) -> bool:
        return self.status in (ApprovalStatus.APPROVED, ApprovalStatus.AUTO_APPROVED)

    def summary(self) -> dict[str, Any]:
        """The decision as plain data, for tool results and logs."""
        return {
            "status": self.status.value,
            "risk": str(self.risk),
            "decided_by": self.decided_by,
            "reasons": [str(r) for r in self.reasons],
            "comment": self.comment,
        }

    def error(self) -> ApprovalDeniedError:
        """The error a refused operation reports: the denial, the risk and the reasons."""
        why = {
            ApprovalStatus.TIMEOUT: f"no answer within {self.timeout_s:g} s, so it was denied",
            ApprovalStatus.DENIED: f"denied by {self.decided_by}",
        }.get(self.status, self.status.value)
        reasons = "; ".join(str(r) for r in self.reasons)
        comment = f" ({self.comment})" if self.comment else ""
        return ApprovalDeniedError(
            f"{self.operation.tool_name} needs approval at risk {self.risk}: {why}{comment}. "
            f"Reasons: {reasons}"
        )


@dataclass(frozen=True)
class _Verdict:
    """How an operation was decided, before it becomes an :class:`ApprovalDecision`;
    ``remember``: an approver's ``scope="sandbox"`` answer, to apply to the sandbox."""

    status: ApprovalStatus
    by: str
    comment: str | None = None
    scope: Literal["once", "sandbox"] = "once"
    remember: bool = False


def _shown(assessment: Assessment) -> tuple[Reason, ...]:
    """What an approver is shown: every finding, at every level (the deciding ones first)."""
    return assessment.findings or assessment.reasons


def _granted(assessment: Assessment) -> frozenset[GrantKey]:
    """What an "approve for this sandbox" answer grants: the findings the approver was shown,
    and only those (never a key computed apart from what was displayed)."""
    return frozenset(r.grant_key for r in _shown(assessment)) & assessment.grant_keys


def _name_of(approver: object) -> str:
    return str(getattr(approver, "name", None) or getattr(approver, "__name__", None)
               or type(approver).__name__)  # fmt: skip


def auto_level(value: RiskLevel | str | None) -> RiskLevel | None:
    """An automatic level as the gate holds it: ``"none"`` (or ``None``) is no level."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    return RiskLevel.parse(value)


class HITLGate:
    """Decides whether an operation may run; see the module docstring for the order of checks.

    ``auto_approve_up_to``: the highest risk approved without asking (``"none"``: nothing).
    Left out, it is the guide's classic LOW, or nothing when ``auto_approve_low_risk`` is
    false; :func:`gate_from_config` passes the config's level (HIGH by default).

    Without an ``approver`` an operation that needs a human is asked on the terminal when
    stdin is one, and otherwise denied at once (fail closed) with a comment saying what to do.
    """

    def __init__(
        self,
        classifier: RiskClassifier | None = None,
        approver: Approver | None = None,
        *,
        auto_approve_low_risk: bool = True,
        auto_approve_up_to: RiskLevel | str | None = None,
    ) -> None:
        self.classifier = classifier or RiskClassifier()
        self.approver = approver
        self.auto_approve_low_risk = auto_approve_low_risk
        self.auto_approve_up_to: RiskLevel | None = (
            auto_level(auto_approve_up_to)
            if auto_approve_up_to is not None
            else (RiskLevel.LOW if auto_approve_low_risk else None)
        )
        self._grants: dict[str, set[GrantKey]] = {}
        self._terminal: Approver | None = None

    async def check_approval(self, op: Operation) -> ApprovalDecision:
        """The decision on ``op``, in the order of the module docstring; logged once as
        ``hitl.decided``. Never raises for a broken rule or approver: those deny."""
        started = time.monotonic()
        if not op.operation_id:
            op = dataclasses.replace(op, operation_id=uuid.uuid4().hex[:12])
        try:
            assessment = self.classifier.assess(op)
        except Exception as exc:  # noqa: BLE001 - a broken custom rule must deny, not crash
            reason = Reason("the classifier failed", RiskLevel.CRITICAL, repr(exc))
            assessment = Assessment(RiskLevel.CRITICAL, True, 0.0, (reason,), frozenset())
            comment = "fix the rule whose check raised; operations are denied until then"
            verdict: _Verdict | None = _Verdict(ApprovalStatus.DENIED, "classifier_error", comment)
        else:
            verdict = self._without_asking(op, assessment)
        if verdict is None:
            verdict = await self._ask_approver(op, assessment)
        decision = ApprovalDecision(
            verdict.status, op, assessment.risk, assessment.reasons, verdict.by,
            round(time.monotonic() - started, 4), assessment.timeout_s, verdict.scope,
            verdict.comment, assessment.rule_ids, _granted(assessment),
        )  # fmt: skip
        log.info(
            "hitl.decided",
            operation_id=op.operation_id,
            tool=op.tool_name,
            sandbox_id=op.sandbox_id,
            risk=str(decision.risk),
            reasons=[str(r) for r in decision.reasons],
            decision=decision.status.value,
            decided_by=decision.decided_by,
            scope=decision.scope,
            latency_s=decision.latency_s,
            timeout_s=decision.timeout_s,
        )
        if verdict.remember and op.sandbox_id:
            self.remember(decision, op.sandbox_id)
        return decision

    def _without_asking(self, op: Operation, assessment: Assessment) -> _Verdict | None:
        """The verdict when no approver needs asking (rule, automatic level, grant, nobody to
        ask), else None."""
        if not assessment.require_approval:
            return _Verdict(ApprovalStatus.AUTO_APPROVED, "rule")
        level = self.auto_approve_up_to
        if level is not None and assessment.risk <= level:
            by = "auto_approve_low_risk" if level == RiskLevel.LOW else "auto_approve_up_to"
            return _Verdict(ApprovalStatus.AUTO_APPROVED, by)
        granted = self._grants.get(op.sandbox_id, set()) if op.sandbox_id else set()
        # Covered only if every finding of this call was among those approved: a new
        # construct, a new target or a new rule is asked about again.
        if assessment.grant_keys and assessment.grant_keys <= granted:
            return _Verdict(ApprovalStatus.APPROVED, "sandbox_grant", scope="sandbox")
        if self._approver() is None:
            return _Verdict(
                ApprovalStatus.DENIED,
                "no_approver",
                "no approver is configured and stdin is not a terminal to ask on; pass "
                "approver= to HITLGate, e.g. harombe.security.approval.approvers."
                "TerminalApprover(), or run from a terminal",
            )
        return None

    def _approver(self) -> Approver | None:
        """The approver to ask: the one given, else a terminal when stdin is one."""
        if self.approver is not None:
            return self.approver
        if self._terminal is None and stdin_is_tty():
            self._terminal = TerminalApprover()
        return self._terminal

    async def _ask_approver(self, op: Operation, assessment: Assessment) -> _Verdict:
        """Ask the approver, waiting at most the rule's timeout; only a True answer approves."""
        request = ApprovalRequest(op, assessment.risk, _shown(assessment), assessment.timeout_s)
        name = _name_of(self._approver())
        try:
            answer = await asyncio.wait_for(self._ask(request), assessment.timeout_s)
        except TimeoutError:
            return _Verdict(ApprovalStatus.TIMEOUT, "timeout")
        except Exception as exc:  # noqa: BLE001 - a broken approver must deny, not crash
            return _Verdict(ApprovalStatus.DENIED, name, f"the approver failed: {exc!r}")
        if isinstance(answer, bool):
            answer = ApprovalResponse(answer)
        if not isinstance(answer, ApprovalResponse):
            fix = f"the approver returned {answer!r}; return a bool or an ApprovalResponse"
            return _Verdict(ApprovalStatus.DENIED, name, fix)
        by = answer.approver if isinstance(answer.approver, str) and answer.approver else name
        if answer.approved is not True:
            # Only True approves: "no", 1 or a truthy object is not a yes.
            comment = (
                answer.comment
                if answer.approved is False
                else f"approved={answer.approved!r} is not True, so it was denied"
            )
            return _Verdict(ApprovalStatus.DENIED, by, comment)
        scope: Literal["once", "sandbox"] = "sandbox" if answer.scope == "sandbox" else "once"
        return _Verdict(ApprovalStatus.APPROVED, by, answer.comment, scope, remember=True)

    async def _ask(self, request: ApprovalRequest) -> object:
        try:
            return await self._call_approver(request)
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised by the approver, not by the process: asyncio would stop the event loop
            # for it, so it becomes an ordinary failure, which denies.
            raise RuntimeError(f"the approver raised {exc!r}") from exc

    async def _call_approver(self, request: ApprovalRequest) -> object:
        approver = self._approver()
        assert approver is not None
        call = getattr(approver, "__call__", approver)  # noqa: B004 - callable instances
        if inspect.iscoroutinefunction(approver) or inspect.iscoroutinefunction(call):
            result: object = approver(request)
        else:
            result = await asyncio.to_thread(approver, request)
        if inspect.isawaitable(result):
            result = await result
        return result

    def remember(self, decision: ApprovalDecision, sandbox_id: str) -> None:
        """Apply a ``scope="sandbox"`` approval to ``sandbox_id`` (e.g. one just created):
        later calls there whose findings are all among ``decision.grant_keys`` are approved."""
        if decision.approved and decision.scope == "sandbox":
            self._grants.setdefault(sandbox_id, set()).update(decision.grant_keys)

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Drop every grant of ``sandbox_id``; call it when the sandbox is destroyed, lost or
        replaced (a replacement has a new id and starts with none). Idempotent."""
        if self._grants.pop(sandbox_id, None) is not None:
            log.info("hitl.grants_dropped", sandbox_id=sandbox_id)

    def grants(self, sandbox_id: str) -> frozenset[GrantKey]:
        """The findings approved for ``sandbox_id`` (empty when none)."""
        return frozenset(self._grants.get(sandbox_id, ()))


class _FromConfig:
    def __repr__(self) -> str:
        return "FROM_CONFIG"


#: The default ``gate`` of surfaces that take one (the tools, ``run_sandboxed``): the gate
#: the configuration describes, as :func:`gate_from_config` builds it. ``None`` means no gate.
FROM_CONFIG: Any = _FromConfig()


def gate_from_config(
    config: Any, approver: Approver | None = None, *, surface_approver: Approver | None = None
) -> HITLGate | None:
    """The gate ``config.security.hitl`` describes (default rules plus its ``rules``, its
    automatic level), or ``None`` when ``hitl.enabled`` is false. ``config`` is a
    :class:`~harombe.config.HarombeConfig`.

    Who is asked: ``approver`` when given (the caller's choice wins); else the one
    ``security.hitl.approver`` names when it is not ``auto``; else ``surface_approver`` (the
    person a surface can reach: the approvals page, MCP elicitation); else a terminal when
    stdin is one, and otherwise an approver that denies at once, saying how to get approvals
    (see :func:`~harombe.security.approval.approvers.approver_from_config`). A bad dotted path
    is a :class:`~harombe.errors.ConfigError`."""
    hitl = config.security.hitl
    if not hitl.enabled:
        return None
    rules = get_sandbox_hitl_rules()
    rules += [HITLRule(**rule.model_dump()) for rule in hitl.rules]
    chosen = approver or approver_from_config(hitl, surface=surface_approver)
    return HITLGate(
        RiskClassifier(rules),
        chosen,
        auto_approve_low_risk=hitl.auto_approve_low_risk,
        auto_approve_up_to=hitl.auto_level,
    )

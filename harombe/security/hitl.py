"""Human-in-the-loop gate: classify an operation's risk, then ask an injected approver.

Two halves, kept apart on purpose:

* **Policy** (:class:`HITLRule`, :class:`RiskClassifier`) is pure: given an :class:`Operation` it
  says which rules match, the resulting :class:`RiskLevel` (the highest matching rule wins), the
  approval timeout and the reasons. No I/O, no clock.
* **Decision** (:class:`HITLGate`) turns that into an :class:`ApprovalDecision`: auto-approve
  LOW (when configured) and rules that need no approval, reuse an "approve for this sandbox"
  grant (which covers the same findings only, see :attr:`Reason.grant_key`), or call the
  approver and wait at most the rule's timeout. Silence is a denial (``TIMEOUT``); so is a
  missing or failing approver. The gate never prompts a terminal itself:
  :mod:`harombe.security.approvers` has ready-made approvers, including one that does.

Every decision is logged once as ``hitl.decided`` with the tool, risk, reasons, decision, who
decided and how long it took.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import structlog

from harombe.errors import ApprovalDeniedError, ConfigError

log = structlog.get_logger(__name__)


class RiskLevel(enum.IntEnum):
    """How much harm an operation could do; ordered, so ``max()`` picks the worst."""

    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, value: RiskLevel | str) -> RiskLevel:
        """``RiskLevel.HIGH``, ``"high"`` and ``"HIGH"`` are all HIGH."""
        if isinstance(value, RiskLevel):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        names = ", ".join(name.lower() for name in cls.__members__)
        raise ConfigError(f"unknown risk level {value!r}: use one of {names}")


#: Approval timeouts when a rule does not set its own, seconds (the usage guide's table).
DEFAULT_TIMEOUTS_S: dict[RiskLevel, float] = {
    RiskLevel.CRITICAL: 30.0,
    RiskLevel.HIGH: 60.0,
    RiskLevel.MEDIUM: 120.0,
    RiskLevel.LOW: 120.0,
}
CONDITION_OPERATORS = ("matches", "equals", "in", "not_in")


@dataclass(frozen=True)
class Operation:
    """One tool call about to happen: the tool's name and the parameters it was called with."""

    tool_name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    operation_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def sandbox_id(self) -> str | None:
        value = self.params.get("sandbox_id")
        return value if isinstance(value, str) else None


#: What an "approve for this sandbox" grant covers: (rule, construct, detail) of one reason.
GrantKey: TypeAlias = tuple[str, "str | None", "str | None"]


@dataclass(frozen=True)
class Reason:
    """Why a rule matched: the rule, and where known the construct, its description and line."""

    rule: str
    risk: RiskLevel
    detail: str | None = None
    line: int | None = None
    construct: str | None = None

    @property
    def grant_key(self) -> GrantKey:
        """The finding's identity, without its line: the same call moved to another line is
        the same finding; another construct, or the same one on other targets (``rm -rf /x``
        vs ``rm -rf /y``), is not."""
        return (self.rule, self.construct, self.detail)

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{self.rule} — {where}{self.detail}" if self.detail else self.rule

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "risk": str(self.risk), "detail": self.detail, "line": self.line}


#: A rule's programmatic test: the findings (anything with ``detail`` and ``line``) that make
#: the rule match; an empty result means it does not.
Check: TypeAlias = Callable[["Operation"], Sequence[Any]]


@dataclass
class HITLRule:
    """Operations on ``tools`` whose ``conditions`` all hold (and whose ``check``, if any,
    finds something) are at least ``risk``.

    A condition is ``{"param": name, OP: value}`` with OP one of ``matches`` (a regular
    expression searched anywhere in the value, so a call on line 5 counts), ``equals``, ``in``
    or ``not_in``. A missing parameter never satisfies a condition. ``tools=["*"]`` matches every
    tool. ``timeout`` is the approval timeout in seconds; ``None`` takes the level's default.
    """

    tools: list[str]
    risk: RiskLevel
    require_approval: bool = True
    timeout: float | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""
    check: Check | None = None
    _patterns: dict[int, re.Pattern[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"HITL rule {self.description or self.tools!r}"
        if isinstance(self.tools, str) or not all(isinstance(t, str) for t in self.tools):
            raise ConfigError(f"{where}: tools must be a list of tool names, e.g. ['code_execute']")
        if not self.tools:
            raise ConfigError(f"{where}: tools is empty; name the tools, or use ['*'] for all")
        self.risk = RiskLevel.parse(self.risk)
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"{where}: timeout must be a positive number of seconds")
        for index, condition in enumerate(self.conditions):
            ops = [op for op in CONDITION_OPERATORS if op in condition]
            extra = set(condition) - {"param", *CONDITION_OPERATORS}
            if not isinstance(condition.get("param"), str) or len(ops) != 1 or extra:
                raise ConfigError(
                    f"{where}: condition {condition!r} must be {{'param': NAME, OP: VALUE}} with "
                    f"exactly one OP of {', '.join(CONDITION_OPERATORS)}"
                )
            if ops[0] == "matches":
                try:
                    self._patterns[index] = re.compile(condition["matches"])
                except (re.error, TypeError) as exc:
                    raise ConfigError(
                        f"{where}: bad regular expression in {condition!r}: {exc}"
                    ) from None
            if ops[0] in ("in", "not_in") and not isinstance(condition[ops[0]], list | tuple):
                raise ConfigError(f"{where}: {ops[0]!r} needs a list of values in {condition!r}")

    @property
    def name(self) -> str:
        return self.description or f"{'/'.join(self.tools)} at {self.risk}"

    def applies_to(self, tool_name: str) -> bool:
        return "*" in self.tools or tool_name in self.tools

    def evaluate(self, op: Operation) -> list[Reason] | None:
        """The reasons this rule matches ``op``, or ``None`` when it does not."""
        if not self.applies_to(op.tool_name):
            return None
        details: list[Reason] = []
        for index, condition in enumerate(self.conditions):
            if condition["param"] not in op.params:
                return None
            value = op.params[condition["param"]]
            if "matches" in condition:
                text = value if isinstance(value, str) else repr(value)
                found = self._patterns[index].search(text)
                if not found:
                    return None
                line = text.count("\n", 0, found.start()) + 1
                detail = f"{condition['param']} matches {condition['matches']!r}"
                details.append(Reason(self.name, self.risk, detail, line))
            elif not _holds(condition, value):
                return None
        if self.check is not None:
            findings = self.check(op)
            if not findings:
                return None
            details += [
                Reason(self.name, self.risk, getattr(f, "detail", str(f)),
                       getattr(f, "line", None), getattr(f, "construct", None))
                for f in findings
            ]  # fmt: skip
        return details or [Reason(self.name, self.risk)]


def _holds(condition: Mapping[str, Any], value: object) -> bool:
    """An ``equals`` / ``in`` / ``not_in`` condition on ``value``."""
    if "equals" in condition:
        return bool(value == condition["equals"])
    if "in" in condition:
        return value in condition["in"]
    return value not in condition["not_in"]


@dataclass(frozen=True)
class Assessment:
    """What the classifier concluded about one operation."""

    risk: RiskLevel
    require_approval: bool
    timeout_s: float
    reasons: tuple[Reason, ...]
    rule_ids: frozenset[int]  # indices of the deciding rules
    #: Every matching reason's :attr:`Reason.grant_key`, at every level: what an "approve for
    #: this sandbox" answer grants, and what a later call must be wholly covered by.
    grant_keys: frozenset[GrantKey] = frozenset()


class RiskClassifier:
    """Pure rule evaluation. With no ``rules``, the usage guide's sandbox rules are used.

    The highest risk among matching rules wins. An operation no rule matches is ``default_risk``
    (HIGH: an unknown operation is not harmless). Approval is required unless every deciding
    rule says ``require_approval=False``; the timeout is the shortest a deciding rule sets.
    """

    def __init__(
        self, rules: Sequence[HITLRule] | None = None, *, default_risk: RiskLevel = RiskLevel.HIGH
    ) -> None:
        if rules is None:
            from harombe.security.sandbox_risk import get_sandbox_hitl_rules

            rules = get_sandbox_hitl_rules()
        self.rules = list(rules)
        self.default_risk = RiskLevel.parse(default_risk)

    def assess(self, op: Operation) -> Assessment:
        matched = [(i, r, reasons) for i, r in enumerate(self.rules) if (reasons := r.evaluate(op))]
        if not matched:
            reason = Reason(
                f"no rule matches tool {op.tool_name!r}; unmatched operations are "
                f"{self.default_risk}",
                self.default_risk,
            )
            # No grant keys: an operation no rule knows is asked about every time.
            return Assessment(
                self.default_risk, True, DEFAULT_TIMEOUTS_S[self.default_risk], (reason,),
                frozenset(),
            )  # fmt: skip
        risk = max(rule.risk for _, rule, _ in matched)
        deciding = [(i, rule, reasons) for i, rule, reasons in matched if rule.risk == risk]
        timeouts = [rule.timeout for _, rule, _ in deciding if rule.timeout is not None]
        return Assessment(
            risk=risk,
            require_approval=any(rule.require_approval for _, rule, _ in deciding),
            timeout_s=min(timeouts) if timeouts else DEFAULT_TIMEOUTS_S[risk],
            reasons=tuple(reason for _, _, reasons in deciding for reason in reasons),
            rule_ids=frozenset(i for i, _, _ in deciding),
            grant_keys=frozenset(
                reason.grant_key for _, _, reasons in matched for reason in reasons
            ),
        )

    def classify(self, op: Operation) -> RiskLevel:
        return self.assess(op).risk

    def requires_approval(self, op: Operation) -> bool:
        """False only when every deciding rule says ``require_approval=False`` (the default
        rules say so for ``code_destroy_sandbox``)."""
        return self.assess(op).require_approval

    def get_timeout(self, op: Operation) -> float:
        """Seconds to wait for an answer before the operation is denied."""
        return self.assess(op).timeout_s


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


def _name_of(approver: object) -> str:
    return str(getattr(approver, "name", None) or getattr(approver, "__name__", None)
               or type(approver).__name__)  # fmt: skip


class HITLGate:
    """Decides whether an operation may run; see the module docstring for the order of checks.

    Without an ``approver`` every operation that needs a human is denied (fail closed), with a
    comment saying to pass one.
    """

    def __init__(
        self,
        classifier: RiskClassifier | None = None,
        approver: Approver | None = None,
        *,
        auto_approve_low_risk: bool = True,
    ) -> None:
        self.classifier = classifier or RiskClassifier()
        self.approver = approver
        self.auto_approve_low_risk = auto_approve_low_risk
        self._grants: dict[str, set[GrantKey]] = {}

    async def check_approval(self, op: Operation) -> ApprovalDecision:
        started = time.monotonic()
        classifier_failed = False
        try:
            assessment = self.classifier.assess(op)
        except Exception as exc:  # noqa: BLE001 - a broken custom rule must deny, not crash
            reason = Reason("the classifier failed", RiskLevel.CRITICAL, repr(exc))
            assessment = Assessment(RiskLevel.CRITICAL, True, 0.0, (reason,), frozenset())
            classifier_failed = True

        def decide(
            status: ApprovalStatus, by: str, *, comment: str | None = None, scope: str = "once"
        ) -> ApprovalDecision:
            decision = ApprovalDecision(
                status, op, assessment.risk, assessment.reasons, by,
                round(time.monotonic() - started, 4), assessment.timeout_s,
                "sandbox" if scope == "sandbox" else "once", comment, assessment.rule_ids,
                assessment.grant_keys,
            )  # fmt: skip
            log.info(
                "hitl.decided",
                operation_id=op.operation_id,
                tool=op.tool_name,
                sandbox_id=op.sandbox_id,
                risk=str(decision.risk),
                reasons=[str(r) for r in decision.reasons],
                decision=status.value,
                decided_by=by,
                scope=decision.scope,
                latency_s=decision.latency_s,
                timeout_s=decision.timeout_s,
            )
            return decision

        if classifier_failed:
            return decide(
                ApprovalStatus.DENIED,
                "classifier_error",
                comment="fix the rule whose check raised; operations are denied until then",
            )
        if not assessment.require_approval:
            return decide(ApprovalStatus.AUTO_APPROVED, "rule")
        if assessment.risk == RiskLevel.LOW and self.auto_approve_low_risk:
            return decide(ApprovalStatus.AUTO_APPROVED, "auto_approve_low_risk")
        sandbox_id = op.sandbox_id
        granted = self._grants.get(sandbox_id, set()) if sandbox_id else set()
        # Covered only if every finding of this call was among those approved: a new
        # construct, a new target or a new rule is asked about again.
        if assessment.grant_keys and assessment.grant_keys <= granted:
            return decide(ApprovalStatus.APPROVED, "sandbox_grant", scope="sandbox")
        if self.approver is None:
            return decide(
                ApprovalStatus.DENIED,
                "no_approver",
                comment="no approver is configured; pass approver= to HITLGate, "
                "e.g. harombe.security.approvers.TerminalApprover()",
            )
        request = ApprovalRequest(op, assessment.risk, assessment.reasons, assessment.timeout_s)
        name = _name_of(self.approver)
        try:
            answer = await asyncio.wait_for(self._ask(request), assessment.timeout_s)
        except TimeoutError:
            return decide(ApprovalStatus.TIMEOUT, "timeout")
        except Exception as exc:  # noqa: BLE001 - a broken approver must deny, not crash
            return decide(ApprovalStatus.DENIED, name, comment=f"the approver failed: {exc!r}")
        if isinstance(answer, bool):
            answer = ApprovalResponse(answer)
        if not isinstance(answer, ApprovalResponse):
            return decide(
                ApprovalStatus.DENIED,
                name,
                comment=f"the approver returned {answer!r}; return a bool or an ApprovalResponse",
            )
        by = answer.approver or name
        if not answer.approved:
            return decide(ApprovalStatus.DENIED, by, comment=answer.comment)
        decision = decide(ApprovalStatus.APPROVED, by, comment=answer.comment, scope=answer.scope)
        if answer.scope == "sandbox" and sandbox_id:
            self.remember(decision, sandbox_id)
        return decision

    async def _ask(self, request: ApprovalRequest) -> object:
        approver = self.approver
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


def gate_from_config(config: Any, approver: Approver | None = None) -> HITLGate | None:
    """The gate ``config.security.hitl`` describes (default rules plus its ``rules``), or
    ``None`` when ``hitl.enabled`` is false. ``config`` is a :class:`~harombe.config.HarombeConfig`.
    """
    hitl = config.security.hitl
    if not hitl.enabled:
        return None
    from harombe.security.sandbox_risk import get_sandbox_hitl_rules

    rules = get_sandbox_hitl_rules()
    rules += [HITLRule(**rule.model_dump()) for rule in hitl.rules]
    return HITLGate(
        RiskClassifier(rules), approver, auto_approve_low_risk=hitl.auto_approve_low_risk
    )

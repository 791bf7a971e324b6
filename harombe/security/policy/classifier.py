"""The risk classifier: which rules match an operation, and what that makes its risk.

Pure: given an :class:`~harombe.security.policy.rules.Operation` it returns an
:class:`Assessment`; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harombe.security.policy.risk_table import get_sandbox_hitl_rules
from harombe.security.policy.rules import (
    DEFAULT_TIMEOUTS_S,
    GrantKey,
    HITLRule,
    Operation,
    Reason,
    RiskLevel,
)


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
    #: Every matching reason, at every level (``reasons`` first): what a person asked is
    #: shown, so a grant of ``grant_keys`` never covers a finding that was not shown.
    findings: tuple[Reason, ...] = ()


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
        shown = tuple(reason for _, _, reasons in deciding for reason in reasons)
        others = tuple(r for _, rule, rs in matched if rule.risk != risk for r in rs)
        findings = tuple(dict.fromkeys(shown + others))
        return Assessment(
            risk=risk,
            require_approval=any(rule.require_approval for _, rule, _ in deciding),
            timeout_s=min(timeouts) if timeouts else DEFAULT_TIMEOUTS_S[risk],
            reasons=shown,
            rule_ids=frozenset(i for i, _, _ in deciding),
            grant_keys=frozenset(reason.grant_key for reason in findings),
            findings=findings,
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

"""The policy half of the HITL gate: risk levels, operations, rules and the classifier that
applies them. Pure: given an :class:`Operation` it says which rules match, the resulting
:class:`RiskLevel` (the highest matching rule wins), the approval timeout and the reasons. No
I/O, no clock. :mod:`harombe.security.approval.gate` re-exports everything here.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from harombe.errors import ConfigError
from harombe.security.policy.rule_patterns import MAX_MATCH_CHARS, backtracks_exponentially


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
    """One tool call about to happen: the tool's name and the parameters it was called with.

    ``operation_id`` names it in the audit log; left empty, the gate gives it one (policy draws
    no randomness)."""

    tool_name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    operation_id: str = ""

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
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or not self.timeout > 0
        ):
            raise ConfigError(
                f"{where}: timeout {self.timeout!r} must be a finite positive number of seconds"
            )
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
                if backtracks_exponentially(condition["matches"]):
                    raise ConfigError(
                        f"{where}: the regular expression {condition['matches']!r} nests "
                        "repetitions (like '(a+)+' or '(a|ab)*'), which can take exponential "
                        "time on crafted input; rewrite it without a repeated group that "
                        "itself repeats or has overlapping alternatives"
                    )
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
                if len(text) > MAX_MATCH_CHARS:
                    if not self.require_approval:
                        return None  # an exemption is never granted on text not searched
                    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
                    detail = (  # the digest: a grant of it covers this exact text only
                        f"{condition['param']} is {len(text):,} characters, too long to "
                        f"search for {condition['matches']!r}; counted as matching "
                        f"[sha256 {digest[:16]}]"
                    )
                    details.append(Reason(self.name, self.risk, detail))
                    continue
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

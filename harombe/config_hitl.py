"""The ``security.hitl:`` section of the configuration: the approval policy of every surface
(docs/hitl.md, "One policy"). Part of :class:`harombe.config.HarombeConfig` (same precedence,
same strictness)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["APPROVER_CHOICES", "AutoLevel", "HITLConfig", "HITLRuleConfig"]


class _Strict(BaseModel):
    # As harombe.config's models: unknown keys refused, NaN and infinity never limits.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class HITLRuleConfig(_Strict):
    """A custom rule, appended to the default sandbox rules (the highest matching risk wins)."""

    tools: list[str] = Field(min_length=1)
    risk: Literal["low", "medium", "high", "critical", "LOW", "MEDIUM", "HIGH", "CRITICAL"]
    require_approval: bool = True
    timeout: float | None = Field(None, gt=0, description="approval timeout, seconds")
    conditions: list[dict[str, Any]] = Field(default_factory=list)
    description: str = ""


#: ``security.hitl.auto_approve_up_to``: the highest risk that runs without asking; ``none``:
#: every call that needs approval is asked.
AutoLevel = Literal["none", "low", "medium", "high", "critical"]
#: ``security.hitl.approver``'s named choices (anything else is a dotted path to a callable).
APPROVER_CHOICES = ("auto", "terminal", "deny")
_DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*([:.][A-Za-z_][A-Za-z0-9_]*)$"


class HITLConfig(_Strict):
    """The approval policy of every surface (docs/hitl.md, "One policy"): calls at or below
    ``auto_approve_up_to`` run at once; above it ``approver`` is asked, or the call is denied
    at once where nobody can be asked."""

    enabled: bool = True
    # Left out: HIGH, or nothing when auto_approve_low_risk is false (an old config that
    # turned auto-approval off keeps it off). Given: it alone decides.
    auto_approve_up_to: AutoLevel | None = None
    # Older switch, kept for existing configs; see auto_approve_up_to.
    auto_approve_low_risk: bool = True
    # auto: each surface asks who it can (terminal when stdin is one, the approvals page,
    # MCP elicitation), else denies; terminal; deny; or package.module:callable.
    approver: str = "auto"
    # Custom rules; each is checked again (regular expressions, operators) when the gate is built.
    rules: list[HITLRuleConfig] = Field(default_factory=list)

    @field_validator("auto_approve_up_to", mode="before")
    @classmethod
    def _level_lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("approver")
    @classmethod
    def _approver(cls, value: str) -> str:
        if value in APPROVER_CHOICES or re.fullmatch(_DOTTED, value):
            return value
        raise ValueError(
            f"approver must be auto, terminal, deny or the dotted path of an approver callable "
            f"such as 'mypackage.approvals:ask_slack' (got {value[:80]!r}); fix the spelling"
        )

    @property
    def auto_level(self) -> str:
        """The effective automatic level: ``auto_approve_up_to`` when given, else ``high``
        (``none`` when ``auto_approve_low_risk`` is false)."""
        if self.auto_approve_up_to is not None:
            return self.auto_approve_up_to
        return "high" if self.auto_approve_low_risk else "none"

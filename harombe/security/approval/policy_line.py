"""The one line each surface gives at start-up: which approval policy is in force, and where
the calls it holds go.

:func:`policy_line` is pure: it reads the gate's automatic level and its approver's
``held_calls`` words (every ready-made approver has them; a custom one is named). The CLI
prints the line on stderr; library surfaces log it once as ``hitl.policy_announced``
(:func:`announce`).
"""

from __future__ import annotations

from typing import Literal

import structlog

from harombe.security.approval.gate import HITLGate, _name_of
from harombe.security.policy.rules import RiskLevel

log = structlog.get_logger(__name__)

#: The surfaces that announce a policy.
Surface = Literal["serve", "mcp", "run", "shell", "library", "decorator", "run_sandboxed"]
#: What a surface without a gate says.
_NO_GATE: dict[str, str] = {
    "run": "none asked: you chose this program (a security.hitl section in the config gates it)",
    "shell": "none asked: you type every command in this shell yourself",
}
_GATE_OFF = "off (security.hitl.enabled is false): every call runs at once"
#: Where held calls go when the gate has no approver of its own.
_NO_APPROVER = "asked on the terminal when stdin is one, else denied"


def _listed(levels: list[RiskLevel]) -> str:
    names = [str(level) for level in levels]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def held_where(gate: HITLGate) -> str:
    """Where ``gate`` sends a call above its automatic level, in the policy line's words."""
    approver = gate.approver
    if approver is None:
        return _NO_APPROVER
    words = getattr(approver, "held_calls", None)
    if isinstance(words, str) and words:
        return words
    return f"sent to the approver {_name_of(approver)} and denied after the rule's timeout"


def policy_line(gate: HITLGate | None, surface: Surface = "library") -> str:
    """``approvals: …``: the policy ``gate`` applies on ``surface`` (``None``: no gate)."""
    if gate is None:
        return "approvals: " + _NO_GATE.get(surface, _GATE_OFF)
    level = gate.auto_approve_up_to
    if level == RiskLevel.CRITICAL:
        return "approvals: calls up to CRITICAL run at once; none is held"
    held = held_where(gate)
    if level is None:
        return f"approvals: no risk level runs at once; {_listed(list(RiskLevel))} calls are {held}"
    above = [each for each in RiskLevel if each > level]
    return f"approvals: calls up to {level} run at once; {_listed(above)} calls are {held}"


def announce(gate: HITLGate | None, surface: Surface) -> str:
    """Log the policy line of a library surface once (``hitl.policy_announced``); the line."""
    line = policy_line(gate, surface)
    log.info("hitl.policy_announced", surface=surface, policy=line)
    return line

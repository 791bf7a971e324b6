"""Public face of the human-in-the-loop gate (the usage guide's ``harombe.security.hitl``).

The rules and the classifier live in :mod:`harombe.security.policy` (pure), the gate and its
decisions in :mod:`harombe.security.approval.gate`.
"""

from __future__ import annotations

from harombe.security.approval.gate import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalResponse,
    ApprovalStatus,
    Approver,
    HITLGate,
    gate_from_config,
)
from harombe.security.policy.classifier import Assessment, RiskClassifier
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

__all__ = [
    "CONDITION_OPERATORS", "DEFAULT_TIMEOUTS_S", "ApprovalDecision", "ApprovalRequest",
    "ApprovalResponse", "ApprovalStatus", "Approver", "Assessment", "Check", "GrantKey",
    "HITLGate", "HITLRule", "Operation", "Reason", "RiskClassifier", "RiskLevel",
    "gate_from_config",
]  # fmt: skip

"""Public face of the sandbox risk rules (the usage guide's ``harombe.security.sandbox_risk``).

The table itself is pure policy: :mod:`harombe.security.policy.risk_table`.
"""

from __future__ import annotations

from harombe.security.policy.risk_table import (
    dangerous_code,
    dangerous_file_content,
    get_sandbox_hitl_rules,
    long_timeout,
    nonstandard_package_source,
    sandbox_network,
)

__all__ = [
    "dangerous_code",
    "dangerous_file_content",
    "get_sandbox_hitl_rules",
    "long_timeout",
    "nonstandard_package_source",
    "sandbox_network",
]

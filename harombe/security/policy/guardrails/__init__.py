"""The static guardrails of a profile: the scan stages, run in the profile's order.

Two stages exist (:data:`~harombe.security.policy.profiles.STAGES`): ``ast_scan`` (the
structure: imports, builtins, attributes, dunders; :mod:`.ast_scan`) and ``blocklist_audit``
(the content: deserialisation, weak hashes, SQL interpolation, secrets, path traversal;
:mod:`.blocklist_audit`). Each returns violations as ``Line N: …`` texts, or the one text that
says why the code could not be read (``SyntaxError: '(' was never closed (line 1)``).

:func:`run_stages` runs a phase's stages in order and stops at the first that refuses the
code. A stage in ``observe`` mode reports without refusing: its findings are kept and the
later stages still run, so an observed stage never hides an enforced one; when several
observed stages report, their findings are merged into one report (``stage`` lists them,
``findings`` says which stage found what). An unknown stage name is a
refusal of its own (a typo must not switch the guardrails off). Pure: no I/O, no clock.

These scans are one layer of several: what they cannot see statically (attribute names
computed at run time, objects reached through third-party libraries) is for the runtime layer
inside the sandbox and for gVisor.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from harombe.errors import InvalidArgumentError
from harombe.security.policy.guardrails.ast_scan import ast_scan, scan_tree
from harombe.security.policy.guardrails.blocklist_audit import audit_tree, blocklist_audit
from harombe.security.policy.guardrails.source import MAX_SOURCE_CHARS, Names, parse, require_str
from harombe.security.policy.profiles import STAGES, Profile

__all__ = [
    "MAX_SOURCE_CHARS",
    "STAGE_FUNCTIONS",
    "ScanReport",
    "ast_scan",
    "blocklist_audit",
    "run_stages",
]

#: Stage name → the scan of source text. Both phases may name them.
STAGE_FUNCTIONS: dict[str, Callable[[str, Profile], list[str]]] = {
    "ast_scan": ast_scan,
    "blocklist_audit": blocklist_audit,
}
#: The same scans of a tree: run_stages parses the code, and reads its names, once for all.
_TREE_STAGES: dict[str, Callable[[ast.Module, Profile, Names], list[str]]] = {
    "ast_scan": scan_tree,
    "blocklist_audit": audit_tree,
}
assert tuple(STAGE_FUNCTIONS) == tuple(_TREE_STAGES) == STAGES


@dataclass(frozen=True)
class ScanReport:
    """What a phase's scan decided. ``stage`` is the stage that reported (None: every stage
    passed; observed stages merged: their names joined by ``", "``); ``violations`` its texts;
    ``enforced`` False when the report is observe mode's, so the code may run and the report
    is only logged; ``findings`` each violation with the stage that found it."""

    stage: str | None
    violations: tuple[str, ...]
    enforced: bool
    findings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.findings and self.stage is not None:
            object.__setattr__(self, "findings", tuple((self.stage, v) for v in self.violations))

    @property
    def rejected(self) -> bool:
        """Whether the code must not run."""
        return bool(self.violations) and self.enforced


def run_stages(code: str, profile: Profile, phase: Literal["pre", "post"] = "pre") -> ScanReport:
    """Run ``profile``'s stages of ``phase`` on ``code`` in order; see the module docstring.
    Code that is not a str raises :class:`~harombe.errors.InvalidArgumentError`."""
    require_str(code)  # refused whatever the stages, even none
    if phase not in ("pre", "post"):
        raise InvalidArgumentError(f"phase must be 'pre' or 'post', not {phase!r}")
    stages = profile.scan_pre if phase == "pre" else profile.scan_post
    observed: list[ScanReport] = []
    tree: ast.Module | list[str] | None = None
    names: Names | None = None
    for stage in stages:
        scan = _TREE_STAGES.get(stage)
        if scan is None:
            known = ", ".join(STAGES)
            return ScanReport(
                stage, (f"Unknown scan stage '{stage}' (known stages: {known})",), enforced=True
            )
        tree = parse(code) if tree is None else tree
        if isinstance(tree, list):
            violations = tree
        else:
            names = Names(tree) if names is None else names
            violations = scan(tree, profile, names)
        if not violations:
            continue
        report = ScanReport(stage, tuple(violations), enforced=profile.mode(stage) == "enforce")
        if report.enforced:
            return report
        observed.append(report)
    return _merged(observed) if observed else ScanReport(None, (), enforced=True)


def _merged(reports: list[ScanReport]) -> ScanReport:
    """One observe-mode report of every observed stage's findings, in stage order."""
    if len(reports) == 1:
        return reports[0]
    return ScanReport(
        ", ".join(str(report.stage) for report in reports),
        tuple(dict.fromkeys(v for report in reports for v in report.violations)),
        enforced=False,
        findings=tuple(finding for report in reports for finding in report.findings),
    )

"""run_stages: the profile's stages in order, first refusal wins, observe mode reports without
refusing and never hides an enforced stage, unknown stages refuse; inputs that are not code or
that try to exhaust the scan are refused cleanly."""

from __future__ import annotations

from typing import Any

import pytest

from harombe.errors import InvalidArgumentError
from harombe.security.policy.guardrails import ScanReport, ast_scan, blocklist_audit, run_stages
from harombe.security.policy.profiles import Profile, resolve_profiles

from .guardrail_profiles import profile

BASE: dict[str, Any] = {"imports": {"allowed": ["math"]}}


def custom(**document: Any) -> Profile:
    """A profile extending ``base`` (math only) with ``document``'s keys."""
    return resolve_profiles({"base": BASE, "custom": {"extends": "base", **document}})["custom"]


CONTENT_ONLY = "h = 'd41d8cd98f00b204e9800998ecf8427e'"  # passes ast_scan, fails the audit
BOTH = "import os\np = '../x'"

ORDER = [
    ("ast-first", ["ast_scan", "blocklist_audit"], BOTH, "ast_scan"),
    ("audit-first", ["blocklist_audit", "ast_scan"], BOTH, "blocklist_audit"),
    ("content-reaches-audit", ["ast_scan", "blocklist_audit"], CONTENT_ONLY, "blocklist_audit"),
    ("audit-only", ["blocklist_audit"], "import os", None),
    ("none", [], "import os", None),
]


@pytest.mark.parametrize(("stages", "code", "stage"), [r[1:] for r in ORDER],
                         ids=[r[0] for r in ORDER])  # fmt: skip
def test_stages_run_in_order_and_stop_at_the_first_refusal(
    stages: list[str], code: str, stage: str | None
) -> None:
    """The report names the first stage (in the profile's order) that found something."""
    report = run_stages(code, custom(scan_stages={"pre": stages}))
    assert report.stage == stage
    assert report.rejected is (stage is not None)


def test_a_passing_run_reports_no_stage() -> None:
    """Code every stage passes: no stage, no violations, not rejected."""
    assert run_stages("print(1)", profile("minimal")) == ScanReport(None, (), enforced=True)


def test_an_unknown_stage_is_a_refusal_naming_the_known_ones() -> None:
    """A stage name harombe does not know refuses the code (a typo must not disable a scan)."""
    report = run_stages("print(1)", custom(scan_stages={"pre": ["ast_scan", "ast_scna"]}))
    assert report.rejected
    assert report.stage == "ast_scna"
    assert report.violations == (
        "Unknown scan stage 'ast_scna' (known stages: ast_scan, blocklist_audit)",
    )


def test_an_unknown_post_stage_is_a_refusal_too() -> None:
    """Post-phase stages are judged the same way."""
    report = run_stages("print(1)", custom(scan_stages={"post": ["review"]}), phase="post")
    assert report.rejected and report.stage == "review"


def test_observe_mode_reports_without_refusing() -> None:
    """An observed stage's violations come back, not enforced, so the code may run."""
    report = run_stages("import os", custom(audit={"mode": {"ast_scan": "observe"}}))
    assert report.stage == "ast_scan"
    assert not report.enforced and not report.rejected
    assert report.violations[0].startswith("Line 1: Import 'os' is not allowed")


def test_an_observed_stage_never_hides_an_enforced_one() -> None:
    """ast_scan observed and blocklist_audit enforced: the audit's refusal still wins."""
    report = run_stages(BOTH, custom(audit={"mode": {"ast_scan": "observe"}}))
    assert report.stage == "blocklist_audit"
    assert report.rejected


def test_the_post_phase_runs_the_post_stages() -> None:
    """phase='post' runs scan_post (empty by default: a pass)."""
    assert not run_stages("import os", profile("minimal"), phase="post").rejected
    report = run_stages("import os", custom(scan_stages={"post": ["ast_scan"]}), phase="post")
    assert report.rejected and report.stage == "ast_scan"


REPORTS = [
    ("violations-enforced", ("x",), True, True),
    ("violations-observed", ("x",), False, False),
    ("clean-enforced", (), True, False),
    ("clean-observed", (), False, False),
]


@pytest.mark.parametrize(("violations", "enforced", "rejected"), [r[1:] for r in REPORTS],
                         ids=[r[0] for r in REPORTS])  # fmt: skip
def test_rejected_means_violations_that_are_enforced(
    violations: tuple[str, ...], enforced: bool, rejected: bool
) -> None:
    """ScanReport.rejected is violations and enforced."""
    assert ScanReport("ast_scan", violations, enforced).rejected is rejected


NOT_CODE = [("bytes", b"print(1)"), ("none", None), ("int", 1), ("list", ["print(1)"])]


@pytest.mark.parametrize("code", [c for _, c in NOT_CODE], ids=[i for i, _ in NOT_CODE])
def test_code_that_is_not_a_str_is_a_usage_error(code: object) -> None:
    """Every entry point refuses a non-str clearly, even a profile with no stages."""
    for scan in (ast_scan, blocklist_audit):
        with pytest.raises(InvalidArgumentError, match="code must be a str"):
            scan(code, profile("minimal"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="code must be a str"):
        run_stages(code, custom(scan_stages={"pre": []}))  # type: ignore[arg-type]


def test_an_unknown_phase_is_a_usage_error() -> None:
    """Only 'pre' and 'post' are phases."""
    with pytest.raises(InvalidArgumentError, match="phase must be 'pre' or 'post'"):
        run_stages("print(1)", profile("minimal"), phase="during")  # type: ignore[arg-type]


def test_violations_are_in_line_order_and_capped() -> None:
    """Many violations come back in line order, each once, capped with a count of the rest."""
    code = "\n".join(["eval('1'); eval('1')"] * 500)
    violations = ast_scan(code, profile("minimal"))
    assert violations[0] == "Line 1: call to 'eval()' is not allowed"
    assert violations[1] == "Line 2: call to 'eval()' is not allowed"
    assert len(violations) == 101
    assert violations[-1] == "… and 400 more violations not listed"


ADVERSARIAL = [
    ("huge-hex-literal", "h = '" + "a" * 900_000 + "'", "high-entropy hex string"),
    ("huge-secret-like", "x = 'token=" + "a" * 900_000 + "'", "generic secret assignment"),
    ("many-braces", "s = '" + "{" * 400_000 + "'", None),
    ("many-format-fields", "s = '" + "{0.a}" * 150_000 + "'", None),
    ("long-repeat", "s = '_' * 10**9", None),
    ("huge-replace", "s = ('x' * 5000).replace('x', 'y' * 5000)", None),
    ("long-concat", "s = " + " + ".join(["'a'"] * 900), None),
    ("many-lines", "x = 1\n" * 40_000, None),
    ("many-classes", "class A:\n    pass\n" * 5_000, None),
    ("deep-fold", "s = " + "(" * 150 + "'a'" + " + 'b')" * 150, None),
]  # fmt: skip


@pytest.mark.parametrize(("code", "fragment"), [r[1:] for r in ADVERSARIAL],
                         ids=[r[0] for r in ADVERSARIAL])  # fmt: skip
def test_inputs_built_to_exhaust_the_scan_are_judged(code: str, fragment: str | None) -> None:
    """Large or pathological inputs are judged (no exception, no runaway string): either
    they pass or the expected finding comes back."""
    report = run_stages(code, profile("minimal"))
    if fragment is None:
        assert report.violations == ()
    else:
        assert any(fragment in v for v in report.violations), report

"""An "approve for this sandbox" grant covers exactly the findings the approver was shown: every
finding at every level is shown (not only the deciding ones), the grant is computed from what
was shown, and a finding whose text was cut, or that stands for code nobody read, is pinned to
the exact text by its fingerprint — so a later call differing only where nobody looked is asked
about again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.security.approval.gate import (
    ApprovalRequest,
    ApprovalResponse,
    ApprovalStatus,
    HITLGate,
    HITLRule,
    Operation,
    RiskClassifier,
    RiskLevel,
)
from harombe.security.policy.code_risk import MAX_CODE_CHARS
from harombe.security.policy.risk_table import get_sandbox_hitl_rules
from harombe.security.policy.rule_patterns import MAX_MATCH_CHARS
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.http import approved_once, clients


def op(code: str, language: str = "python") -> Operation:
    return Operation("code_execute", {"language": language, "code": code, "sandbox_id": "sb"})


class Recorder:
    """An approver that answers from a script and keeps every request it was shown."""

    def __init__(self, *answers: bool | ApprovalResponse) -> None:
        self.answers, self.shown = list(answers), []  # type: ignore[var-annotated]

    def __call__(self, request: ApprovalRequest) -> bool | ApprovalResponse:
        self.shown.append(request)
        return self.answers.pop(0) if self.answers else False


#: Two rules of different levels that both match code with both markers.
def marker(risk: RiskLevel, pattern: str, description: str) -> HITLRule:
    return HITLRule(["code_execute"], risk, description=description,
                    conditions=[{"param": "code", "matches": pattern}])  # fmt: skip


TWO_LEVELS = [marker(RiskLevel.CRITICAL, "CRIT", "critical marker"),
              marker(RiskLevel.HIGH, "NETX", "high marker")]  # fmt: skip


async def test_lower_level_findings_are_shown_and_the_grant_is_what_was_shown() -> None:
    """The approver of a CRITICAL call is shown its HIGH finding too; the grant holds exactly
    the shown findings' keys, and the same call is then covered."""
    approver = Recorder(ApprovalResponse(True, scope="sandbox"))
    gate = HITLGate(RiskClassifier(TWO_LEVELS), approver)
    first = await gate.check_approval(op("CRIT = NETX = 1"))
    shown = approver.shown[0].reasons
    assert {r.rule for r in shown} == {"critical marker", "high marker"}
    assert shown[0].risk is RiskLevel.CRITICAL  # the deciding finding first
    assert gate.grants("sb") == first.grant_keys == {r.grant_key for r in shown}
    again = await gate.check_approval(op("CRIT = NETX = 2"))
    assert again.decided_by == "sandbox_grant" and len(approver.shown) == 1


async def test_a_grant_never_holds_a_key_that_was_not_shown() -> None:
    """Whatever the classifier computes, the grant is limited to the shown findings."""
    approver = Recorder(ApprovalResponse(True, scope="sandbox"))
    gate = HITLGate(RiskClassifier(TWO_LEVELS), approver)
    await gate.check_approval(op("CRIT only"))
    assert {key[0] for key in gate.grants("sb")} == {"critical marker"}
    later = await gate.check_approval(op("CRIT and NETX"))
    assert later.status is ApprovalStatus.DENIED and len(approver.shown) == 2


LONG = "a" * 80
DEEP = "(" * 5000 + "1" + ")" * 5000
PAD = MAX_CODE_CHARS + 10
#: (id, language, granted code, later code): the two differ only where the finding's text was
#: cut or where the analyzer read nothing; the later call must be asked about again.
HIDDEN_DIFFERENCES = [
    ("cut-receiver", "python", f"X['{LONG}1'].system('ls')", f"X['{LONG}2'].system('ls')"),
    ("deep-nesting", "python", f"x = {DEEP}\n", f"x = {DEEP}\nimport os; os.system('id')\n"),
    ("too-long", "python", "#" * PAD, ("import os; os.system('id') #" + "#" * PAD)[:PAD]),
    ("unparseable-js", "javascript", 'var x = "abc', 'require("child_process"); var x = "abc'),
    ("remote-module", "javascript", f'require("https://{LONG}.example.org/a.js")',
     f'require("https://{LONG}.example.org/b.js")'),
    ("unknown-language", "cobol", "DISPLAY 'HI'.", "CALL 'SYSTEM' USING 'rm -rf /'."),
]  # fmt: skip


@pytest.mark.parametrize(("language", "granted", "later"), [h[1:] for h in HIDDEN_DIFFERENCES],
                         ids=[h[0] for h in HIDDEN_DIFFERENCES])  # fmt: skip
async def test_a_grant_does_not_cover_what_nobody_saw(
    language: str, granted: str, later: str
) -> None:
    """Code that differs only past a cut, or where the analyzer could not read, is a new
    finding: asked about again (and denied here), while the granted code itself is covered."""
    approver = Recorder(ApprovalResponse(True, scope="sandbox"))
    gate = HITLGate(RiskClassifier(get_sandbox_hitl_rules()), approver)
    assert (await gate.check_approval(op(granted, language))).approved
    assert gate.grants("sb")
    same = await gate.check_approval(op(granted, language))
    assert same.decided_by == "sandbox_grant"
    other = await gate.check_approval(op(later, language))
    assert other.status is ApprovalStatus.DENIED and len(approver.shown) == 2


async def test_a_text_too_long_to_search_is_pinned_to_that_text() -> None:
    """A matches-rule that cannot search a long text counts it as matching for that exact text
    only: a grant of one long text does not cover another of the same length."""
    rule = marker(RiskLevel.CRITICAL, "secret", "marker")
    approver = Recorder(ApprovalResponse(True, scope="sandbox"))
    gate = HITLGate(RiskClassifier([rule]), approver)
    size = MAX_MATCH_CHARS + 1
    assert (await gate.check_approval(op("x" * size))).approved
    other = await gate.check_approval(op("y" * size))
    assert other.status is ApprovalStatus.DENIED and len(approver.shown) == 2


# -- through the approvals page's API ------------------------------------------------------

CLIENT, JUDGE = "client-token-0123456789", "judge-token-0123456789a"
PAGE_RULES = [
    {"tools": ["code_execute"], "risk": "critical", "timeout": 30,
     "conditions": [{"param": "code", "matches": "CRIT"}], "description": "critical marker"},
    {"tools": ["code_execute"], "risk": "high", "timeout": 30,
     "conditions": [{"param": "code", "matches": "NETX"}], "description": "high marker"},
]  # fmt: skip


async def held(http: Any) -> dict[str, Any]:
    for _ in range(500):
        approvals = (await http.get("/v1/approvals")).json()["approvals"]
        if approvals:
            return dict(approvals[0])
        await asyncio.sleep(0.01)
    raise AssertionError("no call was held")


async def test_approve_sandbox_on_the_page_grants_exactly_the_reasons_it_listed(
    docker: FakeDocker,
) -> None:
    """The page's held call lists every finding (the HIGH one too); approve_sandbox grants
    exactly those, and the same call then runs without being held."""
    config = parse_config({
        "security": {"sandbox": {"pool": {"size": 0}},
                     "hitl": {"enabled": True, "rules": PAGE_RULES}},
        "service": {"tokens": [{"name": "agent", "token": CLIENT},
                               {"name": "judge", "token": JUDGE, "role": "approver"}]},
    })  # fmt: skip
    svc = Service(config, docker_manager=docker, environ={})
    await svc.start()
    try:
        http = clients(create_app(service=svc))
        async with http(CLIENT) as agent, http(JUDGE) as judge:
            made = await approved_once(judge, agent.post("/v1/sandboxes", json={}))
            assert made.status_code == 201, made.text
            sid = made.json()["sandbox_id"]
            url = f"/v1/sandboxes/{sid}/execute"
            run = asyncio.ensure_future(agent.post(url, json={"code": "CRIT = NETX = 1"}))
            approval = await held(judge)
            listed = {(r["rule"], r["detail"]) for r in approval["reasons"]}
            assert {"critical marker", "high marker"} <= {rule for rule, _ in listed}
            decided = await judge.post(f"/v1/approvals/{approval['id']}",
                                       json={"decision": "approve_sandbox"})  # fmt: skip
            assert decided.status_code == 200, decided.text
            assert (await run).status_code == 200
            assert svc.gate is not None
            assert {(rule, detail) for rule, _, detail in svc.gate.grants(sid)} == listed
            again = await agent.post(url, json={"code": "CRIT = NETX = 2"})
            assert again.json()["approval"]["decided_by"] == "sandbox_grant", again.text
    finally:
        await svc.stop()

"""One approval policy: the config's automatic level and approver, the gate's levels, who is
asked on each surface, and the one start-up line that says so."""

from __future__ import annotations

import os
import pty
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harombe.config import load_config, parse_config
from harombe.errors import ConfigError
from harombe.security.approval import approvers
from harombe.security.approval import gate as gate_module
from harombe.security.approval.approvers import (
    NobodyToAsk,
    TerminalApprover,
    approver_from_config,
    deny_all,
)
from harombe.security.approval.gate import gate_from_config
from harombe.security.approval.policy_line import policy_line
from harombe.security.hitl import (
    ApprovalStatus,
    HITLGate,
    HITLRule,
    Operation,
    RiskClassifier,
    RiskLevel,
)
from harombe.security.sandbox_manager import SandboxManager
from harombe.service.approvals import ApprovalBroker, AuditFeed
from harombe.service.mcp_approval import ElicitingApprover
from harombe.testing import FakeDocker, ScriptedApprover, capture_events
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit.test_terminal_approver import python_on_a_pty, read_until

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8000/approvals"
HELD_PAGE = f"held on {URL} and denied after the rule's timeout"
NO_TERMINAL = "denied (no terminal to ask on; set security.hitl.approver)"


def ask_slack(request: Any) -> bool:
    """A custom approver, named by the policy line."""
    return False


def hitl(**settings: Any) -> Any:
    """``config.security.hitl`` with ``settings``."""
    return parse_config({"security": {"hitl": settings}}).security.hitl


def broker() -> ApprovalBroker:
    return ApprovalBroker(AuditFeed(), url=URL)


@pytest.fixture
def no_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin is not a terminal, whatever runs the tests."""
    monkeypatch.setattr(approvers, "stdin_is_tty", lambda: False)
    monkeypatch.setattr(gate_module, "stdin_is_tty", lambda: False)


# ---- the start-up line --------------------------------------------------------------------

LINES: list[tuple[str, Callable[[], HITLGate | None], str, str]] = [
    ("serve", lambda: HITLGate(approver=broker(), auto_approve_up_to="high"), "serve",
     f"approvals: calls up to HIGH run at once; CRITICAL calls are {HELD_PAGE}"),
    ("serve-with-mcp", lambda: HITLGate(approver=ElicitingApprover(broker()),
                                        auto_approve_up_to="high"), "serve",
     "approvals: calls up to HIGH run at once; CRITICAL calls are asked through MCP "
     f"elicitation when the client supports it, else {HELD_PAGE}"),
    ("serve-with-tokens", lambda: HITLGate(approver=ElicitingApprover(
        broker(), who="a client whose token is marked human"), auto_approve_up_to="high"),
     "serve", "approvals: calls up to HIGH run at once; CRITICAL calls are asked through MCP "
     f"elicitation when a client whose token is marked human supports it, else {HELD_PAGE}"),
    ("mcp-stdio", lambda: HITLGate(approver=ElicitingApprover(), auto_approve_up_to="high"),
     "mcp", "approvals: calls up to HIGH run at once; CRITICAL calls are asked through MCP "
     "elicitation when the client supports it, else denied"),
    ("nobody", lambda: HITLGate(approver=NobodyToAsk(), auto_approve_up_to="high"), "library",
     f"approvals: calls up to HIGH run at once; CRITICAL calls are {NO_TERMINAL}"),
    ("deny", lambda: gate_from_config(parse_config({"security": {"hitl": {"approver": "deny"}}})),
     "library", "approvals: calls up to HIGH run at once; CRITICAL calls are denied "
     "(security.hitl.approver: deny)"),
    ("custom", lambda: HITLGate(approver=ask_slack, auto_approve_up_to="high"), "library",
     "approvals: calls up to HIGH run at once; CRITICAL calls are sent to the approver "
     "ask_slack and denied after the rule's timeout"),
    ("no-approver", lambda: HITLGate(auto_approve_up_to="high"), "library",
     "approvals: calls up to HIGH run at once; CRITICAL calls are asked on the terminal when "
     "stdin is one, else denied"),
    ("medium", lambda: HITLGate(approver=NobodyToAsk(), auto_approve_up_to="medium"), "library",
     f"approvals: calls up to MEDIUM run at once; HIGH and CRITICAL calls are {NO_TERMINAL}"),
    ("classic-low", lambda: HITLGate(approver=NobodyToAsk()), "library",
     f"approvals: calls up to LOW run at once; MEDIUM, HIGH and CRITICAL calls are {NO_TERMINAL}"),
    ("none", lambda: HITLGate(approver=NobodyToAsk(), auto_approve_up_to="none"), "library",
     "approvals: no risk level runs at once; LOW, MEDIUM, HIGH and CRITICAL calls are "
     f"{NO_TERMINAL}"),
    ("critical", lambda: HITLGate(approver=NobodyToAsk(), auto_approve_up_to="critical"), "mcp",
     "approvals: calls up to CRITICAL run at once; none is held"),
    ("gate-off", lambda: None, "serve",
     "approvals: off (security.hitl.enabled is false): every call runs at once"),
    ("run-ungated", lambda: None, "run", "approvals: none asked: you chose this program (a "
     "security.hitl section in the config gates it)"),
    ("shell", lambda: None, "shell",
     "approvals: none asked: you type every command in this shell yourself"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "surface", "line"), [c[1:] for c in LINES],
                         ids=[c[0] for c in LINES])  # fmt: skip
def test_the_policy_line(make: Callable[[], HITLGate | None], surface: Any, line: str) -> None:
    """Each gate and surface is stated in one line: the level, and where held calls go."""
    assert policy_line(make(), surface) == line


def test_the_policy_line_of_a_terminal() -> None:
    """A terminal approver on a tty asks there; on anything else it is said to deny."""
    master, slave = pty.openpty()
    read_end, write_end = os.pipe()
    try:
        on_tty = HITLGate(approver=TerminalApprover(input_fd=slave), auto_approve_up_to="high")
        on_pipe = HITLGate(approver=TerminalApprover(input_fd=read_end), auto_approve_up_to="high")
        lines = policy_line(on_tty, "run"), policy_line(on_pipe, "run")
    finally:
        for fd in (master, slave, read_end, write_end):
            os.close(fd)
    assert lines == (
        "approvals: calls up to HIGH run at once; CRITICAL calls are asked on this terminal "
        "and denied after the rule's timeout",
        f"approvals: calls up to HIGH run at once; CRITICAL calls are {NO_TERMINAL}",
    )


# ---- the configuration --------------------------------------------------------------------

SETTINGS = [
    ("defaults", {}, "high", "auto"),
    ("old-switch-off", {"auto_approve_low_risk": False}, "none", "auto"),
    ("old-switch-on", {"auto_approve_low_risk": True}, "high", "auto"),
    ("level-wins", {"auto_approve_low_risk": False, "auto_approve_up_to": "medium"}, "medium",
     "auto"),
    ("upper-case", {"auto_approve_up_to": "CRITICAL"}, "critical", "auto"),
    ("none", {"auto_approve_up_to": "none"}, "none", "auto"),
    ("terminal", {"approver": "terminal"}, "high", "terminal"),
    ("deny", {"approver": "deny"}, "high", "deny"),
    ("colon-path", {"approver": "mypkg.approvals:ask"}, "high", "mypkg.approvals:ask"),
    ("dotted-path", {"approver": "mypkg.approvals.ask"}, "high", "mypkg.approvals.ask"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "level", "approver"), [c[1:] for c in SETTINGS],
                         ids=[c[0] for c in SETTINGS])  # fmt: skip
def test_the_hitl_settings(settings: dict[str, Any], level: str, approver: str) -> None:
    """auto_approve_up_to decides when given; left out it is HIGH, or nothing when the old
    auto_approve_low_risk switch is off."""
    parsed = hitl(**settings)
    assert (parsed.auto_level, parsed.approver) == (level, approver)


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"auto_approve_up_to": "highest"}, "auto_approve_up_to"),
     ({"approver": "slack"}, "approver must be auto, terminal, deny or the dotted path"),
     ({"approver": "my pkg:ask"}, "approver must be auto"),
     ({"approver": "mypkg:"}, "approver must be auto")],
    ids=["bad-level", "bad-choice", "space", "no-name"],
)  # fmt: skip
def test_bad_hitl_settings_are_config_errors(settings: dict[str, Any], named: str) -> None:
    """A bad level or approver is refused when the config is read, naming what to fix."""
    with pytest.raises(ConfigError, match=named):
        hitl(**settings)


def test_the_level_comes_from_the_environment_and_the_shipped_file() -> None:
    """HAROMBE__SECURITY__HITL__AUTO_APPROVE_UP_TO sets it; config/harombe.yaml says HIGH."""
    env = {"HAROMBE__SECURITY__HITL__AUTO_APPROVE_UP_TO": "critical"}
    assert load_config(environ=env).security.hitl.auto_level == "critical"
    shipped = load_config(REPO / "config/harombe.yaml", environ={}).security.hitl
    assert (shipped.auto_level, shipped.approver) == ("high", "auto")


# ---- who is asked -------------------------------------------------------------------------


def _surface(request: Any) -> bool:
    return False


CHOICES: list[tuple[str, dict[str, Any], bool, bool, Callable[[Any], bool]]] = [
    ("auto-surface", {}, True, True, lambda a: a is _surface),
    ("auto-terminal", {}, False, True, lambda a: isinstance(a, TerminalApprover)),
    ("auto-nobody", {}, False, False, lambda a: isinstance(a, NobodyToAsk)),
    ("terminal-beats-surface", {"approver": "terminal"}, True, False,
     lambda a: isinstance(a, TerminalApprover)),
    ("deny-beats-surface", {"approver": "deny"}, True, True,
     lambda a: isinstance(a, NobodyToAsk) and "approver is deny" in a.reason),
    ("colon-path", {"approver": "harombe.security.approval.approvers:deny_all"}, True, True,
     lambda a: a is deny_all),
    ("dotted-path", {"approver": "harombe.security.approval.approvers.deny_all"}, True, True,
     lambda a: a is deny_all),
    ("class-path", {"approver": "harombe.security.approval.approvers:TerminalApprover"}, True,
     False, lambda a: isinstance(a, TerminalApprover)),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "surface", "tty", "check"), [c[1:] for c in CHOICES],
                         ids=[c[0] for c in CHOICES])  # fmt: skip
def test_the_approver_the_config_names(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], surface: bool, tty: bool,
    check: Callable[[Any], bool],
) -> None:  # fmt: skip
    """auto: the surface's person, else the terminal when stdin is one, else nobody (deny at
    once); any other choice is used on every surface."""
    monkeypatch.setattr(approvers, "stdin_is_tty", lambda: tty)
    assert check(approver_from_config(hitl(**settings), surface=_surface if surface else None))


@pytest.mark.parametrize(
    ("path", "named"),
    [("no_such_module_here:ask", "cannot be imported"),
     ("harombe.security.approval.approvers:no_such_name", "has no attribute 'no_such_name'"),
     ("harombe.security.approval.approvers:CODE_PARAMS", "not callable"),
     ("harombe.service.approvals:ApprovalBroker", "cannot be made with no arguments")],
    ids=["no-module", "no-attribute", "not-callable", "class-needs-arguments"],
)  # fmt: skip
def test_a_bad_approver_path_is_a_config_error(path: str, named: str) -> None:
    """A path that does not lead to an approver fails when the gate is built, naming the fix."""
    with pytest.raises(ConfigError, match=named) as caught:
        gate_from_config(parse_config({"security": {"hitl": {"approver": path}}}))
    assert "security.hitl.approver" in str(caught.value)


def test_the_callers_approver_wins_over_the_config() -> None:
    """gate_from_config(approver=...) uses it whatever security.hitl.approver says."""
    config = parse_config({"security": {"hitl": {"approver": "deny"}}})
    assert (gate := gate_from_config(config, approver=ask_slack)) is not None
    assert gate.approver is ask_slack


# ---- the gate's levels --------------------------------------------------------------------

LEVEL_RULES = [HITLRule(tools=[f"t_{level.name.lower()}"], risk=level) for level in RiskLevel]
GATES: list[tuple[str, dict[str, Any], set[RiskLevel]]] = [
    ("classic", {}, {RiskLevel.LOW}),
    ("classic-off", {"auto_approve_low_risk": False}, set()),
    ("high", {"auto_approve_up_to": "high"}, {RiskLevel.LOW, RiskLevel.MEDIUM, RiskLevel.HIGH}),
    ("none", {"auto_approve_up_to": "none"}, set()),
    ("critical", {"auto_approve_up_to": RiskLevel.CRITICAL}, set(RiskLevel)),
    ("level-beats-switch", {"auto_approve_low_risk": False, "auto_approve_up_to": "medium"},
     {RiskLevel.LOW, RiskLevel.MEDIUM}),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "automatic"), [c[1:] for c in GATES],
                         ids=[c[0] for c in GATES])  # fmt: skip
async def test_calls_at_or_below_the_level_run_at_once(
    kwargs: dict[str, Any], automatic: set[RiskLevel]
) -> None:
    """Calls at or below the gate's level are auto-approved; above it the approver is asked."""
    approver = ScriptedApprover(default=True)
    gate = HITLGate(RiskClassifier(LEVEL_RULES), approver, **kwargs)
    for level in RiskLevel:
        decision = await gate.check_approval(Operation(f"t_{level.name.lower()}"))
        expected = ApprovalStatus.AUTO_APPROVED if level in automatic else ApprovalStatus.APPROVED
        assert decision.status is expected, level
    asked = {request.risk for request in approver.requests}
    assert asked == set(RiskLevel) - automatic


async def test_the_configs_gate_runs_high_at_once_and_denies_critical_at_once(
    no_tty: None,
) -> None:
    """The default config: HIGH code is auto-approved; CRITICAL is denied at once, and the
    reason says how to get approvals."""
    gate = gate_from_config(parse_config({}))
    assert gate is not None and gate.auto_approve_up_to is RiskLevel.HIGH
    plain = await gate.check_approval(Operation("code_execute", {"code": "print(6*7)"}))
    risky = await gate.check_approval(
        Operation("code_execute", {"language": "python", "code": "import subprocess"})
    )
    assert (plain.status, plain.decided_by) == (ApprovalStatus.AUTO_APPROVED, "auto_approve_up_to")
    assert (risky.status, risky.decided_by) == (ApprovalStatus.DENIED, "nobody_to_ask")
    message = str(risky.error())
    assert "security.hitl.approver" in message and "auto_approve_up_to" in message


async def test_a_gate_without_an_approver_and_no_terminal_denies(no_tty: None) -> None:
    """HITLGate() off a terminal denies what it would ask, saying to run from one."""
    decision = await HITLGate().check_approval(Operation("code_execute", {"code": "1"}))
    assert (decision.status, decision.decided_by) == (ApprovalStatus.DENIED, "no_approver")
    assert "run from a terminal" in (decision.comment or "")


def test_the_guides_gate_asks_on_a_terminal() -> None:
    """The guide's HITLGate(classifier=classifier), in a process whose stdin is a pty, asks
    there; a yes approves."""
    guide = (REPO / "docs/examples/hitl_rules.py").read_text().split("# --- not in the guide")[0]
    script = guide + textwrap.dedent(
        """
        import asyncio
        from harombe.security.hitl import Operation

        async def main():
            op = Operation("code_execute", {"language": "python", "code": "import subprocess"})
            decision = await hitl_gate.check_approval(op)
            print(f"RESULT {decision.status.value} {decision.decided_by}")

        asyncio.run(main())
        """
    )
    with python_on_a_pty(script) as (process, master):
        shown = read_until(master, b"Approve?")
        os.write(master, b"y\n")
        rest = read_until(master, b"RESULT")
        rest += read_until(master, b"terminal")
        assert process.wait(timeout=20) == 0
    assert b"risk CRITICAL" in shown and b"import subprocess" in shown
    assert b"RESULT approved terminal" in rest


# ---- the library honours the config -------------------------------------------------------


@pytest.fixture
def docker() -> Iterator[FakeDocker]:
    yield FakeDocker()


async def _tools(docker: FakeDocker, hitl_settings: dict[str, Any], **kwargs: Any) -> Any:
    await docker.start()
    data = {"sandbox": {"pool": {"size": 0}, "install_cache": {"enabled": False}},
            "hitl": hitl_settings}  # fmt: skip
    manager = SandboxManager(docker, config=parse_config({"security": data}))
    await manager.start()
    return manager, CodeExecutionTools(manager, **kwargs)


async def test_the_tools_build_the_configs_gate(docker: FakeDocker, no_tty: None) -> None:
    """CodeExecutionTools(manager) with security.hitl.enabled: plain code runs at once, a
    CRITICAL call is denied at once with the reason, and the policy is logged once."""
    with capture_events() as events:
        manager, tools = await _tools(docker, {"enabled": True})
    try:
        plain = await tools.code_execute(language="python", code="print(6*7)")
        risky = await tools.code_execute(language="python", code="import subprocess")
    finally:
        await manager.stop()
    assert isinstance(tools.hitl_gate, HITLGate)
    assert plain["success"] and plain["approval"]["status"] == "auto_approved"
    assert not risky["success"] and risky["approval"]["decided_by"] == "nobody_to_ask"
    assert "security.hitl.approver" in risky["error"]
    announced = [e for e in events if e["event"] == "hitl.policy_announced"]
    assert [e["surface"] for e in announced] == ["library"]
    assert announced[0]["policy"].startswith("approvals: calls up to HIGH run at once")


@pytest.mark.parametrize(
    ("settings", "kwargs", "gated"),
    [({"enabled": False}, {}, False), ({"enabled": True}, {"hitl_gate": None}, False),
     ({"enabled": True, "approver": "harombe.security.approval.approvers:deny_all"}, {}, True)],
    ids=["config-off", "explicit-none", "config-approver"],
)  # fmt: skip
async def test_when_the_tools_have_a_gate(
    docker: FakeDocker, settings: dict[str, Any], kwargs: dict[str, Any], gated: bool
) -> None:
    """No gate when the config turns it off or hitl_gate=None is passed; the config's named
    approver when it names one."""
    manager, tools = await _tools(docker, settings, **kwargs)
    await manager.stop()
    assert (tools.hitl_gate is not None) is gated
    if gated:
        assert tools.hitl_gate.approver is deny_all


# ---- no self-approval: the token setting --------------------------------------------------


def test_human_marks_client_tokens_only() -> None:
    """human: true is a client token's; on an approver token it is refused."""
    token = "t" * 20
    ok = parse_config({"service": {"tokens": [{"name": "me", "token": token, "human": True}]}})
    assert ok.service.tokens[0].human is True
    with pytest.raises(ConfigError, match="drop human"):
        parse_config({"service": {"tokens": [
            {"name": "judge", "token": token, "role": "approver", "human": True}]}})  # fmt: skip


# ---- the commands' start-up line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "line"),
    [({}, None),
     ({"HAROMBE__SECURITY__HITL__ENABLED": "true"},
      f"harombe run: approvals: calls up to HIGH run at once; CRITICAL calls are {NO_TERMINAL}")],
    ids=["ungated", "gated"],
)  # fmt: skip
def test_harombe_run_says_its_policy_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    no_tty: None, env: dict[str, str], line: str | None,
) -> None:  # fmt: skip
    """harombe run's first line on stderr is its policy when a gate is in force (ungated, a
    piped stderr is the program's own); the gate it builds reaches the run."""
    from harombe.cli import main as cli_main

    for name in [n for n in os.environ if n.startswith("HAROMBE")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen: list[Any] = []

    async def program(config: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs["gate"])
        return {"status": "ok", "exit_code": 0, "stdout": "", "stderr": ""}

    monkeypatch.setattr("harombe.cli.run.run_program", program)
    (tmp_path / "x.py").write_text("print(1)")
    assert cli_main(["run", str(tmp_path / "x.py")]) == 0
    assert capsys.readouterr().err.splitlines()[:1] == ([line] if line else [])
    assert (seen[0] is not None) is bool(env)


def test_harombe_shell_says_its_policy_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """harombe shell's first line: nothing is gated, you type every command."""
    from harombe.cli import main as cli_main

    async def session(*_: Any, **__: Any) -> int:
        return 0

    monkeypatch.setattr("harombe.cli.shell._shell", session)
    assert cli_main(["shell"]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        "harombe shell: approvals: none asked: you type every command in this shell yourself"
    )

"""The tools' order of steps (validate, gate, act) and what the gate is shown; no Docker."""

from types import SimpleNamespace
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.errors import UsageError
from harombe.security.approval.approvers import deny_all
from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import ApprovalResponse, HITLGate
from harombe.security.runtime.sandbox import ExecutionResult
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import ScriptedApprover, capture_events
from harombe.tools.code_execution import CodeExecutionTools

SID = "sandbox-0123456789ab"
NET_SID = "sandbox-0123456789ac"


def offline_manager(**limits: Any) -> SandboxManager:
    """A manager that was never started, knowing two sandboxes by id (no containers)."""
    manager = SandboxManager(DockerManager(), **limits)
    manager._sandboxes[SID] = SimpleNamespace(  # type: ignore[assignment]
        sandbox_id=SID, network_enabled=False, allowed_domains=(), has=lambda _: True
    )
    manager._sandboxes[NET_SID] = SimpleNamespace(  # type: ignore[assignment]
        sandbox_id=NET_SID,
        network_enabled=True,
        allowed_domains=("example.com",),
        has=lambda _: True,
    )
    return manager


def test_something_that_is_not_a_gate_is_refused() -> None:
    """hitl_gate must be able to decide; anything else fails at construction, not at a call."""
    manager = SandboxManager(DockerManager())
    with pytest.raises(UsageError, match="hitl_gate"):
        CodeExecutionTools(sandbox_manager=manager, hitl_gate=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "risk"),
    [
        (lambda t: t.code_execute(language="python", code="print(1)"), "HIGH"),
        (lambda t: t.code_execute(language="shell", code="rm -rf /"), "CRITICAL"),
        (lambda t: t.code_write_file(sandbox_id=SID, file_path="a.txt", content="x"), "MEDIUM"),
        (lambda t: t.code_read_file(sandbox_id=SID, file_path="a.txt"), "MEDIUM"),
        (lambda t: t.code_list_files(sandbox_id=SID), "MEDIUM"),
        (lambda t: t.code_install_package(sandbox_id=SID, package="six"), "HIGH"),
    ],
    ids=["execute", "execute-dangerous", "write", "read", "list", "install"],
)
async def test_denied_calls_never_reach_the_manager(call: Any, risk: str) -> None:
    """The gate decides first: a denial comes back as data even though Docker was never started."""
    tools = CodeExecutionTools(offline_manager(), hitl_gate=HITLGate(approver=deny_all))
    result = await call(tools)
    assert result["success"] is False
    assert result["error"].startswith("ApprovalDeniedError: ")
    assert f"risk {risk}" in result["error"] and "denied by deny_all" in result["error"]
    assert result["approval"]["status"] == "denied" and result["approval"]["risk"] == risk


async def test_manager_refuses_to_start_before_docker() -> None:
    """The guide's 'Docker manager not started' troubleshooting message is what users get."""
    with pytest.raises(UsageError, match="Docker manager not started"):
        await SandboxManager(DockerManager()).start()


async def test_denied_stream_yields_only_the_refusal() -> None:
    """A gated stream that is denied yields one result item and never starts a sandbox."""
    tools = CodeExecutionTools(
        SandboxManager(DockerManager()), hitl_gate=HITLGate(approver=deny_all)
    )
    items = [i async for i in tools.code_execute_stream(language="python", code="print(1)")]
    assert len(items) == 1 and items[0]["type"] == "result"
    assert items[0]["success"] is False and items[0]["approval"]["status"] == "denied"


async def shown(call: Any, **limits: Any) -> dict[str, Any]:
    """The parameters the approver was shown for ``call`` (which it then denies)."""
    approver = ScriptedApprover(default=False)
    tools = CodeExecutionTools(offline_manager(**limits), hitl_gate=HITLGate(approver=approver))
    result = await call(tools)
    assert result["approval"]["status"] == "denied", result
    (request,) = approver.requests
    return dict(request.operation.params)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda t: t.code_write_file(SID, "./a//run.py", "x"), {"file_path": "a/run.py"}),
        (lambda t: t.code_write_file(SID, "/workspace/.env", "x"), {"file_path": ".env"}),
        (lambda t: t.code_read_file(SID, "//workspace/./a/.env"), {"file_path": "a/.env"}),
        (lambda t: t.code_list_files(SID, "data/"), {"path": "data"}),
        (lambda t: t.code_install_package(SID, "  six  "), {"package": "six"}),
        (lambda t: t.code_execute("python", "1", timeout=7), {"timeout": 7.0}),
        (lambda t: t.code_execute("python", "1"), {"timeout": 30.0, "timeout_default_s": 30.0}),
        (lambda t: t.code_execute("python", "1", timeout=10**6), {"timeout": 600.0}),
        (lambda t: t.code_execute("python", "1", sandbox_id=NET_SID),
         {"network_enabled": True, "allowed_domains": ["example.com"]}),
        (lambda t: t.code_execute("python", "1", sandbox_id=NET_SID, network_enabled=False),
         {"network_enabled": True}),
        (lambda t: t.code_execute_stream("python", "1", network_enabled=True,
                                         allowed_domains=("example.com",)).__anext__(),
         {"network_enabled": True, "allowed_domains": ["example.com"]}),
    ],
    ids=["write-path", "write-abs", "read-path", "list-dir", "package", "timeout", "default",
         "ceiling", "sandbox-network", "sandbox-network-repeated-false", "stream-network"],
)  # fmt: skip
async def test_the_gate_sees_what_the_manager_will_do(call: Any, expected: dict) -> None:
    """The Operation carries normalised values and the sandbox's real network and timeout."""
    params = await shown(call)
    assert {k: params[k] for k in expected} == expected


NETWORK_ON = parse_config({"security": {"sandbox": {"network": {"enabled_by_default": True}}}})


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda t: t.code_execute("python", "1"), True),
        (lambda t: t.code_execute("python", "1", network_enabled=None), True),
        (lambda t: t.code_execute("python", "1", network_enabled=False), False),
        (lambda t: t.code_execute_stream("python", "1").__anext__(), True),
        (lambda t: t.code_execute("python", "1", sandbox_id=SID), False),
    ],
    ids=["left-out", "none", "explicit-false", "stream", "existing-offline-sandbox"],
)
async def test_network_enabled_by_default_reaches_the_gate(call: Any, expected: bool) -> None:
    """network.enabled_by_default is the network of a new sandbox whose call does not say; an
    existing sandbox keeps its own (no refusal for the default it was not created with)."""
    params = await shown(call, config=NETWORK_ON)
    assert params["network_enabled"] is expected


async def test_guide_timeout_override_reaches_the_gate() -> None:
    """With max_execution_time=60, timeout=120 is kept (not capped) and the gate knows both."""
    params = await shown(
        lambda t: t.code_execute("python", "1", timeout=120), max_execution_time=60
    )
    assert params["timeout"] == 120.0 and params["timeout_default_s"] == 60.0


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda t: t.code_execute("python", "1", sandbox_id=SID, network_enabled=True),
         "created without network"),
        (lambda t: t.code_execute("python", "1", sandbox_id=NET_SID, network_enabled=True,
                                  allowed_domains=["other.example"]), "differ from sandbox"),
        (lambda t: t.code_execute("python", "1", sandbox_id="sandbox-ffffffffffff"),
         "SandboxNotFoundError: Sandbox not found"),
        (lambda t: t.code_write_file("sandbox-ffffffffffff", "a", "x"), "SandboxNotFoundError"),
        (lambda t: t.code_execute("python", "1", on_output="print"), "on_output must be"),
    ],
    ids=["network-on-offline-sandbox", "other-domains", "unknown-sandbox", "unknown-write",
         "on-output-not-callable"],
)  # fmt: skip
async def test_calls_that_cannot_run_are_refused_before_anyone_is_asked(
    call: Any, needle: str
) -> None:
    """A call that contradicts its sandbox, or names none that exists, asks nobody."""
    approver = ScriptedApprover(default=True)
    tools = CodeExecutionTools(offline_manager(), hitl_gate=HITLGate(approver=approver))
    result = await call(tools)
    assert result["success"] is False and needle in result["error"], result
    assert approver.requests == []


async def test_a_lost_sandbox_loses_its_grants() -> None:
    """When a run comes back lost and replaced, the old sandbox's grants are dropped."""
    manager = offline_manager()
    approver = ScriptedApprover([ApprovalResponse(True, scope="sandbox")], default=False)
    gate = HITLGate(approver=approver)
    tools = CodeExecutionTools(manager, hitl_gate=gate)
    replacement = "sandbox-00000000000f"

    async def lost(sandbox_id: str, code: str, **_: Any) -> ExecutionResult:
        return ExecutionResult(
            success=False, sandbox_id=replacement, stdout="", stderr="", exit_code=-1,
            execution_time=0.0, error="SandboxLostError: gone", status="lost",
            language="python", runtime="runsc", replaced_sandbox_id=sandbox_id,
        )  # fmt: skip

    manager.execute = lost  # type: ignore[method-assign]
    first = await tools.code_execute("python", "print(1)", sandbox_id=SID)
    assert first["status"] == "lost" and first["replaced_sandbox_id"] == SID
    again = await tools.code_execute("python", "print(1)", sandbox_id=SID)
    assert again["approval"]["decided_by"] != "sandbox_grant"
    assert len(approver.requests) == 2


async def test_a_refused_call_is_audited_once_and_never_decided() -> None:
    """Invalid arguments: one tool.called event with the error kind, no hitl.decided event."""
    tools = CodeExecutionTools(offline_manager(), hitl_gate=HITLGate(approver=deny_all))
    with capture_events() as events:
        result = await tools.code_execute("python", "print(1)", network_enabled="false")  # type: ignore[arg-type]
    assert result["error"].startswith("InvalidArgumentError: network_enabled")
    assert result["approval"] is None  # nobody was asked
    assert [e["event"] for e in events] == ["tool.called"]
    assert events[0]["error_kind"] == "InvalidArgumentError" and events[0]["success"] is False

"""Tool construction rules that need no Docker."""

from typing import Any

import pytest

from harombe.errors import UsageError
from harombe.security.approvers import deny_all
from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import HITLGate
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

SID = "sandbox-0123456789ab"


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
    tools = CodeExecutionTools(
        SandboxManager(DockerManager()), hitl_gate=HITLGate(approver=deny_all)
    )
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

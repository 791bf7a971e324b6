"""Tool construction rules that need no Docker."""

import pytest

from harombe.errors import UsageError
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


def test_a_gate_that_would_be_ignored_is_refused() -> None:
    """Passing a HITL gate the tools cannot consult fails closed instead of running ungated."""
    manager = SandboxManager(DockerManager())
    with pytest.raises(UsageError, match="hitl_gate"):
        CodeExecutionTools(sandbox_manager=manager, hitl_gate=object())


async def test_manager_refuses_to_start_before_docker() -> None:
    """The guide's 'Docker manager not started' troubleshooting message is what users get."""
    with pytest.raises(UsageError, match="Docker manager not started"):
        await SandboxManager(DockerManager()).start()

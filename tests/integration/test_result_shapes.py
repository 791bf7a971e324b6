"""Results on real gVisor have their tool's full shape, failures before a run included: the
usage guide's ``print(result["stdout"])`` never raises ``KeyError``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from harombe.security.approval.approvers import deny_all
from harombe.security.approval.gate import HITLGate
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.shapes import keys_of

Call = Callable[[CodeExecutionTools, str], Awaitable[dict[str, Any]]]

CASES: list[tuple[str, str, Call]] = [
    ("code_execute", "ran", lambda t, s: t.code_execute("python", "print(1)", sandbox_id=s)),
    ("code_execute", "failed", lambda t, s: t.code_execute("shell", "exit 3", sandbox_id=s)),
    ("code_execute", "timed-out",
     lambda t, s: t.code_execute("python", "while True: pass", sandbox_id=s, timeout=1)),
    ("code_execute", "refused-by-profile",
     lambda t, s: t.code_execute("python", "import os", profile="minimal")),
    ("code_execute", "unknown-sandbox",
     lambda t, s: t.code_execute("python", "1", sandbox_id="sandbox-0123456789ab")),
    ("code_read_file", "read", lambda t, s: t.code_read_file(s, "shape.txt")),
    ("code_read_file", "missing", lambda t, s: t.code_read_file(s, "no-such-file")),
    ("code_list_files", "listed", lambda t, s: t.code_list_files(s)),
    ("code_list_files", "not-a-directory", lambda t, s: t.code_list_files(s, "shape.txt")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tool", "call"), [(t, c) for t, _, c in CASES], ids=[f"{t}-{i}" for t, i, _ in CASES]
)
async def test_every_outcome_has_the_tool_keys(
    tools: CodeExecutionTools, sandbox_id: str, tool: str, call: Call
) -> None:
    """Run, failed, timed out, refused or unknown: the same keys, and text where text is."""
    await tools.code_write_file(sandbox_id, "shape.txt", "shape\n")
    result = await call(tools, sandbox_id)
    assert set(result) == keys_of(tool), set(result) ^ keys_of(tool)
    if tool == "code_execute":
        print(result["stdout"], result["stderr"])  # the guide's read, on every outcome


async def test_a_denied_call_reads_like_the_guide(sandbox_manager: SandboxManager) -> None:
    """A gated call that is denied: ``stdout`` is empty text, nothing ran, no sandbox."""
    gated = CodeExecutionTools(sandbox_manager, hitl_gate=HITLGate(approver=deny_all))
    before = set(sandbox_manager.sandboxes)
    result = await gated.code_execute(language="python", code="print('Hello, World!')")
    assert set(result) == keys_of("code_execute")
    assert (result["stdout"], result["exit_code"], result["status"]) == ("", None, None)
    assert result["approval"]["status"] == "denied" and set(sandbox_manager.sandboxes) == before

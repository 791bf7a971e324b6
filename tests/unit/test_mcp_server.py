"""The MCP server in process, over a scripted tool host (no Docker): progress relayed in order,
the gate's approver asking the client by elicitation, and crashes kept to one call."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from harombe.security.approval.gate import HITLGate, HITLRule, Operation, RiskClassifier, RiskLevel
from harombe.service.mcp import build_server
from harombe.service.mcp_approval import NOBODY_TO_ASK, ElicitingApprover


class ScriptedHost:
    """Prints ``chunks`` through on_output, asks ``gate`` about the call, returns a result."""

    def __init__(self, chunks: list[tuple[str, bytes]], gate: HITLGate | None = None) -> None:
        self.chunks, self.gate = chunks, gate

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, *, on_output: Any, request: Any
    ) -> dict[str, Any]:
        if name == "crash":
            raise RuntimeError("boom")
        if self.gate is not None:
            decision = await self.gate.check_approval(Operation(name, dict(arguments or {})))
            if not decision.approved:
                return {"success": False, "error": str(decision.error()),
                        "approval": decision.summary()}  # fmt: skip
        for stream, data in self.chunks:
            if on_output is not None:
                on_output(stream, data)
        return {"success": True, "stdout": b"".join(d for s, d in self.chunks if s == "stdout")
                .decode()}  # fmt: skip


def gate() -> HITLGate:
    rule = HITLRule(tools=["code_execute"], risk=RiskLevel.HIGH, require_approval=True)
    return HITLGate(RiskClassifier([rule]), ElicitingApprover())


def text_of(result: types.CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return dict(json.loads(first.text))


async def test_output_is_relayed_as_progress_in_order() -> None:
    """Each chunk reaches the client as a progress message (a UTF-8 character split across
    chunks included), numbered 1, 2, ...; without a token nothing is sent."""
    chunks = [("stdout", b"caf\xc3"), ("stdout", b"\xa9\n"), ("stderr", b"warn\n")]
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async with Client(build_server(ScriptedHost(chunks)), mode="legacy") as client:
        result = await client.call_tool("code_execute", {}, progress_callback=on_progress)
        quiet = await client.call_tool("code_execute", {})
    assert "".join(m or "" for _, m in seen) == "café\nwarn\n"
    assert [done for done, _ in seen] == list(range(1, len(seen) + 1))
    assert text_of(result)["stdout"] == "café\n" and not quiet.is_error


@pytest.mark.parametrize(
    ("answer", "runs"),
    [({"action": "accept", "content": {"decision": "approve"}}, True),
     ({"action": "accept", "content": {"decision": "deny"}}, False),
     ({"action": "decline"}, False)],
    ids=["approved", "denied", "declined"],
)  # fmt: skip
async def test_the_gate_asks_the_client(answer: dict[str, Any], runs: bool) -> None:
    """With elicitation declared, the held call is put to the client; its answer decides."""
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(**answer)

    server = build_server(ScriptedHost([("stdout", b"ran\n")], gate()))
    async with Client(server, mode="legacy", elicitation_callback=elicit) as client:
        result = await client.call_tool("code_execute", {"language": "python", "code": "1"})
    assert len(asked) == 1 and "code_execute" in asked[0]
    assert (text_of(result).get("stdout") == "ran\n") is runs and result.is_error is not runs


async def test_without_elicitation_the_call_is_denied_with_the_fix() -> None:
    """No elicitation capability and no fallback: denied, saying how to get approvals."""
    server = build_server(ScriptedHost([("stdout", b"ran\n")], gate()))
    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("code_execute", {"language": "python", "code": "1"})
    assert result.is_error and NOBODY_TO_ASK[:40] in text_of(result)["error"]


async def test_a_crash_is_that_calls_tool_error() -> None:
    """An unexpected exception in a call becomes its tool error; the server keeps serving."""
    async with Client(build_server(ScriptedHost([])), mode="legacy") as client:
        crashed = await client.call_tool("crash", {})
        fine = await client.call_tool("code_execute", {})
    assert crashed.is_error and text_of(crashed)["error"].startswith("InternalError")
    assert not fine.is_error

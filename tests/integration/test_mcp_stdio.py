"""``harombe mcp`` over stdio, driven by the MCP SDK's own client against real gVisor: the tool
list, sessions across calls, output as progress notifications, files, tool errors, and
approvals asked through elicitation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.sandbox import LABEL_SANDBOX
from harombe.service.mcp_approval import DECISION_SCHEMA
from harombe.tools import schemas

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class Person:
    """The human at the client: answers each elicitation with ``answer``, and remembers what
    was asked."""

    def __init__(self, answer: str = "approve") -> None:
        self.answer = answer
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        if self.answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": self.answer})


#: Code the default policy holds (CRITICAL: it starts programs); it prints 42.
HELD = "import subprocess\nprint(6 * 7)"


@contextlib.asynccontextmanager
async def connected(
    person: Person | None = None, *, errlog: TextIO | None = None, **env: str
) -> AsyncIterator[ClientSession]:
    """A ``python -m harombe mcp`` process (HITL gate on, no warm pool) and an initialised
    client session to it; with ``person``, the client declares elicitation. ``errlog`` gets
    the server's stderr."""
    environ = {"HAROMBE__SECURITY__SANDBOX__POOL__SIZE": "0", "PYTHONPATH": str(ROOT), **env}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "harombe", "mcp"], env=environ, cwd=str(ROOT)
    )
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write, elicitation_callback=person) as session,
    ):
        await session.initialize()
        yield session


def body(result: types.CallToolResult) -> dict[str, Any]:
    """The tool's result dict, from the JSON text block (checked equal to structuredContent)."""
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    data = json.loads(first.text)
    assert data == result.structured_content
    return dict(data)


async def run(session: ClientSession, code: str, **more: Any) -> dict[str, Any]:
    result = await session.call_tool("code_execute", {"language": "python", "code": code, **more})
    data = body(result)
    assert result.is_error is (data["success"] is not True)
    return data


async def test_tools_are_listed_with_their_schemas() -> None:
    """tools/list offers the six tools with the schemas and descriptions of harombe.tools."""
    async with connected() as session:
        listed = (await session.list_tools()).tools
    assert [tool.name for tool in listed] == list(schemas.TOOL_NAMES)
    for tool in listed:
        assert tool.input_schema == schemas.input_schema(tool.name)
        assert tool.description == schemas.description(tool.name)


async def test_a_session_keeps_state_and_streams_progress() -> None:
    """Code runs; a second call on the sandbox sees the first's variables; printed output
    arrives as progress notifications, in order, while the program runs."""
    person = Person()
    async with connected(person) as session:
        first = await run(session, "x = 41\nprint('set')")
        assert first["success"] and first["stdout"] == "set\n" and first["runtime"] == "runsc"
        sid = first["sandbox_id"]
        second = await run(session, "x + 1", sandbox_id=sid)
        assert second["result"] == "42" and second["sandbox_id"] == sid

        progress_seen: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            progress_seen.append((progress, message))

        code = (
            "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.4)"
        )
        args = {"language": "python", "code": code, "sandbox_id": sid}
        result = await session.call_tool("code_execute", args, progress_callback=on_progress)
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": sid})
    assert body(result)["stdout"] == "".join(m or "" for _, m in progress_seen)
    assert len(progress_seen) >= 2  # the sleeps keep the four lines apart
    assert [n for n, _ in progress_seen] == list(range(1, len(progress_seen) + 1))
    assert all(p.message.startswith("── approval needed") for p in person.asked)


async def test_files_are_written_read_listed_and_the_sandbox_destroyed() -> None:
    """write_file, read_file and list_files work on a sandbox; after destroy it is gone."""
    async with connected(Person()) as session:
        sid = (await run(session, "pass"))["sandbox_id"]
        wrote = await session.call_tool(
            "code_write_file", {"sandbox_id": sid, "file_path": "notes/a.txt", "content": "hé"}
        )
        assert body(wrote)["success"]
        read = body(await session.call_tool(
            "code_read_file", {"sandbox_id": sid, "file_path": "notes/a.txt"}
        ))  # fmt: skip
        assert read["content"] == "hé"
        listed = body(await session.call_tool(
            "code_list_files", {"sandbox_id": sid, "path": "notes"}
        ))  # fmt: skip
        assert listed["files"] == ["a.txt"]
        gone = await session.call_tool("code_destroy_sandbox", {"sandbox_id": sid})
        assert body(gone)["success"]
        after = await run(session, "1", sandbox_id=sid)
    assert after["error"].startswith("SandboxNotFoundError")


@pytest.mark.parametrize(
    ("name", "arguments", "kind"),
    [
        ("code_execute", {"language": "cobol", "code": "x"}, "InvalidArgumentError"),
        ("code_execute", {"language": "python"}, "InvalidArgumentError"),
        (
            "code_read_file",
            {"sandbox_id": "sandbox-000000000000", "file_path": "a"},
            "SandboxNotFoundError",
        ),
        ("code_teleport", {}, "UnknownToolError"),
    ],
    ids=["bad-language", "missing-code", "unknown-sandbox", "unknown-tool"],
)
async def test_bad_calls_are_tool_errors(name: str, arguments: dict[str, Any], kind: str) -> None:
    """A call the tools refuse is a tool result with isError and the error's kind; the
    server keeps serving."""
    async with connected() as session:
        result = await session.call_tool(name, arguments)
        assert result.is_error and body(result)["error"].startswith(kind)
        assert len((await session.list_tools()).tools) == 6


async def test_an_approved_elicitation_runs_the_call() -> None:
    """The gate asks a call above the automatic level through elicitation, showing the code;
    an approval runs it. Plain code runs without asking."""
    person = Person("approve")
    async with connected(person) as session:
        plain = await run(session, "print(1)")
        result = await run(session, HELD)
        for done in (plain, result):
            await session.call_tool("code_destroy_sandbox", {"sandbox_id": done["sandbox_id"]})
    assert plain["approval"]["status"] == "auto_approved" and plain["stdout"] == "1\n"
    assert result["success"] and result["stdout"] == "42\n"
    assert result["approval"]["decided_by"] == "mcp_elicitation"
    assert len(person.asked) == 1 and "print(6 * 7)" in person.asked[0].message
    asked = person.asked[0]
    assert isinstance(asked, types.ElicitRequestFormParams)
    assert asked.requested_schema == DECISION_SCHEMA


@pytest.mark.parametrize("answer", ["decline", "deny"], ids=["declined", "deny-chosen"])
async def test_a_refused_elicitation_runs_nothing(answer: str) -> None:
    """Declining (or choosing deny) denies the call: nothing runs in the sandbox."""
    person = Person("approve")
    async with connected(person) as session:
        sid = (await run(session, "pass"))["sandbox_id"]
        person.answer = answer
        code = "import subprocess\nopen('/workspace/ran', 'w').write('x')"
        denied = await run(session, code, sandbox_id=sid)
        person.answer = "approve"
        listed = body(await session.call_tool("code_list_files", {"sandbox_id": sid}))
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": sid})
    assert denied["error"].startswith("ApprovalDeniedError")
    assert denied["approval"]["status"] == "denied"
    assert "ran" not in listed["files"]


async def test_without_elicitation_plain_code_runs_and_critical_is_denied_at_once(
    tmp_path: Path,
) -> None:
    """A client that cannot be asked (the README's one-line config): plain code runs at once; a
    CRITICAL call is denied at once (not held for a timeout), told how to get approvals; the
    server's first line on stderr says so."""
    with (tmp_path / "stderr").open("w+") as errlog:
        async with connected(None, errlog=errlog) as session:
            plain = await run(session, "print(6*7)")
            denied = await run(session, HELD)
            await session.call_tool("code_destroy_sandbox", {"sandbox_id": plain["sandbox_id"]})
        errlog.seek(0)
        first_line = errlog.readline().strip()
    assert plain["stdout"] == "42\n" and plain["approval"]["status"] == "auto_approved"
    assert denied["error"].startswith("ApprovalDeniedError") and denied.get("sandbox_id") is None
    assert denied["approval"]["status"] == "denied"  # at once, not a timeout
    assert "elicitation" in denied["error"] and "auto_approve_up_to" in denied["error"]
    assert first_line == (
        "approvals: calls up to HIGH run at once; CRITICAL calls are asked through MCP "
        "elicitation when the client supports it, else denied"
    )


async def test_with_the_gate_off_calls_run_without_asking() -> None:
    """security.hitl.enabled false (as the library does): nothing is asked, code runs."""
    person = Person("deny")
    async with connected(person, HAROMBE__SECURITY__HITL__ENABLED="false") as session:
        result = await run(session, "print('free')")
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": result["sandbox_id"]})
    assert result["stdout"] == "free\n" and person.asked == []


async def test_stopping_the_server_removes_its_sandboxes(docker_manager: DockerManager) -> None:
    """When the client disconnects, the server removes every sandbox it made."""
    async with connected(HAROMBE__SECURITY__HITL__ENABLED="false") as session:
        sid = (await run(session, "pass"))["sandbox_id"]
        alive = await docker_manager.list_containers({LABEL_SANDBOX: sid})
    assert len(alive) == 1
    assert await docker_manager.list_containers({LABEL_SANDBOX: sid}) == []


def _children() -> list[int]:
    """Ids of this process's child processes (the spawned server)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:
                    found.append(int(entry.name))
    return found


async def test_sigterm_removes_the_sandboxes(docker_manager: DockerManager) -> None:
    """SIGTERM to the server, with the client still connected, removes its sandboxes and ends it."""
    before = set(_children())
    with contextlib.suppress(Exception):
        async with connected(HAROMBE__SECURITY__HITL__ENABLED="false") as session:
            sid = (await run(session, "pass"))["sandbox_id"]
            (server,) = set(_children()) - before
            os.kill(server, signal.SIGTERM)
            for _ in range(600):  # the client's stream ends when the server exits
                await session.send_ping()
                await asyncio.sleep(0.05)
    assert await docker_manager.list_containers({LABEL_SANDBOX: sid}) == []

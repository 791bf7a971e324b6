"""``HAROMBE_LOG_JSON`` on every command, as a process against real gVisor: the audit file holds
every audit event (``hitl.decided``, ``tool.called``, ``sandbox.*``) although the console shows
only warnings; stderr stays free of info lines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 180.0  # a cold sandbox on a loaded 2-core machine


def environment(audit: Path, **more: str) -> dict[str, str]:
    """This environment without HAROMBE_* settings, with the audit file and no warm pool."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    return {**clean, "PYTHONPATH": str(ROOT), "HAROMBE_LOG_JSON": str(audit),
            "HAROMBE__SECURITY__SANDBOX__POOL__SIZE": "0", **more}  # fmt: skip


def events(audit: Path) -> list[dict[str, Any]]:
    lines = audit.read_text().splitlines()
    found = [json.loads(line) for line in lines]
    assert all(e["timestamp"].endswith("Z") and e["level"] for e in found), found
    return found


def names(audit: Path) -> set[str]:
    return {e["event"] for e in events(audit)}


def harombe(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harombe", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=WAIT_S)  # fmt: skip


def test_run_writes_its_audit_events(tmp_path: Path) -> None:
    """`harombe run`: sandbox and tool events in the file; the console shows only the output."""
    audit, program = tmp_path / "audit.jsonl", tmp_path / "p.py"
    program.write_text("print(6*7)\n")
    done = harombe("run", str(program), env=environment(audit))
    assert done.returncode == 0 and done.stdout == "42\n", done
    assert done.stderr == ""
    assert {"sandbox_manager.started", "sandbox.created", "tool.called"} <= names(audit)
    (called,) = [e for e in events(audit) if e["event"] == "tool.called"]
    assert called["tool"] == "code_execute" and called["level"] == "info"


def test_a_gated_run_writes_the_decision(tmp_path: Path) -> None:
    """`harombe run` behind the config's HITL gate, with no terminal: hitl.decided (denied)."""
    audit, program, config = tmp_path / "audit.jsonl", tmp_path / "p.py", tmp_path / "c.yaml"
    program.write_text("print(6*7)\n")
    # Asked at HIGH (plain code), which nobody can answer without a terminal: denied.
    config.write_text("security:\n  hitl:\n    enabled: true\n    auto_approve_up_to: medium\n")
    done = harombe("run", "--config", str(config), str(program), env=environment(audit))
    assert done.returncode == 1 and "ApprovalDeniedError" in done.stderr, done
    (decided,) = [e for e in events(audit) if e["event"] == "hitl.decided"]
    assert decided["decision"] == "denied" and decided["tool"] == "code_execute"
    assert "tool.called" in names(audit)


def test_shell_writes_its_audit_events(tmp_path: Path) -> None:
    """`harombe shell` (piped input): the sandbox it made and removed is in the file."""
    audit = tmp_path / "audit.jsonl"
    done = harombe("shell", env=environment(audit), stdin="echo $((6*7))\nexit 3\n")
    assert done.returncode == 3, done
    assert {"sandbox_manager.started", "sandbox.created", "sandbox_manager.stopped"} <= names(audit)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_writes_the_audit_events_of_a_request(tmp_path: Path) -> None:
    """`harombe serve` and one POST /execute (approved on the approvals API if it is held):
    the decision, the tool call and its sandbox are in the file; stderr has no info line."""
    audit, port = tmp_path / "audit.jsonl", free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harombe", "serve", "--port", str(port), cwd=ROOT,
        env=environment(audit), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        async with asyncio.timeout(WAIT_S):
            while b"approvals page:" not in (line := await process.stderr.readline()):
                assert line, "harombe serve exited before it printed the approvals page"
        key = line.decode().rsplit("key=", 1)[1].strip()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as http:
            async with asyncio.timeout(WAIT_S):
                while True:
                    try:
                        if (await http.get("/v1/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        assert process.returncode is None, "harombe serve exited"
                    await asyncio.sleep(0.2)
                call = asyncio.ensure_future(http.post("/execute", json={"code": "print(6*7)"}))
                person = {"Authorization": f"Bearer {key}"}
                while not call.done():  # a person on the approvals page, if the call is held
                    pending = await http.get("/v1/approvals", headers=person)
                    for held in pending.json()["approvals"]:
                        await http.post(f"/v1/approvals/{held['id']}", headers=person,
                                        json={"decision": "approve"})  # fmt: skip
                    await asyncio.wait([call], timeout=0.2)
                answer = await call
        assert answer.status_code == 200 and answer.json()["stdout"] == "42\n", answer.text
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), WAIT_S)
    found = events(audit)
    assert {"hitl.decided", "tool.called", "sandbox.created"} <= {e["event"] for e in found}
    # Plain code runs at once under the default policy (held and approved if it were not).
    decisions = [e["decision"] for e in found if e["event"] == "hitl.decided"]
    assert decisions in (["auto_approved"], ["approved"]), decisions
    assert b"[info" not in stderr, stderr.decode()


async def test_mcp_writes_the_audit_events_of_a_tool_call(tmp_path: Path) -> None:
    """`harombe mcp` over stdio and one code_execute (approved through elicitation): the
    decision, the tool call and its sandbox are in the file."""
    audit = tmp_path / "audit.jsonl"

    async def approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    params = StdioServerParameters(command=sys.executable, args=["-m", "harombe", "mcp"],
                                   env=environment(audit), cwd=str(ROOT))  # fmt: skip
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, elicitation_callback=approve) as session,
    ):
        await session.initialize()
        result = await session.call_tool("code_execute", {"language": "python",
                                                          "code": "print(6*7)"})  # fmt: skip
    assert not result.is_error, result
    found = events(audit)
    assert {"hitl.decided", "tool.called", "sandbox.created"} <= {e["event"] for e in found}
    called = [e for e in found if e["event"] == "tool.called"]
    assert [e["tool"] for e in called] == ["code_execute"]

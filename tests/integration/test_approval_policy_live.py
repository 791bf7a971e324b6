"""The one approval policy on real gVisor: ``harombe serve`` with no config answers plain code
at once and holds a CRITICAL call on the approvals page until its timeout; the library's
tools, ``run_sandboxed`` and ``harombe run --mnt`` build the config's gate."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from harombe.config import parse_config
from harombe.errors import ApprovalDeniedError
from harombe.mounts import run_sandboxed_async
from harombe.security.approval import approvers
from harombe.security.hitl import HITLGate
from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.manager import SandboxManager
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The default policy holds this (it starts programs: CRITICAL).
CRITICAL = "import subprocess\nprint('never')"
#: Environment of a harombe process with no config of the caller's.
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("HAROMBE_", "HAROMBE__"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(env: Mapping[str, str]) -> AsyncIterator[tuple[str, list[str]]]:
    """``harombe serve`` on a free port with ``env``; its base URL and its stderr lines so far
    (read until it answers). Stopped with SIGTERM afterwards."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harombe", "serve", "--port", str(port),
        env={**env, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    base = f"http://127.0.0.1:{port}"
    try:
        while not any(line.startswith("approvals:") for line in lines):
            raw = await asyncio.wait_for(process.stderr.readline(), 60)
            assert raw, f"harombe serve ended early: {lines}"
            lines.append(raw.decode().rstrip("\n"))
        async with httpx.AsyncClient(base_url=base) as http:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield base, lines
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 60)


async def test_serve_with_no_config_answers_plain_code_at_once() -> None:
    """The README's serve + curl: {"code": "print(6*7)"} answers 42 without anyone asked, and
    the start-up line says CRITICAL calls go to the approvals page."""
    async with (
        serving(CLEAN) as (base, lines),
        httpx.AsyncClient(base_url=base, timeout=60) as http,
    ):
        answer = await http.post("/execute", json={"code": "print(6*7)"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "42\n"
    policy = [line for line in lines if line.startswith("approvals:")]
    assert policy == [
        f"approvals: calls up to HIGH run at once; CRITICAL calls are asked through MCP "
        f"elicitation when the client supports it, else held on {base}/approvals and denied "
        "after the rule's timeout"
    ]


async def test_serve_holds_a_critical_call_and_denies_it_on_timeout(tmp_path: Path) -> None:
    """A CRITICAL call (/v1: the fips endpoint's profile refuses subprocess before the gate)
    is held on the approvals page, listed to its caller, and, unanswered, denied when its
    rule's timeout (2 s here) runs out."""
    config = tmp_path / "harombe.yaml"
    config.write_text(
        "security:\n  hitl:\n    rules:\n      - tools: [code_execute]\n        risk: critical\n"
        "        timeout: 2\n        conditions: [{param: code, matches: subprocess}]\n"
    )
    async with (
        serving({**CLEAN, "HAROMBE_CONFIG": str(config)}) as (base, _),
        httpx.AsyncClient(base_url=base, timeout=60) as http,
    ):
        made = await http.post("/v1/sandboxes", json={})
        assert made.status_code == 201, made.text
        run = f"/v1/sandboxes/{made.json()['sandbox_id']}/execute"
        call = asyncio.ensure_future(http.post(run, json={"code": CRITICAL}))
        held: list[dict[str, object]] = []
        for _ in range(200):
            held = (await http.get("/v1/approvals")).json()["approvals"]
            if held or call.done():
                break
            await asyncio.sleep(0.05)
        answer = await call
        after = (await http.get("/v1/approvals")).json()["approvals"]
    assert [(h["risk"], h["timeout_s"]) for h in held] == [("CRITICAL", 2.0)], answer.text
    assert answer.status_code == 403 and answer.json()["kind"] == "ApprovalDeniedError"
    assert "no answer within 2 s" in answer.json()["message"] and after == []


@pytest.fixture
def no_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approvers, "stdin_is_tty", lambda: False)


async def test_the_library_builds_the_configs_gate(
    docker_manager: DockerManager, no_tty: None
) -> None:
    """CodeExecutionTools(manager) with security.hitl.enabled: true: the gate is built; plain
    code runs at once, a CRITICAL call is denied at once (no terminal) and makes no sandbox."""
    config = parse_config({"security": {"hitl": {"enabled": True},
                                        "sandbox": {"pool": {"size": 0}}}})  # fmt: skip
    manager = SandboxManager(docker_manager, config=config)
    await manager.start()
    try:
        tools = CodeExecutionTools(manager)
        plain = await tools.code_execute(language="python", code="print(6*7)")
        before = set(manager.sandboxes)
        denied = await tools.code_execute(language="python", code=CRITICAL)
        after = set(manager.sandboxes)
    finally:
        await manager.stop()
    assert isinstance(tools.hitl_gate, HITLGate)
    assert plain["stdout"] == "42\n" and plain["approval"]["status"] == "auto_approved"
    assert (
        denied["error"].startswith("ApprovalDeniedError")
        and "stdin is not a terminal" in (denied["error"])
    )
    assert denied["approval"]["status"] == "denied" and after == before


async def test_run_sandboxed_decides_with_the_configs_gate(
    docker_manager: DockerManager, no_tty: None, tmp_path: Path
) -> None:
    """run_sandboxed: plain code runs; a CRITICAL program is refused before any sandbox."""
    manager = SandboxManager(docker_manager, config=parse_config({}))
    await manager.start()
    try:
        result, _ = await run_sandboxed_async("print(6*7)", mnt_dir=tmp_path, manager=manager)
        with capture_events() as events, pytest.raises(ApprovalDeniedError, match="CRITICAL"):
            await run_sandboxed_async(CRITICAL, mnt_dir=tmp_path, manager=manager)
    finally:
        await manager.stop()
    assert result["stdout"] == "42\n"
    assert [e for e in events if e["event"] == "sandbox.created"] == []
    assert [e["surface"] for e in events if e["event"] == "hitl.policy_announced"] == [
        "run_sandboxed"
    ]


async def test_run_mnt_runs_behind_a_configured_gate(tmp_path: Path) -> None:
    """harombe run --mnt with security.hitl configured is no longer refused: plain code runs,
    a CRITICAL program is denied (no terminal on stdin), and the first line says the policy."""
    env = {**CLEAN, "HAROMBE__SECURITY__HITL__ENABLED": "true", "PYTHONPATH": str(ROOT)}
    (tmp_path / "plain.py").write_text("open('out.txt', 'w').write('42')\n")
    (tmp_path / "risky.py").write_text(CRITICAL)
    codes, errs = [], []
    for name in ("plain.py", "risky.py"):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harombe", "run", "--mnt", str(tmp_path),
            str(tmp_path / name), env=env, cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 120)
        codes.append(process.returncode)
        errs.append(err.decode())
    assert codes == [0, 1], errs
    assert (tmp_path / "out.txt").read_text() == "42"
    assert errs[0].splitlines()[0] == (
        "harombe run: approvals: calls up to HIGH run at once; CRITICAL calls are denied (no "
        "terminal to ask on; set security.hitl.approver)"
    )
    assert "ApprovalDeniedError" in errs[1] or "needs approval at risk CRITICAL" in errs[1]

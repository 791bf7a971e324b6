"""Claims of docs/agents.md that need no Docker: dispatch goes through the gate and the audit
log as a direct call does, the unknown-tool message, a binary read is the same read to the gate
and to the size cap, and the command line imports a command only when it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harombe.cli import COMMANDS, main
from harombe.cli.common import hitl_requested
from harombe.cli.sandboxes import describe
from harombe.config import load_config
from harombe.security.approval.approvers import deny_all
from harombe.security.hitl import HITLGate
from harombe.security.runtime.backend import ContainerInfo
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_SANDBOX
from harombe.testing import ScriptedApprover, capture_events
from harombe.tools import TOOL_NAMES, dispatch
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit.fake_manager import container_of, running

ROOT = Path(__file__).resolve().parents[2]


def _audit(events: list[Any]) -> list[tuple[str, Any, Any, Any]]:
    """The tool and gate events of a call, without ids and timings that differ per call."""
    return [
        (e["event"], e.get("tool"), e.get("success"), e.get("error_kind"))
        for e in events
        if e["event"].startswith(("tool.", "hitl."))
    ]


async def test_dispatch_is_held_by_the_gate_and_audited_as_a_direct_call() -> None:
    """A model's call through dispatch is denied by the gate exactly as the same direct call
    is: same result error, same audit events, nothing started."""
    async with running() as (docker, manager):
        tools = CodeExecutionTools(manager, hitl_gate=HITLGate(approver=deny_all))
        with capture_events() as direct_events:
            direct = await tools.code_execute(language="python", code="print(1)")
        with capture_events() as dispatched_events:
            dispatched = await dispatch(
                tools, "code_execute", '{"language": "python", "code": "print(1)"}'
            )
        assert dispatched["success"] is False
        assert dispatched["error"].startswith("ApprovalDeniedError")
        assert dispatched["error"] == direct["error"]
        assert dispatched["approval"]["status"] == direct["approval"]["status"] == "denied"
        assert _audit(dispatched_events) == _audit(direct_events)
        assert any(e[0] == "tool.called" for e in _audit(dispatched_events))
        assert not manager.sandboxes and not docker.containers


async def test_an_unknown_tool_is_named_with_the_six_tools() -> None:
    """dispatch of a made-up name: 'UnknownToolError: no tool named 'python'; the tools are
    code_execute, …' as the docs show it."""
    async with running() as (_, manager):
        result = await dispatch(
            CodeExecutionTools(manager, hitl_gate=None), "python", {"code": "1"}
        )
    assert result["success"] is False
    assert result["error"] == (
        f"UnknownToolError: no tool named 'python'; the tools are {', '.join(TOOL_NAMES)}"
    )


async def test_a_binary_read_asks_the_same_approval_as_a_text_read() -> None:
    """The gate is shown the same operation, risk and reasons for encoding='base64' as for a
    text read of the same path."""
    async with running() as (_, manager):
        approver = ScriptedApprover(default=True)
        tools = CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approver))
        sid = (await tools.code_execute(language="python", code="1"))["sandbox_id"]
        assert (await tools.code_write_file(sid, "a.txt", "hello"))["success"]
        approver.requests.clear()
        text = await tools.code_read_file(sid, "a.txt")
        binary = await tools.code_read_file(sid, "a.txt", encoding="base64")
        assert text["success"] and binary["success"], (text, binary)
        asked_text, asked_binary = approver.requests
    assert asked_text.operation.tool_name == asked_binary.operation.tool_name == "code_read_file"
    assert dict(asked_text.operation.params) == dict(asked_binary.operation.params)
    assert "encoding" not in asked_binary.operation.params
    assert (asked_text.risk, asked_text.reasons) == (asked_binary.risk, asked_binary.reasons)


@pytest.mark.parametrize("encoding", ["utf-8", "base64"])
async def test_max_file_bytes_caps_both_encodings(encoding: str) -> None:
    """A file larger than max_file_bytes is refused whichever encoding is asked for; one
    within it is read."""
    async with running(limits={"max_file_bytes": 64}) as (docker, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(language="python", code="1"))["sandbox_id"]
        container = container_of(docker, sid)
        assert container is not None
        files = docker.guest(container).files
        files["/workspace/small.bin"] = b"\x00" * 64
        files["/workspace/big.bin"] = b"\x00" * 65
        small = await tools.code_read_file(sid, "small.bin", encoding=encoding)
        big = await tools.code_read_file(sid, "big.bin", encoding=encoding)
    assert small["read_bytes"] == 64
    assert big["success"] is False and "max_file_bytes" in big["error"], big


@pytest.mark.parametrize("words", [["mcp"], ["shell"]], ids=["mcp", "shell"])
def test_mcp_and_shell_answer_help_with_their_options(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`harombe mcp --help` and `harombe shell --help` exist with the options the docs name."""
    assert main([*words, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: harombe {words[0]}" in out and "--config" in out
    if words == ["shell"]:
        for option in ("--language", "--sandbox", "--memory-mb", "--cpus", "--disk-mb", "--pids"):
            assert option in out, option


def test_verbose_comes_before_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`harombe -v mcp` is accepted: -v is the group's option (log events on stderr)."""
    assert main(["-v", "mcp", "--help"]) == 0
    assert "Usage: harombe mcp" in capsys.readouterr().out


def test_a_command_is_imported_only_when_it_runs() -> None:
    """`harombe --help` lists every command without importing any command's module."""
    probe = (
        "import sys\nfrom harombe.cli import main\ncode = main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('harombe.cli.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    imported = done.stdout.strip().splitlines()[-1]
    for module_name in {module for module, _, _ in COMMANDS.values()}:
        assert f"'harombe.cli.{module_name}'" not in imported, imported
    assert "mcp" in done.stdout and "shell" in done.stdout


@pytest.mark.parametrize(
    ("environ", "gated"),
    [({}, False), ({"HAROMBE__SECURITY__HITL__ENABLED": "true"}, True),
     ({"HAROMBE__SECURITY__HITL__ENABLED": "false"}, False)],
    ids=["no-variable", "enabled", "disabled"],
)  # fmt: skip
def test_a_hitl_variable_turns_the_command_line_gate_on(
    environ: dict[str, str], gated: bool
) -> None:
    """A HAROMBE__SECURITY__HITL__* variable counts as a security.hitl section for the CLI."""
    assert hitl_requested(load_config(environ=environ)) is gated


def test_an_ls_row_has_every_column_the_docs_list() -> None:
    """`harombe ls --json` rows: id, container, language, image, owner pid and liveness, age,
    state, pooled."""
    labels = {LABEL_MANAGED: "1", LABEL_SANDBOX: "sandbox-0123456789ab", "harombe.owner": "",
              "harombe.language": "python"}  # fmt: skip
    info = ContainerInfo(id="c" * 64, name="harombe-x", status="running", labels=labels,
                         image="harombe/sandbox:latest", created_s=1000.0)  # fmt: skip
    row = describe(info, now_s=1030.0, hostname="here")
    assert set(row) >= {"sandbox_id", "container_id", "language", "image", "owner_pid",
                        "owner_alive", "age_s", "state", "pooled"}  # fmt: skip
    assert (row["container_id"], row["pooled"]) == ("c" * 12, False)


def test_the_documented_size_defaults() -> None:
    """max_output_bytes is 1 MiB and max_file_bytes 64 MiB by default, as the docs say."""
    limits = load_config(environ={}).security.sandbox.limits
    assert (limits.max_output_bytes, limits.max_file_bytes) == (1_048_576, 64 * 1_048_576)

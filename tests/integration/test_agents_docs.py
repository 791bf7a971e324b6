"""Claims of docs/agents.md shown against real gVisor: the shell's size options, its
environment and `tty`, readline's Ctrl-P, `harombe run --allow-domain`, the llm-mode example's
numbers, stdout and stderr cut on their own, max_file_bytes for binary reads, and SIGINT
to `harombe mcp`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.runtime.sandbox import LABEL_SANDBOX
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from tests.integration.test_cli_shell import CLI, Tmux, containers_of, plain
from tests.integration.test_mcp_stdio import _children, connected, run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The built-in configuration for each command (no overrides from the caller's shell).
ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}


def test_shell_options_size_the_sandbox_and_host_env_stays_out() -> None:
    """`harombe shell --pids 64 --disk-mb 48`: ulimit -u is 64, /workspace is at most 48 MiB,
    and a variable of the host's is not visible inside (HOME is the sandbox's)."""
    script = (
        "echo pids=$(ulimit -u)\n"
        "echo disk_kb=$(df -k /workspace | tail -n 1 | awk '{print $2}')\n"
        "echo canary=${HAROMBE_DOCS_CANARY:-absent} home=$HOME\n"
        "exit 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "harombe", "shell", "--pids", "64", "--disk-mb", "48"],
        cwd=ROOT, input=script, capture_output=True, text=True, timeout=300,
        env={**ENV, "HAROMBE_DOCS_CANARY": "leaked"},
    )  # fmt: skip
    out = plain(done.stdout)
    assert done.returncode == 0, done
    assert re.search(r"^pids=64$", out, re.M), out
    disk_kb = int(re.search(r"^disk_kb=(\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
    assert 0 < disk_kb <= 48 * 1024, out
    assert re.search(r"^canary=absent home=/home/sandbox$", out, re.M), out


def test_on_a_terminal_tty_says_not_a_tty_and_ctrl_p_recalls_the_last_line() -> None:
    """Inside `harombe shell` on a real terminal: `test -t 0` holds but `tty` prints "not a
    tty"; Ctrl-P is readline's previous line (not held back as Docker's detach prefix)."""
    term = Tmux(CLI)
    try:
        sandbox_id = term.wait_for(r"in sandbox (sandbox-[0-9a-f]{12})").group(1)
        term.wait_for(r"sandbox@sandbox:/workspace\$\s*$")
        term.run("test -t 0 && echo terminal-$(tty)", expect=r"^terminal-not a tty$")
        term.run("echo recalled-$((40+2))", expect=r"^recalled-42$")
        before = len(term.screen().rstrip())
        term.keys("C-p")
        term.keys("Enter")
        term.wait_for(r"^recalled-42$", after=before)
        term.run("exit 0", expect=r"^EXITED=0$")
        assert containers_of(sandbox_id) == []
    finally:
        term.kill()


def test_allow_domain_implies_network() -> None:
    """`harombe run --allow-domain NAME` gives the program a network interface besides `lo`;
    without it, only `lo` exists."""
    listing = "ls /sys/class/net | sort | paste -sd' '\n"

    def interfaces(*options: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "harombe", "run", "-", "-l", "shell", *options],
            cwd=ROOT, input=listing, capture_output=True, text=True, timeout=300, env=ENV,
        )  # fmt: skip
        assert done.returncode == 0, done
        return done.stdout.strip()

    assert interfaces() == "lo"
    with_network = interfaces("--allow-domain", "example.com").split()
    assert "lo" in with_network and len(with_network) >= 2, with_network


async def test_the_llm_example_prints_what_the_docs_show(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """The docs' 100,000-line example: head ends at line 467, tail starts at line 99629, and the
    marker gives 1,080,707 bytes (99,161 lines) cut of 1,088,895 bytes (100,000 lines)."""
    result = await tools.code_execute(
        language="python", sandbox_id=fresh_sandbox, output_mode="llm",
        code="for i in range(1, 100_001): print(f'line {i}')",
    )  # fmt: skip
    lines = result["stdout"].splitlines()
    marker_at = next(i for i, line in enumerate(lines) if line.startswith("[harombe: "))
    marker = lines[marker_at]
    assert (lines[0], lines[marker_at - 1]) == ("line 1", "line 467")
    assert (lines[marker_at + 1], lines[-1]) == ("line 99629", "line 100000")
    path = result["output_files"]["stdout"]
    assert re.fullmatch(r"\.harombe/output/call-\d+\.stdout", path)
    assert marker == (
        "[harombe: 1,080,707 bytes (99,161 lines) of stdout cut here; the full stdout "
        f"(1,088,895 bytes, 100,000 lines) is saved in /workspace/{path}: read it with "
        f"code_read_file(file_path='{path}'), or page it with code_execute(language='shell', "
        f"code=\"sed -n '1,200p' {path}\")]"
    )


async def test_stdout_and_stderr_are_cut_on_their_own(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A long stdout and a long stderr in one call: each has its own marker and saved file;
    a short stream beside a long one comes back whole."""
    both = await tools.code_execute(
        language="shell", sandbox_id=fresh_sandbox, output_mode="llm",
        code="seq 1 20000; seq 1 20000 >&2",
    )  # fmt: skip
    assert set(both["output_files"]) == {"stdout", "stderr"}
    assert both["output_files"]["stdout"].endswith(".stdout")
    assert both["output_files"]["stderr"].endswith(".stderr")
    assert "of stdout cut here" in both["stdout"] and "of stderr cut here" in both["stderr"]
    assert both["stdout_truncated"] and both["stderr_truncated"]
    one = await tools.code_execute(
        language="shell", sandbox_id=fresh_sandbox, output_mode="llm",
        code="seq 1 20000; echo short >&2",
    )  # fmt: skip
    assert set(one["output_files"]) == {"stdout"} and one["stderr"] == "short\n"
    assert not one["stderr_truncated"]


@pytest.fixture
async def capped_tools(docker_manager: DockerManager) -> AsyncIterator[CodeExecutionTools]:
    """Tools whose manager reads and writes files of at most 1,024 bytes."""
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 0}, "limits": {"max_file_bytes": 1024},
    }}})  # fmt: skip
    manager = SandboxManager(docker_manager, config=config)
    await manager.start()
    yield CodeExecutionTools(manager, hitl_gate=None)
    await manager.stop()


@pytest.mark.parametrize("encoding", ["utf-8", "base64"])
async def test_max_file_bytes_caps_a_binary_read_as_a_text_read(
    capped_tools: CodeExecutionTools, encoding: str
) -> None:
    """In a real sandbox, a file over max_file_bytes is refused in either encoding; one at the
    cap is read."""
    made = await capped_tools.code_execute(
        language="shell", code="head -c 1024 /dev/zero > at.bin; head -c 1025 /dev/zero > over.bin"
    )
    sid = made["sandbox_id"]
    try:
        assert made["success"], made
        at = await capped_tools.code_read_file(sid, "at.bin", encoding=encoding)
        over = await capped_tools.code_read_file(sid, "over.bin", encoding=encoding)
    finally:
        await capped_tools.code_destroy_sandbox(sid)
    assert at["success"] and at["read_bytes"] == 1024, at
    assert over["success"] is False and "max_file_bytes" in over["error"], over


async def test_sigint_to_the_mcp_server_removes_its_sandboxes(
    docker_manager: DockerManager,
) -> None:
    """SIGINT to `harombe mcp`, with the client still connected, removes its sandboxes, as
    SIGTERM and a disconnect do."""
    before = set(_children())
    sid = ""
    with contextlib.suppress(Exception):
        async with connected(HAROMBE__SECURITY__HITL__ENABLED="false") as session:
            sid = (await run(session, "pass"))["sandbox_id"]
            (server,) = set(_children()) - before
            os.kill(server, signal.SIGINT)
            for _ in range(600):  # the client's stream ends when the server exits
                await session.send_ping()
                await asyncio.sleep(0.05)
    assert sid.startswith("sandbox-")
    assert await docker_manager.list_containers({LABEL_SANDBOX: sid}) == []


def test_a_run_file_is_its_own_main_program(tmp_path: Path) -> None:
    """`harombe run file.py` runs the file as a fresh process, as `python file.py` does: its
    __name__ is '__main__' and no session interpreter is around it."""
    path = tmp_path / "probe.py"
    path.write_text("import sys\nprint(__name__, len(sys.argv), 'worker' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-m", "harombe", "run", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=ENV)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "__main__ 1 False\n"), done

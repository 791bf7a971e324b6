"""Every shell block of README.md and docs/*.md marked ``<!-- runnable -->`` runs verbatim
against real gVisor and prints what the docs show (the convention: ``tests/docs_blocks.py`` and
docs/architecture.md, "Docs that run").

How a block runs, as a reader runs it on a fresh set-up:
- its commands, verbatim, one after the other in one ``bash`` with the repository as the
  working directory, no ``HAROMBE_*`` variables, ``.venv/bin`` first on ``PATH`` (as after
  ``source .venv/bin/activate``), stdin empty and temporary files in a directory of the test;
- every command must exit 0 and print its expected output, if the docs show one;
- ``serve``: ``harombe serve`` runs in the background (a second terminal) on 127.0.0.1:8000 —
  the block's own ``harombe serve`` line, verbatim, else the README's ``.venv/bin/harombe
  serve`` — and is stopped with Ctrl-C (SIGINT) afterwards: it exits 130 within 90 s, as
  docs/service.md says. Port 8000 in use before it starts is a failure, never another port;
- the block's commands get ``timeout=`` seconds in all (default 30), then SIGTERM and SIGKILL;
- no sandbox that a process of the block made is left in Docker afterwards.

An unmarked shell block fails at collection (``shell_blocks`` raises), so new docs cannot skip
this test in silence."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from harombe.cli.common import EXIT_INTERRUPTED
from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_OWNER
from tests.docs_blocks import Block, Marker, Step, mismatch, shell_blocks

ROOT = Path(__file__).resolve().parents[2]
PORT = 8000  # the docs' own: `curl -s localhost:8000/...`
DEFAULT_SERVE = ".venv/bin/harombe serve"  # the README's command
SERVE_UP_S = 90.0  # a cold start on a loaded machine: images checked, the sweep, the pool
STOP_S = 90.0  # SIGINT lets running calls finish (up to 60 s), then removes the sandboxes
TERM_GRACE_S = 30.0  # a timed-out block: SIGTERM, then SIGKILL after this
_END = "\x1e"  # ends each command's stdout in the script's output

RUNNABLE = [b for b in shell_blocks(ROOT) if b.marker is not None and b.marker.runnable]


@dataclass
class BlockRun:
    problems: list[str] = field(default_factory=list)
    owners: set[str] = field(default_factory=set)  # harombe.owner labels of the block's processes


class _Owners:
    """Records ``host:pid:starttime`` of every process in the given sessions, as harombe labels
    its containers, by scanning /proc while the block runs."""

    def __init__(self, found: set[str]) -> None:
        self._found = found
        self._sessions: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._host = socket.gethostname()

    def watch(self, session: int) -> None:
        self._sessions.add(session)

    def __enter__(self) -> _Owners:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._scan()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._scan()

    def _scan(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) in self._sessions:
                self._found.add(f"{self._host}:{entry.name}:{fields[19]}")


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp)
    return env


def _port_in_use() -> bool:
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
    except OSError:
        return False
    return True


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return text[-chars:]


def _start_serve(command: str, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    if not (ROOT / ".venv" / "bin" / "harombe").exists():
        raise AssertionError(
            f"{ROOT}/.venv/bin/harombe does not exist: the docs run it from the set-up's venv "
            "(scripts/setup.sh makes .venv; a link to another venv does too)"
        )
    if _port_in_use():
        raise AssertionError(
            f"port {PORT} on 127.0.0.1 is already in use: the docs' blocks use "
            f"localhost:{PORT} as written; stop what listens there and run again"
        )
    return subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", command], cwd=ROOT, env=env,
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_until_serving(process: subprocess.Popen[bytes], log: Path) -> str | None:
    deadline = time.monotonic() + SERVE_UP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"harombe serve exited {process.returncode} before it listened:\n{_tail(log)}"
        if _port_in_use():
            return None
        time.sleep(0.2)
    return f"harombe serve did not listen on {PORT} within {SERVE_UP_S:.0f} s:\n{_tail(log)}"


def _stop(process: subprocess.Popen[bytes], first: signal.Signals, grace_s: float) -> int | None:
    """Signals the process group; SIGKILL after ``grace_s``. The exit code, None if killed."""
    if process.poll() is not None:
        return process.returncode  # gone already: its group id may not be ours any more
    try:
        os.killpg(process.pid, first)
        return process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
    except ProcessLookupError:
        return process.wait()


def _script(steps: list[Step], tmp: Path) -> str:
    """The commands verbatim, each with its stderr to a file of its own and its exit code
    after its stdout."""
    lines: list[str] = []
    for n, step in enumerate(steps):
        lines.append(f"exec 2>{shlex.quote(str(tmp / f'stderr.{n}'))}")
        lines.append(step.command)
        lines.append(f"printf '{_END}%s{_END}' \"$?\"")
    return "\n".join(lines) + "\n"


def _judge(block: Block, steps: list[Step], stdout: str, tmp: Path) -> list[str]:
    parts = stdout.split(_END)
    problems: list[str] = []
    for n, step in enumerate(steps):
        shown = f"{block.path}:{step.line} `{step.command}`"
        stderr = _tail(tmp / f"stderr.{n}", 1500)
        if 2 * n + 1 >= len(parts):
            problems.append(f"{shown}: did not finish\n  stdout: {parts[-1][:1500]!r}\n"
                            f"  stderr: {stderr!r}")  # fmt: skip
            break
        out, code = parts[2 * n], parts[2 * n + 1]
        if code != "0":
            problems.append(f"{shown}: exit {code}\n  stdout: {out[:1500]!r}\n  stderr: {stderr!r}")
        elif step.expected is not None and (why := mismatch(step.expected, out)):
            problems.append(f"{shown}: not the output shown: {why}\n  stderr: {stderr!r}")
    return problems


def run_block(block: Block, tmp: Path) -> BlockRun:
    """Runs a runnable block as the module docstring says; returns what went wrong."""
    assert block.marker is not None
    steps = block.steps()
    commands = [s for s in steps if not s.starts_serve]
    serve_line = next((s.command for s in steps if s.starts_serve), DEFAULT_SERVE)
    env = _env(tmp)
    run = BlockRun()
    serve_log = tmp / "serve.log"
    with _Owners(run.owners) as owners, open(serve_log, "wb") as log:
        server = None
        if block.marker.serve:
            server = _start_serve(serve_line, env, log)
            owners.watch(server.pid)
            if why := _wait_until_serving(server, serve_log):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait()
                run.problems.append(why)
                return run
        try:
            script = tmp / "block.sh"
            script.write_text(_script(commands, tmp), encoding="utf-8")
            shell = subprocess.Popen(
                ["bash", "--noprofile", "--norc", str(script)], cwd=ROOT, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            owners.watch(shell.pid)
            try:
                raw, _ = shell.communicate(timeout=block.marker.timeout_s)
            except subprocess.TimeoutExpired:
                _stop(shell, signal.SIGTERM, TERM_GRACE_S)
                raw, _ = shell.communicate()
                run.problems.append(
                    f"{block.where}: the commands did not finish within "
                    f"{block.marker.timeout_s:.0f} s (timeout= of its marker)"
                )
            run.problems[:0] = _judge(block, commands, raw.decode(errors="replace"), tmp)
        finally:
            if server is not None:
                code = _stop(server, signal.SIGINT, STOP_S)
                if code != EXIT_INTERRUPTED:
                    run.problems.append(
                        f"harombe serve {'was killed' if code is None else f'exited {code}'} "
                        f"after Ctrl-C (SIGINT); docs/service.md says it exits "
                        f"{EXIT_INTERRUPTED}:\n{_tail(serve_log)}"
                    )
    if run.problems and block.marker.serve:
        run.problems.append(f"harombe serve's output:\n{_tail(serve_log)}")
    return run


async def run_and_sweep(block: Block, tmp: Path, docker_manager: DockerManager) -> BlockRun:
    """Runs the block; a sandbox its processes left is a problem, and is removed."""
    run = await asyncio.to_thread(run_block, block, tmp)
    managed = await docker_manager.list_containers({LABEL_MANAGED: "1"})
    left = [c for c in managed if c.labels.get(LABEL_OWNER, "") in run.owners]
    for container in left:
        await docker_manager.remove_container(container.id)
    if left:
        run.problems.append(f"{len(left)} sandbox(es) left in Docker by the block's processes")
    return run


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
async def test_a_runnable_block_prints_what_the_docs_show(
    block: Block, docker_manager: DockerManager, tmp_path: Path
) -> None:
    """The block's commands run verbatim, each exits 0 and prints the output shown, and no
    sandbox of theirs is left behind."""
    problems = (await run_and_sweep(block, tmp_path, docker_manager)).problems
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


def test_the_docs_have_runnable_blocks() -> None:
    """Blocks are run at all: the README's serve + curl block is among them."""
    where = {b.where for b in RUNNABLE}
    assert any(w.startswith("README.md:") for w in where)
    serve = [b for b in RUNNABLE if b.marker is not None and b.marker.serve]
    assert any("curl -s localhost:8000/execute" in b.body for b in serve)


def made_up(body: str, *, timeout_s: float) -> Block:
    return Block("made-up.md", 1, "bash", body, Marker(runnable=True, timeout_s=timeout_s))


def test_wrong_output_a_failed_command_and_a_timeout_are_each_reported(tmp_path: Path) -> None:
    """The runner can fail: output other than shown, a non-zero exit and a block past its
    timeout are each reported with the command's line."""
    block = made_up("echo 41\n# 42\nfalse\nsleep 60", timeout_s=3)
    problems = "\n".join(run_block(block, tmp_path).problems)
    assert "made-up.md:2 `echo 41`: not the output shown: line 1: shown '42', got '41'" in problems
    assert "made-up.md:4 `false`: exit 1" in problems
    assert "made-up.md:5 `sleep 60`: did not finish" in problems
    assert "the commands did not finish within 3 s" in problems


LEAK = """
import asyncio, os
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager

async def main():
    docker_manager = DockerManager()
    await docker_manager.start()
    sandbox_manager = SandboxManager(docker_manager=docker_manager, runtime="runsc")
    await sandbox_manager.start()
    await sandbox_manager.create_sandbox("python")
    os._exit(0)  # no stop(): its sandbox stays in Docker

asyncio.run(main())
"""


async def test_a_sandbox_left_behind_fails_the_block_and_is_removed(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """A block whose process exits without removing its sandbox fails, and the test removes
    the sandbox."""
    (tmp_path / "leak.py").write_text(LEAK, encoding="utf-8")
    block = made_up(f"{sys.executable} {tmp_path / 'leak.py'}", timeout_s=120)
    run = await run_and_sweep(block, tmp_path, docker_manager)
    assert run.problems, "a sandbox was left and nothing was reported"
    assert re.fullmatch(r"[1-9]\d* sandbox\(es\) left in Docker by the block's processes",
                        run.problems[-1]), run.problems  # fmt: skip
    managed = await docker_manager.list_containers({LABEL_MANAGED: "1"})
    assert not [c.id for c in managed if c.labels.get(LABEL_OWNER, "") in run.owners]


def test_port_8000_in_use_fails_with_a_clear_message(tmp_path: Path) -> None:
    """A serve block never moves to another port: 8000 taken is a failure that says so."""
    block = Block("made-up.md", 1, "bash", "curl -s localhost:8000/healthz",
                  Marker(runnable=True, serve=True))  # fmt: skip
    with contextlib.ExitStack() as stack:
        if not _port_in_use():  # else someone else holds it, which must fail the same way
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", PORT))
            listener.listen()
        with pytest.raises(
            AssertionError, match=re.escape("port 8000 on 127.0.0.1 is already in use")
        ):
            run_block(block, tmp_path)

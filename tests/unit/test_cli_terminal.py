"""The local side of ``harombe shell`` without Docker: raw mode restored, sizes read, bytes
relayed, SIGWINCH forwarded, piped input ended with Ctrl-D; and the shell's session over
FakeDocker (argv, user, environment, exit status)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import signal
import struct
import termios
from collections.abc import Iterator

import pytest

from harombe.cli import shell as shell_cli
from harombe.cli.terminal import DEFAULT_SIZE, raw_mode, relay, terminal_env, window_size
from harombe.config import parse_config
from harombe.errors import SandboxNotFoundError
from harombe.security.runtime.backend import Terminal
from harombe.security.runtime.manager import SandboxManager
from harombe.testing import FakeDocker
from harombe.testing.terminal import FakeTerminal


@pytest.fixture
def pty_pair() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal (controller, terminal) of 33 rows × 111 columns."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    yield controller, terminal
    os.close(controller)
    os.close(terminal)


def fake_terminal(**overrides: object) -> FakeTerminal:
    options: dict[str, object] = {"container_id": "c", "cmd": ["bash"], "user": "1000:1000",
                                  "env": {}, "workdir": "/workspace", "size": (24, 80)}  # fmt: skip
    options.update(overrides)
    return FakeTerminal("exec-1", **options)  # type: ignore[arg-type]


def test_the_fake_terminal_is_a_backend_terminal() -> None:
    """FakeTerminal satisfies the backend's Terminal protocol."""
    assert isinstance(fake_terminal(), Terminal)


def test_window_size_reads_the_first_terminal_and_falls_back(pty_pair: tuple[int, int]) -> None:
    """The size of the first fd that is a terminal; a pipe alone gives 24×80."""
    read_end, write_end = os.pipe()
    try:
        assert window_size(read_end, pty_pair[1]) == (33, 111)
        assert window_size(read_end) == DEFAULT_SIZE
    finally:
        os.close(read_end)
        os.close(write_end)


def test_raw_mode_is_undone_even_when_the_block_fails(pty_pair: tuple[int, int]) -> None:
    """Inside: no echo, no canonical lines, no signals from keys; after an error: as before."""
    fd = pty_pair[1]
    before = termios.tcgetattr(fd)
    with pytest.raises(RuntimeError), raw_mode(fd) as is_tty:
        lflag = termios.tcgetattr(fd)[3]
        assert is_tty and not lflag & (termios.ECHO | termios.ICANON | termios.ISIG)
        raise RuntimeError("boom")
    assert termios.tcgetattr(fd) == before


def test_raw_mode_leaves_a_pipe_alone() -> None:
    """A pipe is not a terminal: nothing is switched, and the block says so."""
    read_end, write_end = os.pipe()
    try:
        with raw_mode(read_end) as is_tty:
            assert is_tty is False
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize(
    ("environ", "term"),
    [({"TERM": "screen-256color"}, "screen-256color"), ({}, "xterm"), ({"TERM": ""}, "xterm")],
    ids=["local-term", "unset", "empty"],
)
def test_terminal_env_passes_term(environ: dict[str, str], term: str) -> None:
    """The remote program gets this terminal's TERM, or xterm."""
    assert terminal_env(environ) == {"TERM": term}


def test_shell_command_and_environment() -> None:
    """The exec runs the program under ulimit -u, with a call's environment plus TERM."""
    argv = shell_cli.shell_command("python", max_pids=64)
    assert argv[:2] == ["bash", "-c"] and argv[-3:] == ["harombe-shell", "64", "python3"]
    env = shell_cli.shell_env({"TERM": "vt100", "SECRET": "host"})
    assert env["TERM"] == "vt100" and "SECRET" not in env and env["HOME"] == "/home/sandbox"


async def test_piped_input_is_relayed_and_ended_with_ctrl_d() -> None:
    """Bytes from a pipe reach the terminal; its end is Ctrl-D, which ends the shell."""
    terminal = fake_terminal()
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(stdin_w, b"echo hi\r")
    os.close(stdin_w)
    try:
        stopped = await asyncio.wait_for(
            relay(terminal, stdin_fd=stdin_r, stdout_fd=out_w, tty=False), 10
        )
        os.close(out_w)
        shown = os.read(out_r, 1 << 16)
    finally:
        os.close(stdin_r)
        os.close(out_r)
    assert stopped is None and terminal.status == 0
    assert bytes(terminal.typed) == b"echo hi\r\x04"
    assert b"echo hi\r\necho hi\r\n$ " in shown


async def test_sigwinch_resizes_the_remote_terminal(pty_pair: tuple[int, int]) -> None:
    """A SIGWINCH while relaying sends this terminal's new size to the remote one."""
    controller, local = pty_pair
    terminal = fake_terminal()
    relaying = asyncio.ensure_future(relay(terminal, stdin_fd=local, stdout_fd=local, tty=True))
    await asyncio.sleep(0.05)
    fcntl.ioctl(local, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
    os.kill(os.getpid(), signal.SIGWINCH)
    for _ in range(200):
        if (50, 132) in terminal.sizes:
            break
        await asyncio.sleep(0.01)
    os.write(controller, b"exit 9\r")
    assert await asyncio.wait_for(relaying, 10) is None
    assert terminal.sizes[-1] == (50, 132) and terminal.status == 9


async def test_a_stop_signal_ends_the_relay_with_its_number(pty_pair: tuple[int, int]) -> None:
    """SIGHUP (the terminal closed) ends the relay, which returns the signal's number."""
    local = pty_pair[1]
    terminal = fake_terminal()
    relaying = asyncio.ensure_future(relay(terminal, stdin_fd=local, stdout_fd=local, tty=True))
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGHUP)
    assert await asyncio.wait_for(relaying, 10) == signal.SIGHUP


async def test_session_over_fake_docker_runs_as_the_sandbox_user(
    monkeypatch: pytest.MonkeyPatch, pty_pair: tuple[int, int]
) -> None:
    """A session execs in the sandbox's container as the configured user, in /workspace, at
    this terminal's size, and returns the program's exit status; an unknown id is refused."""
    controller, local = pty_pair
    docker = FakeDocker()
    await docker.start()
    config = parse_config({})
    manager = SandboxManager(docker, config=config)
    await manager.start()
    try:
        box = await manager.create_sandbox("shell")
        monkeypatch.setattr("sys.stdin.fileno", lambda: local)
        monkeypatch.setattr("sys.stdout.fileno", lambda: local)
        os.write(controller, b"exit 7\r")
        status = await shell_cli.session(docker, box.container_id, language="bash", config=config)
        with pytest.raises(SandboxNotFoundError, match="no live sandbox"):
            await shell_cli.live_container(docker, "sandbox-000000000000")
        assert await shell_cli.live_container(docker, box.sandbox_id) == box.container_id
    finally:
        await manager.stop()
    (terminal,) = docker.terminals
    assert status == 7
    assert (terminal.user, terminal.workdir, terminal.sizes[0]) == ("1000:1000", "/workspace",
                                                                     (33, 111))  # fmt: skip


@pytest.mark.parametrize(
    ("fate", "reason"),
    [
        ("running", None),
        ("paused", None),
        ("killed", r"sandbox-x was stopped from outside \(exited, exit code 137"),
        ("oom", r"sandbox-x was killed for exceeding its memory limit"),
        ("removed", r"sandbox-x was removed from outside \(harombe rm or docker rm\)"),
    ],
    ids=["running", "paused", "killed", "oom", "removed"],
)
async def test_lost_reason_says_what_happened_to_the_sandbox(fate: str, reason: str | None) -> None:
    """A running or paused sandbox holds the session; a stopped or removed one says why not."""
    docker = FakeDocker()
    await docker.start()
    container_id = await docker.create_container(image="harombe/sandbox:latest", labels={})
    await docker.start_container(container_id)
    if fate == "paused":
        docker.pause(container_id)
    elif fate in ("killed", "oom"):
        docker.kill(container_id, oom=fate == "oom")
    elif fate == "removed":
        await docker.remove_container(container_id)
    found = await shell_cli.lost_reason(docker, container_id, "sandbox-x")
    assert (found is None) if reason is None else re.search(reason, found or ""), found


@pytest.mark.parametrize("how", ["removed", "killed"])
async def test_a_session_whose_sandbox_is_lost_ends_at_once_with_a_line(
    monkeypatch: pytest.MonkeyPatch, pty_pair: tuple[int, int],
    capsys: pytest.CaptureFixture[str], how: str,
) -> None:  # fmt: skip
    """The terminal's stream stays open, but the watch ends the session: exit 1, and why."""
    _, local = pty_pair
    monkeypatch.setattr(shell_cli, "WATCH_POLL_S", 0.01)
    docker = FakeDocker()
    await docker.start()
    config = parse_config({})
    manager = SandboxManager(docker, config=config)
    await manager.start()
    try:
        box = await manager.create_sandbox("shell")
        monkeypatch.setattr("sys.stdin.fileno", lambda: local)
        monkeypatch.setattr("sys.stdout.fileno", lambda: local)
        session = shell_cli.session(docker, box.container_id, language="bash", config=config,
                                    sandbox_id=box.sandbox_id)  # fmt: skip
        running = asyncio.ensure_future(session)
        await asyncio.sleep(0.05)
        assert not running.done()
        if how == "removed":
            await docker.remove_container(box.container_id)
        else:
            docker.kill(box.container_id)
        status = await asyncio.wait_for(running, 10)
    finally:
        await manager.stop()
    assert status == shell_cli.EXIT_SANDBOX_LOST == 1
    err = capsys.readouterr().err
    assert f"harombe shell: sandbox {box.sandbox_id} was {how}" in err.replace("stopped", "killed")
    assert err.rstrip().endswith("; the session ended")
    assert docker.terminals[0].status is None, "the fake stream never ended by itself"

"""Attacks on the command line without Docker: a hostile program's output on the user's
terminal (``harombe run`` and ``harombe shell``), signals that must not leak a sandbox or
leave the terminal raw, a daemon that answers the shell's exec oddly, and ``rm --all``
reaching sandboxes of processes that still run."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.cli import main
from harombe.cli import run as run_cli
from harombe.cli.common import STOP_SIGNALS, run_async
from harombe.cli.screen import RESET, PlainText, ShellFilter
from harombe.cli.terminal import relay
from harombe.errors import DockerUnavailableError, UsageError
from harombe.security.runtime import docker_exec
from harombe.security.runtime.docker_exec import ExecTerminal, TerminalExecs
from harombe.security.runtime.docker_socket import upgrade
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    process_owner,
)
from harombe.testing import FakeDocker
from harombe.testing.terminal import FakeTerminal

# ---- harombe run: what a program may print on a terminal ----------------------------------

PLAIN_CASES = [
    ("text", b"hello\tworld\r\n", b"hello\tworld\r\n"),
    ("colours-kept", b"\x1b[1;31mred\x1b[0m\n", b"\x1b[1;31mred\x1b[0m\n"),
    ("clipboard-osc52", b"a\x1b]52;c;ZWNobyBwd25lZAo=\x07b", b"ab"),
    ("clipboard-st", b"a\x1b]52;c;ZWNobw==\x1b\\b", b"ab"),
    ("title", b"\x1b]0;harombe run: ok\x07x", b"x"),
    ("cursor-up-erase", b"\x1b[2A\x1b[2Kforged", b"forged"),
    ("unterminated-osc-swallows-nothing-after-reset", b"\x1b]0;eat everything", b""),
    ("dcs", b"\x1bP1$qm\x1b\\ok", b"ok"),
    ("charset", b"\x1b(0lqk\x1b(B", b"lqk"),
    ("c1-csi-utf8", "\u009b2Jx\u009d52;c;AA\u009c".encode(), b"x"),
    ("utf8-kept", "é✓\n".encode(), "é✓\n".encode()),
    ("invalid-utf8-kept", b"\xff\xfe\n", b"\xff\xfe\n"),
    ("bell-and-nul", b"\x07\x00x\x7f", b"x"),
    ("private-csi", b"\x1b[?1049h\x1b[?25lx", b"x"),
    ("reset-terminal", b"\x1bcx", b"x"),
    ("huge-sgr", b"\x1b[" + b"1;" * 100 + b"mx", b"x"),
]


@pytest.mark.parametrize(("data", "shown"), [c[1:] for c in PLAIN_CASES],
                         ids=[c[0] for c in PLAIN_CASES])  # fmt: skip
def test_run_output_on_a_terminal_is_plain_text_and_colours(data: bytes, shown: bytes) -> None:
    """Clipboard writes, titles, cursor moves and C1 controls never reach the terminal."""
    assert PlainText().feed(data) == shown


@pytest.mark.parametrize("data", [c[1] for c in PLAIN_CASES], ids=[c[0] for c in PLAIN_CASES])
def test_sequences_split_across_reads_are_filtered_the_same(data: bytes) -> None:
    """A sequence cut into one-byte reads is no way around the filter."""
    whole = PlainText().feed(data)
    screen = PlainText()
    assert b"".join(screen.feed(bytes([b])) for b in data) == whole


class FakeStream(io.TextIOWrapper):
    """A text stream over bytes that says whether it is a terminal."""

    def __init__(self, *, tty: bool, broken: bool = False) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8")
        self.tty, self.broken = tty, broken

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        super().flush()

    def shown(self) -> bytes:
        self.flush()
        buffer = self.buffer
        assert isinstance(buffer, io.BytesIO)
        return buffer.getvalue()


async def test_run_leaves_the_terminal_clean_before_harombe_speaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program that ends mid-line in concealed text cannot hide or glue onto harombe's line."""
    out, err = FakeStream(tty=True), FakeStream(tty=True)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    output = run_cli.Output()
    output.write("stdout", b"ok\n")
    output.write("stderr", b"\x1b[8m\x1b]0;x")  # concealed text, an unterminated string
    output.finish()
    assert out.shown() == b"ok\n"
    assert err.shown() == b"\x1b[8m" + RESET + b"\n"


async def test_run_output_to_a_pipe_is_the_program_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped output is not filtered: the bytes are the program's."""
    out, err = FakeStream(tty=False), FakeStream(tty=False)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    output = run_cli.Output()
    output.write("stdout", b"\x1b]52;c;AA\x07\xff")
    output.finish()
    assert out.shown() == b"\x1b]52;c;AA\x07\xff" and err.shown() == b""


async def test_a_closed_stdout_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`harombe run x | head`: the reader leaving cancels the run (no 30 s wait for the timeout)."""
    devnull_fd = os.open(os.devnull, os.O_WRONLY)
    out = FakeStream(tty=False, broken=True)
    monkeypatch.setattr(out, "fileno", lambda: devnull_fd)
    monkeypatch.setattr(sys, "stdout", out)

    async def long_run() -> None:
        run_cli.Output().write("stdout", b"line\n")
        await asyncio.sleep(30)

    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.ensure_future(long_run()), 10)
    finally:
        os.close(devnull_fd)


# ---- harombe shell: what the sandbox's terminal may show -----------------------------------

SHELL_CASES = [
    ("text-and-cursor", b"\x1b[2J\x1b[H\x1b[31mhi\x1b[0m", b"\x1b[2J\x1b[H\x1b[31mhi\x1b[0m"),
    ("title-dropped", b"\x1b]0;bash\x07$ ", b"$ "),
    ("osc52-bel", b"a\x1b]52;c;ZWNobw==\x07b", b"ab"),
    ("osc52-st", b"a\x1b]52;c;ZWNobw==\x1b\\b", b"ab"),
    ("osc52-padded", b"a\x1b]0000000052;c;AA\x07b", b"ab"),
    ("osc52-very-padded", b"a\x1b]" + b"0" * 40 + b"52;c;AA\x07b", b"ab"),
    ("osc52-c1", "a\u009d52;c;AA\u009cb".encode(), b"ab"),
    ("osc52-after-an-unended-title", b"\x1b]0;t\x1b]52;c;AA\x07b", b"b"),
    ("tmux-passthrough", b"\x1bPtmux;\x1b\x1b]52;c;AA\x07\x1b\\b", b"b"),
    ("screen-passthrough", b"\x1bP\x1b]52;c;AA\x07\x1b\\b", b"b"),
    ("hyperlink-dropped", b"\x1b]8;;http://x/\x1b\\l\x1b]8;;\x1b\\", b"l"),
    ("utf8-kept", "é ✓ \u00a0".encode(), "é ✓ \u00a0".encode()),
]


@pytest.mark.parametrize(("data", "shown"), [c[1:] for c in SHELL_CASES],
                         ids=[c[0] for c in SHELL_CASES])  # fmt: skip
def test_the_shell_never_lets_the_sandbox_write_the_clipboard(data: bytes, shown: bytes) -> None:
    """OSC 52 (however spelt or smuggled) and every other string is dropped; full-screen
    programs' sequences pass."""
    screen = ShellFilter()
    assert screen.feed(data) == shown
    split = ShellFilter()
    assert b"".join(split.feed(bytes([b])) for b in data) == shown


async def test_a_shell_on_a_terminal_resets_it_when_the_session_ends() -> None:
    """The sandbox cannot leave the cursor hidden or a string open on the user's terminal."""
    controller, local = os.openpty()
    terminal = FakeTerminal("e", container_id="c", cmd=["bash"], user="1000:1000", env={},
                            workdir="/workspace", size=(24, 80))  # fmt: skip
    terminal.end(0)
    try:
        assert await asyncio.wait_for(relay(terminal, stdin_fd=local, stdout_fd=local,
                                            tty=True), 10) is None  # fmt: skip
        shown = os.read(controller, 1 << 16)
    finally:
        os.close(controller)
        os.close(local)
    assert shown.replace(b"\r\n", b"\n").endswith(RESET.replace(b"\r\n", b"\n"))


async def test_a_closed_shell_output_is_a_clear_error() -> None:
    """`harombe shell | true`: a HarombeError the command reports, not a traceback."""
    terminal = FakeTerminal("e", container_id="c", cmd=["bash"], user="1000:1000", env={},
                            workdir="/workspace", size=(24, 80))  # fmt: skip
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    os.close(out_r)
    try:
        with pytest.raises(UsageError, match="output was closed"):
            await asyncio.wait_for(relay(terminal, stdin_fd=stdin_r, stdout_fd=out_w,
                                         tty=False), 10)  # fmt: skip
    finally:
        for fd in (stdin_r, stdin_w, out_w):
            os.close(fd)


# ---- signals: no leaked sandbox, no raw terminal --------------------------------------------


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=[s.name for s in STOP_SIGNALS])
def test_sigterm_and_sighup_clean_up_once_and_exit_128_plus_n(signum: signal.Signals) -> None:
    """A stop signal cancels the command (its finally removes the sandbox); a second one
    during that cleanup is ignored; the handlers are the caller's again afterwards."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    cleaned: list[bool] = []

    async def command() -> int:
        try:
            os.kill(os.getpid(), signum)
            await asyncio.sleep(30)
            return 0
        finally:
            os.kill(os.getpid(), signum)  # a second signal while cleaning up
            await asyncio.sleep(0.05)
            cleaned.append(True)

    assert run_async(command) == 128 + signum
    assert cleaned == [True]
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


async def test_the_relay_gives_the_callers_signal_handlers_back() -> None:
    """After a shell session the command's SIGTERM handler is back (not SIG_DFL, which would
    let a SIGTERM during the sandbox's removal kill harombe and leak it)."""
    calls: list[int] = []
    handler: Callable[[int, Any], None] = lambda signum, frame: calls.append(signum)  # noqa: E731
    previous = signal.signal(signal.SIGTERM, handler)
    read_end, write_end = os.pipe()
    out_r, out_w = os.pipe()
    terminal = FakeTerminal("e", container_id="c", cmd=["bash"], user="1000:1000", env={},
                            workdir="/workspace", size=(24, 80))  # fmt: skip
    terminal.end(0)
    try:
        await asyncio.wait_for(relay(terminal, stdin_fd=read_end, stdout_fd=out_w, tty=False), 10)
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
        for fd in (read_end, write_end, out_r, out_w):
            os.close(fd)


# ---- the daemon's side of the shell's exec ----------------------------------------------------


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def fake_daemon(tmp_path: Path, serve: Serve) -> AsyncIterator[str]:
    path = str(tmp_path / "docker.sock")
    server = await asyncio.start_unix_server(serve, path)
    try:
        yield path
    finally:
        server.close()


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 101 UPGR")
    await writer.drain()
    writer.close()


async def endless_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 101 UPGRADED\r\nX: " + b"a" * (5 << 20))
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("serve", [hang_up, endless_header], ids=["hang-up", "endless-header"])
async def test_an_upgrade_the_daemon_botches_is_a_harombe_error(tmp_path: Path,
                                                                serve: Serve) -> None:  # fmt: skip
    """A daemon that hangs up mid-answer or never ends its header: DockerUnavailableError."""
    async for path in fake_daemon(tmp_path, serve):
        with pytest.raises(DockerUnavailableError, match="no readable answer"):
            await upgrade(path, "/exec/x/start", what="the exec x")


class Execs(TerminalExecs):
    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def socket_path(self) -> str:
        return self.path


async def test_an_exec_start_the_daemon_never_answers_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon that creates the exec then never answers its start: an error, not a hang."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"/start" in head:
            await reader.read()  # silent until the client gives up
            return
        body = b'{"Id": "abc123"}'
        writer.write(b"HTTP/1.0 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    monkeypatch.setattr(docker_exec, "REQUEST_TIMEOUT_S", 0.5)
    async for path in fake_daemon(tmp_path, serve):
        with pytest.raises(DockerUnavailableError, match="did not start the exec"):
            await Execs(path).exec_interactive("c" * 64, ["bash"], user="1000:1000", env={},
                                               workdir="/workspace", size=(24, 80))  # fmt: skip


EXIT_ANSWERS = [
    ("finished", b'{"Running": false, "ExitCode": 7}', 7),
    ("running", b'{"Running": true, "ExitCode": null}', None),
    ("no-status-yet", b'{"Running": false, "ExitCode": null}', None),
    ("too-big", b'{"Running": false, "ExitCode": 256}', DockerUnavailableError),
    ("negative", b'{"Running": false, "ExitCode": -1}', DockerUnavailableError),
    ("a-string", b'{"Running": false, "ExitCode": "zero"}', DockerUnavailableError),
    ("a-bool", b'{"Running": false, "ExitCode": false}', DockerUnavailableError),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in EXIT_ANSWERS],
                         ids=[c[0] for c in EXIT_ANSWERS])  # fmt: skip
async def test_the_exit_status_is_read_strictly(tmp_path: Path, body: bytes,
                                                expected: Any) -> None:  # fmt: skip
    """No status is not 0 (a shell that did not end must not pass), and an odd one (256 would
    exit 0) is an error."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    async for path in fake_daemon(tmp_path, serve):
        read_end, write_end = socket.socketpair()
        stream_reader, stream_writer = await asyncio.open_connection(sock=read_end)
        terminal = ExecTerminal(stream_reader, stream_writer, path=path, exec_id="abc")
        try:
            if isinstance(expected, type):
                with pytest.raises(expected, match="unreadable exit status"):
                    await terminal.exit_code()
            else:
                assert await terminal.exit_code() == expected
        finally:
            terminal.close()
            write_end.close()


# ---- harombe rm --all -------------------------------------------------------------------------


async def test_rm_all_spares_sandboxes_of_running_processes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rm --all` removes sandboxes whose owner is gone; a running process's (a serve's), an
    unknown owner's and a forged id are kept; `--all --force` takes the live ones too."""
    docker = FakeDocker()
    await docker.start()
    host = socket.gethostname()
    owners = {"sandbox-aaaaaaaaaaaa": process_owner(),  # this process: alive
              "sandbox-bbbbbbbbbbbb": f"{host}:{os.getpid()}:0",  # pid reused: gone
              "sandbox-cccccccccccc": "elsewhere:1:1",  # another machine's
              "../sandbox-*": f"{host}:1:0"}  # fmt: skip
    for sid, owner in owners.items():
        await docker.create_container(image="harombe/sandbox:latest", labels={
            LABEL_MANAGED: "1", LABEL_SANDBOX: sid, LABEL_OWNER: owner})  # fmt: skip
    monkeypatch.setattr("harombe.security.runtime.docker.DockerManager", lambda: docker)

    def labels() -> set[str]:
        return {c.labels[LABEL_SANDBOX] for c in docker.containers.values()}

    assert await asyncio.to_thread(main, ["rm", "--all"]) == 0
    said = capsys.readouterr()
    assert said.out == "removed sandbox-bbbbbbbbbbbb\n"
    assert "kept sandbox-aaaaaaaaaaaa" in said.err and "kept sandbox-cccccccccccc" in said.err
    assert labels() == {"sandbox-aaaaaaaaaaaa", "sandbox-cccccccccccc", "../sandbox-*"}
    assert await asyncio.to_thread(main, ["rm", "--all", "--force"]) == 0
    assert labels() == {"../sandbox-*"}  # not a harombe sandbox id: never swept
    assert main(["rm", "--force", "sandbox-aaaaaaaaaaaa"]) == 2

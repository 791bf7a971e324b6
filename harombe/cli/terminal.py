"""The local side of ``harombe shell``: this terminal in raw mode while a remote pseudo-terminal
runs, bytes relayed both ways, window size changes forwarded, and the terminal restored on
every way out.

In raw mode every key is a byte for the remote terminal: Ctrl-C is ``\\x03``, which the
sandbox's terminal turns into SIGINT for its foreground program, so it never interrupts this
process. When stdin is not a terminal (a pipe, a file) nothing is switched, bytes are relayed as
they come, and the end of input is sent as Ctrl-D (the remote shell's end of input).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import termios
import threading
import tty
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import structlog

from harombe.cli.screen import RESET, ShellFilter
from harombe.errors import HarombeError, SandboxLostError, UsageError
from harombe.security.runtime.backend import Terminal

log = structlog.get_logger(__name__)

#: The size a remote terminal gets when neither stdin nor stdout is a terminal.
DEFAULT_SIZE = (24, 80)
#: Sent to the remote terminal when a piped stdin ends: Ctrl-D, end of input at a prompt.
END_OF_INPUT = b"\x04"
#: Signals that end the session (the remote program is left to the sandbox's removal).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
READ_BYTES = 1 << 16


def window_size(*fds: int) -> tuple[int, int]:
    """(rows, columns) of the first of ``fds`` that is a terminal with a size; else 24×80."""
    for fd in fds:
        try:
            rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        except OSError:
            continue
        if rows and cols:
            return rows, cols
    return DEFAULT_SIZE


def terminal_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the remote program learns of this terminal: its ``TERM`` (``xterm`` if unset)."""
    return {"TERM": environ.get("TERM") or "xterm"}


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[bool]:
    """``fd``'s terminal in raw mode for the block, its settings restored after it however it
    ends; yields whether ``fd`` is a terminal (a pipe or file is left alone)."""
    try:
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError):
        yield False
        return
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            os.set_blocking(fd, True)


class _Input:
    """Bytes read from ``fd`` into a queue (``b""`` at its end): by the event loop when ``fd``
    can be polled, else (a regular file) by a daemon thread."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fd, self.loop = fd, loop
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.polled = False
        try:
            loop.add_reader(fd, self._readable)
            self.polled = True
        except (OSError, ValueError):  # epoll refuses regular files
            threading.Thread(target=self._pump, name="harombe-shell-stdin", daemon=True).start()

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
        self.queue.put_nowait(data)

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except OSError:
                data = b""
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, data)
            except RuntimeError:  # the loop is closed: nobody listens any more
                return
            if not data:
                return

    def close(self) -> None:
        if self.polled:
            self.loop.remove_reader(self.fd)
            self.polled = False


async def _send_input(
    terminal: Terminal, source: _Input, *, tty: bool, shown: asyncio.Event
) -> None:
    # Input sent before the program first shows something (its prompt) can be flushed when it
    # sets up its terminal; it waits here, as a typist would.
    await shown.wait()
    while data := await source.queue.get():
        await terminal.write(data)
    if not tty:
        await terminal.write(END_OF_INPUT)


async def _show_output(terminal: Terminal, stdout_fd: int, shown: asyncio.Event) -> None:
    """The terminal's bytes to ``stdout_fd``; to a terminal without clipboard writes
    (:class:`~harombe.cli.screen.ShellFilter`), and its modes reset at the end."""
    screen = ShellFilter() if os.isatty(stdout_fd) else None
    try:
        while (item := await terminal.read()) is not None:
            _write_all(stdout_fd, screen.feed(item[1]) if screen else item[1])
            shown.set()
    except BrokenPipeError:
        raise UsageError("this shell's output was closed (its reader went away)") from None
    finally:
        if screen is not None:
            with contextlib.suppress(OSError):
                _write_all(stdout_fd, RESET)


async def _forward_sizes(terminal: Terminal, changed: asyncio.Event, fds: tuple[int, ...]) -> None:
    while True:
        await changed.wait()
        changed.clear()
        rows, cols = window_size(*fds)
        try:
            await terminal.resize(rows=rows, cols=cols)
        except HarombeError as exc:  # a lost resize is cosmetic: the session goes on
            log.warning("shell.resize_failed", error=str(exc))


async def relay(
    terminal: Terminal,
    *,
    stdin_fd: int,
    stdout_fd: int,
    tty: bool,
    lost: Callable[[], Awaitable[str]] | None = None,
) -> int | None:
    """Relay until the remote terminal's stream ends (None) or a :data:`STOP_SIGNALS` signal
    arrives (its number). Typed bytes go to ``terminal`` (from its first output on), its bytes
    to ``stdout_fd``, and each SIGWINCH becomes a resize to this terminal's size. ``lost``,
    if given, returns once the terminal's sandbox is gone, with the reason: the relay then
    ends at once with :class:`SandboxLostError` (a stream can outlive its container)."""
    loop = asyncio.get_running_loop()
    changed, stopped, shown = asyncio.Event(), asyncio.Event(), asyncio.Event()
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        stopped.set()

    source = _Input(stdin_fd, loop)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGWINCH, *STOP_SIGNALS)}
    loop.add_signal_handler(signal.SIGWINCH, changed.set)
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    watch: asyncio.Future[str] = asyncio.ensure_future(lost()) if lost else loop.create_future()
    tasks: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(_show_output(terminal, stdout_fd, shown)),
        asyncio.ensure_future(stopped.wait()),
        watch,
        asyncio.ensure_future(_send_input(terminal, source, tty=tty, shown=shown)),
        asyncio.ensure_future(_forward_sizes(terminal, changed, (stdout_fd, stdin_fd))),
    ]
    try:
        await asyncio.wait(tasks[:3], return_when=asyncio.FIRST_COMPLETED)
        if watch.done() and not got:
            raise SandboxLostError(watch.result())
        if tasks[0].done():
            tasks[0].result()  # an error reading the terminal is the caller's to see
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        source.close()
        for signum, handler in previous.items():  # the caller's handlers again, not SIG_DFL
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    return got[0] if got else None

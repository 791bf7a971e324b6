"""What the commands share: quiet logs, the config with the command's limits, one event loop
around a started Docker client and sandbox manager, and a status line for long steps.

Exit codes every command keeps: 0 done, 1 a harombe error (Docker away, image missing, a
check failed), 2 bad usage (an option, a config file), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import click

from harombe import logs
from harombe.config import HarombeConfig, load_config, override, parse_config
from harombe.errors import ConfigError

T = TypeVar("T")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: Signals that stop a command as Ctrl-C does (its sandboxes removed), exiting 128 + N.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def configure_logs(verbose: bool) -> None:
    """Only warnings (all events with -v) on stderr, so output reads cleanly;
    ``HAROMBE_LOG_LEVEL`` sets that level. ``HAROMBE_LOG_JSON``'s file gets every event at
    info and above whatever the console shows (debug too with -v)."""
    level = "debug" if verbose else os.environ.get(logs.LEVEL_ENV) or "warning"
    logs.configure(level=level)


def start_command(ctx: click.Context) -> None:
    """Logs as the group's ``-v`` asks; a bad ``HAROMBE_LOG_*`` is a usage error (exit 2)."""
    verbose = bool((ctx.find_root().obj or {}).get("verbose"))
    try:
        configure_logs(verbose)
    except ConfigError as exc:
        raise click.exceptions.Exit(say_error("harombe", exc, EXIT_USAGE)) from None


def say_error(command: str, error: object, code: int = EXIT_ERROR) -> int:
    """Print ``<command>: <error>`` on stderr, control and invisible characters escaped (an
    error may quote what a sandbox chose); returns ``code`` (for ``return say_error(...)``)."""
    from harombe.cli.screen import printable

    click.echo(f"{command}: {printable(str(error))}", err=True)
    return code


def build_config(path: str | None, *, pool_size: int | None = 0, **limits: Any) -> HarombeConfig:
    """The config file (or ``$HAROMBE_CONFIG``) and ``HAROMBE__…`` variables, with ``limits``
    on top (see :func:`with_limits`). Raises :class:`ConfigError`."""
    return with_limits(load_config(path), pool_size=pool_size, **limits)


def with_limits(
    config: HarombeConfig, *, pool_size: int | None = 0, **limits: Any
) -> HarombeConfig:
    """``config`` with ``limits`` (non-None :func:`harombe.config.override` keys) replaced. A
    one-shot command keeps no warm pool (``pool_size=0``): a pooled sandbox would be started
    only to be removed at the end. Raises :class:`ConfigError`."""
    config = override(config, **limits)
    if pool_size is None:
        return config
    data = config.model_dump()
    data["security"]["sandbox"]["pool"]["size"] = pool_size
    return parse_config(data)


def hitl_requested(config: HarombeConfig) -> bool:
    """Whether the config file or a ``HAROMBE__SECURITY__HITL__…`` variable asks for the HITL
    gate (a ``security.hitl`` section that leaves it enabled). The person who types a command
    chose the code it runs: the built-in default, which is on for agents' calls, does not
    make the CLI ask again."""
    security = config.security
    return "hitl" in security.model_fields_set and security.hitl.enabled


@contextlib.asynccontextmanager
async def started_manager(config: HarombeConfig) -> AsyncIterator[Any]:
    """A started :class:`~harombe.security.runtime.manager.SandboxManager` over a started
    Docker client; leaving (also by Ctrl-C, which cancels the task) removes every sandbox it
    made."""
    from harombe.security.runtime.docker import DockerManager
    from harombe.security.runtime.manager import SandboxManager

    docker = DockerManager()
    await docker.start()
    try:
        manager = SandboxManager(docker_manager=docker, config=config)
        await manager.start()
        try:
            yield manager
        finally:
            await manager.stop()
    finally:
        await docker.stop()


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGHUP from now on: a command already stopping removes its sandboxes
    undisturbed (:func:`run_async` puts the handlers back when it returns)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def run_async(main: Callable[[], Awaitable[int]]) -> int:
    """``asyncio.run(main())``; Ctrl-C cancels ``main`` (whose ``finally`` blocks clean up)
    and exits 130. SIGTERM and SIGHUP (a closed window, ``timeout``, a service manager)
    cancel it the same way, once: later ones are ignored while it cleans up (its sandboxes
    are removed, not left running), and it exits with 128 + the signal."""
    got: list[int] = []

    async def wrapped() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def stop(signum: int, frame: object) -> None:
            ignore_stop_signals()
            got.append(signum)
            if task is not None:
                loop.call_soon_threadsafe(task.cancel)

        main_thread = threading.current_thread() is threading.main_thread()
        signums = STOP_SIGNALS if main_thread else ()  # only the main thread takes signals
        previous = {signum: signal.signal(signum, stop) for signum in signums}
        try:
            return await main()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    try:
        code = asyncio.run(wrapped())
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        if not got:
            raise
    if got:
        click.echo(f"stopped by {signal.Signals(got[0]).name}", err=True)
        return 128 + got[0]
    return code


class Status:
    """A status line on stderr for long steps: a spinner with the step and the seconds since
    it began when stderr is a terminal, one plain line per step otherwise (logs and CI stay
    readable). A context manager (its spinner is a thread: it turns during sync work too)."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, text: str = "", *, tty: bool | None = None) -> None:
        self.text = text
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_s = time.monotonic()

    def __enter__(self) -> Status:
        if self.tty:
            self._thread = threading.Thread(target=self._spin, daemon=True, name="status")
            self._thread.start()
        self.update(self.text)
        return self

    def update(self, text: str) -> None:
        """Show ``text`` as the current step."""
        with self._lock:
            self.text, self._started_s = text, time.monotonic()
            if text and not self.tty:
                click.echo(f"… {text}", err=True)

    def echo(self, line: str, *, err: bool = False) -> None:
        """Print a line without the spinner running over it."""
        with self._lock:
            self._clear()
            click.echo(line, err=err)

    def _clear(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def _spin(self) -> None:
        frame = 0
        while not self._done.wait(0.1):
            with self._lock:
                if self.text:
                    elapsed_s = time.monotonic() - self._started_s
                    mark = self.FRAMES[frame % len(self.FRAMES)]
                    sys.stderr.write(f"\r{mark} {self.text} ({elapsed_s:.0f} s)\x1b[K")
                    sys.stderr.flush()
            frame += 1

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear()

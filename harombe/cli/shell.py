"""``harombe shell``: an interactive bash or Python REPL inside a gVisor sandbox, on a
pseudo-terminal.

The sandbox is made by the :class:`~harombe.security.runtime.manager.SandboxManager` as for any
call (or, with ``--sandbox ID``, a live one is found by its label and left running). The program
is a Docker exec with a terminal, as the sandbox user, in ``/workspace``, with the environment
every call gets plus ``TERM``, and ``ulimit -u`` set to the sandbox's ``max_pids``. This
terminal goes raw and bytes are relayed (:mod:`harombe.cli.terminal`): line editing, Ctrl-C
for the program inside, window resizes. Leaving the program ends the command with its exit
status and removes the sandbox the command made.
"""

from __future__ import annotations

import asyncio
import os
import sys

import click

from harombe.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    Status,
    build_config,
    ignore_stop_signals,
    run_async,
    say_error,
    start_command,
    started_manager,
)
from harombe.cli.terminal import raw_mode, relay, terminal_env, window_size
from harombe.config import HarombeConfig
from harombe.errors import ConfigError, HarombeError, SandboxNotFoundError
from harombe.security.approval.policy_line import policy_line
from harombe.security.runtime.backend import DockerBackend, Terminal
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_SANDBOX,
    RUN_ENV,
    WORKSPACE,
    check_sandbox_id,
)

NAME = "harombe shell"
#: The programs, by ``--language``; the sandbox language whose image they run in.
PROGRAMS = {"bash": (["bash", "-i"], "shell"), "python": (["python3"], "python")}
#: How long the exit status may lag the end of the terminal's stream.
EXIT_STATUS_WAIT_S = 5.0
EXIT_STATUS_POLL_S = 0.05


def shell_command(language: str, *, max_pids: int) -> list[str]:
    """The argv of the exec: ``language``'s program under ``ulimit -u max_pids``."""
    program, _ = PROGRAMS[language]
    limit = 'ulimit -u "$1" 2>/dev/null; shift; exec "$@"'
    return ["bash", "-c", limit, "harombe-shell", str(max_pids), *program]


def shell_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The exec's whole environment: a call's (``RUN_ENV``) and this terminal's ``TERM``."""
    return {**RUN_ENV, **terminal_env(environ)}


async def live_container(docker: DockerBackend, sandbox_id: str) -> str:
    """The container id of the running sandbox ``sandbox_id`` on this daemon."""
    labels = {LABEL_MANAGED: "1", LABEL_SANDBOX: check_sandbox_id(sandbox_id)}
    found = await docker.list_containers(labels)
    running = [c for c in found if c.status == "running"]
    if not running:
        state = f" (it is {found[0].status})" if found else ""
        raise SandboxNotFoundError(
            f"no live sandbox {sandbox_id} on this Docker daemon{state}; `harombe ls` lists "
            "them, or leave out --sandbox to start a new one"
        )
    return running[0].id


async def exit_status(terminal: Terminal) -> int | None:
    """The program's exit status once its stream ended (it lags a little); None if it runs."""
    for _ in range(int(EXIT_STATUS_WAIT_S / EXIT_STATUS_POLL_S)):
        if (status := await terminal.exit_code()) is not None:
            return status
        await asyncio.sleep(EXIT_STATUS_POLL_S)  # Docker has no event for an exec's end
    return await terminal.exit_code()


async def session(
    docker: DockerBackend, container_id: str, *, language: str, config: HarombeConfig
) -> int:
    """Run ``language``'s program on a terminal in the container, relayed to this one; its
    exit status (128 + the signal that stopped this command; 1 if it never ended)."""
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    sandbox = config.security.sandbox
    terminal = await docker.exec_interactive(
        container_id, shell_command(language, max_pids=sandbox.limits.max_pids),
        user=sandbox.user, env=shell_env(os.environ), workdir=WORKSPACE,
        size=window_size(stdout_fd, stdin_fd),
    )  # fmt: skip
    try:
        with raw_mode(stdin_fd) as is_tty:
            stopped_by = await relay(terminal, stdin_fd=stdin_fd, stdout_fd=stdout_fd, tty=is_tty)
    finally:
        terminal.close()
    if stopped_by is not None:
        ignore_stop_signals()  # stopping already: the sandbox is removed next, undisturbed
        return 128 + stopped_by
    status = await exit_status(terminal)
    if status is None:
        return say_error(NAME, "the terminal's connection ended while the program still ran")
    return status


async def _shell(config: HarombeConfig, *, language: str, sandbox_id: str | None) -> int:
    try:
        async with started_manager(config) as manager:
            fate = "left running"
            if sandbox_id is not None:
                container_id = await live_container(manager.docker, sandbox_id)
            else:
                with Status("starting a gVisor sandbox"):
                    box = await manager.create_sandbox(PROGRAMS[language][1])
                container_id, sandbox_id, fate = box.container_id, box.sandbox_id, "removed"
            click.echo(
                f"{NAME}: {language} in sandbox {sandbox_id}; `exit` or Ctrl-D leaves "
                f"(the sandbox is then {fate})",
                err=True,
            )
            return await session(manager.docker, container_id, language=language, config=config)
    except HarombeError as exc:
        return say_error(NAME, exc)


@click.command("shell")
@click.option("--language", type=click.Choice(sorted(PROGRAMS)), default="bash",
              show_default=True, help="the program: bash, or the Python REPL")  # fmt: skip
@click.option("--sandbox", "sandbox_id", metavar="ID",
              help="attach to this live sandbox (left running) instead of a new one")  # fmt: skip
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="config file (default: $HAROMBE_CONFIG, else built-in defaults)")  # fmt: skip
@click.option("--memory-mb", type=click.IntRange(min=32), help="memory limit of a new sandbox")
@click.option("--cpus", type=click.FloatRange(min=0, min_open=True),
              help="CPU cores of a new sandbox")  # fmt: skip
@click.option("--disk-mb", type=click.IntRange(min=1), help="size of a new sandbox's /workspace")
@click.option("--pids", type=click.IntRange(min=8), help="processes of the shell (ulimit -u)")
@click.pass_context
def shell(ctx: click.Context, /, language: str, sandbox_id: str | None,
          config_path: str | None, memory_mb: int | None, cpus: float | None,
          disk_mb: int | None, pids: int | None) -> int:  # fmt: skip
    """An interactive bash (or Python REPL) inside a gVisor sandbox, on a real terminal.

    Line editing, Ctrl-C (it interrupts the program inside) and window resizes work; `exit` or
    Ctrl-D ends the command with the program's exit status and removes the sandbox it made."""
    start_command(ctx)
    if sandbox_id is not None and (memory_mb, cpus, disk_mb) != (None, None, None):
        return say_error(NAME, "--memory-mb, --cpus and --disk-mb size a new sandbox; one "
                         "given with --sandbox keeps its own: drop them", EXIT_USAGE)  # fmt: skip
    try:
        config = build_config(config_path, max_memory_mb=memory_mb, max_cpu_cores=cpus,
                              max_disk_mb=disk_mb, max_pids=pids)  # fmt: skip
    except ConfigError as exc:
        return say_error(NAME, exc, EXIT_USAGE)
    say_error(NAME, policy_line(None, "shell"))
    return run_async(lambda: _shell(config, language=language, sandbox_id=sandbox_id))


__all__ = ["EXIT_ERROR", "live_container", "session", "shell", "shell_command", "shell_env"]

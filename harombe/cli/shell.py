"""``harombe shell``: an interactive bash or Python REPL inside a gVisor sandbox, on a
pseudo-terminal.

The sandbox is made by the :class:`~harombe.security.runtime.manager.SandboxManager` as for any
call (or, with ``--sandbox ID``, a live one is found by its label and left running). The program
is a Docker exec with a terminal, as the sandbox user, in ``/workspace``, with the environment
every call gets plus ``TERM``, and ``ulimit -u`` set to the sandbox's ``max_pids``. This
terminal goes raw and bytes are relayed (:mod:`harombe.cli.terminal`): line editing, Ctrl-C
for the program inside, window resizes. Leaving the program ends the command with its exit
status and removes the sandbox the command made. The sandbox is watched meanwhile: one removed,
stopped or killed from outside (``harombe rm``, ``docker kill``) ends the session at once with
a line saying so, and exit code 1.
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
from harombe.errors import ConfigError, HarombeError, SandboxLostError, SandboxNotFoundError
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
#: How often the sandbox's container is checked during a session (a stream can outlive it).
WATCH_POLL_S = 0.5
#: The exit status of a program killed (SIGKILL), as a container's removal kills its exec; and
#: how long the container then has to show that it is going.
KILLED_STATUS = 128 + 9
LOST_GRACE_S = 3.0
#: The exit code of a session whose sandbox was lost (as every command's harombe error).
EXIT_SANDBOX_LOST = EXIT_ERROR


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


async def lost_reason(docker: DockerBackend, container_id: str, sandbox_id: str) -> str | None:
    """Why the sandbox can no longer hold a session (removed, stopped, killed for memory);
    None while it runs, is paused, or Docker cannot say."""
    removed = f"sandbox {sandbox_id} was removed from outside (harombe rm or docker rm)"
    try:
        state = await docker.container_state(container_id)
    except SandboxLostError:
        return removed
    except HarombeError:
        return None  # Docker unreachable: the terminal's stream tells if it is over
    if state.get("Running") is not False:
        return None
    if state.get("Status") in ("removing", "dead"):
        return removed
    if state.get("OOMKilled"):
        return f"sandbox {sandbox_id} was killed for exceeding its memory limit"
    return (
        f"sandbox {sandbox_id} was stopped from outside ({state.get('Status')}, exit code "
        f"{state.get('ExitCode')}: docker kill, docker stop)"
    )


async def watch_sandbox(docker: DockerBackend, container_id: str, sandbox_id: str) -> str:
    """Return (with the reason) once the sandbox is lost; checks every ``WATCH_POLL_S``."""
    while True:
        if (reason := await lost_reason(docker, container_id, sandbox_id)) is not None:
            return reason
        await asyncio.sleep(WATCH_POLL_S)  # Docker's events would need a stream of their own


async def exit_status(terminal: Terminal) -> int | None:
    """The program's exit status once its stream ended (it lags a little); None if it runs."""
    for _ in range(int(EXIT_STATUS_WAIT_S / EXIT_STATUS_POLL_S)):
        if (status := await terminal.exit_code()) is not None:
            return status
        await asyncio.sleep(EXIT_STATUS_POLL_S)  # Docker has no event for an exec's end
    return await terminal.exit_code()


async def session(
    docker: DockerBackend,
    container_id: str,
    *,
    language: str,
    config: HarombeConfig,
    sandbox_id: str = "",
) -> int:
    """Run ``language``'s program on a terminal in the container, relayed to this one; its
    exit status (128 + the signal that stopped this command; 1 if it never ended, or if the
    sandbox was lost, which is said on stderr)."""
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    sandbox = config.security.sandbox
    name = sandbox_id or container_id[:12]
    terminal = await docker.exec_interactive(
        container_id, shell_command(language, max_pids=sandbox.limits.max_pids),
        user=sandbox.user, env=shell_env(os.environ), workdir=WORKSPACE,
        size=window_size(stdout_fd, stdin_fd),
    )  # fmt: skip
    try:
        with raw_mode(stdin_fd) as is_tty:
            stopped_by = await relay(
                terminal,
                stdin_fd=stdin_fd,
                stdout_fd=stdout_fd,
                tty=is_tty,
                lost=lambda: watch_sandbox(docker, container_id, name),
            )
    except SandboxLostError as exc:
        return _say_lost(str(exc), stdout_fd)
    finally:
        terminal.close()
    if stopped_by is not None:
        ignore_stop_signals()  # stopping already: the sandbox is removed next, undisturbed
        return 128 + stopped_by
    # The stream ended: the program left, or its sandbox went first (its exec is killed).
    if (reason := await lost_reason(docker, container_id, name)) is not None:
        return _say_lost(reason, stdout_fd)
    status = await exit_status(terminal)
    if status in (None, KILLED_STATUS):  # a removal may not show in the container's state yet
        try:
            async with asyncio.timeout(LOST_GRACE_S):
                return _say_lost(await watch_sandbox(docker, container_id, name), stdout_fd)
        except TimeoutError:
            pass  # the sandbox lives on: the program was killed, or its stream was lost
    if status is None:
        return say_error(NAME, "the terminal's connection ended while the program still ran")
    return status


def _say_lost(reason: str, stdout_fd: int) -> int:
    if os.isatty(stdout_fd):
        click.echo("", err=True)  # the prompt may hold the cursor mid-line
    return say_error(NAME, f"{reason}; the session ended", EXIT_SANDBOX_LOST)


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
            return await session(
                manager.docker,
                container_id,
                language=language,
                config=config,
                sandbox_id=sandbox_id,
            )
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
    Ctrl-D ends the command with the program's exit status and removes the sandbox it made.

    \b
    Exit codes:
      the program's own    it ended by itself
      1                    harombe could not start it, or the sandbox was lost (removed,
                           stopped or killed from outside): a line on stderr says which
      2                    bad usage (options, config file)
      128+N                harombe got signal N (SIGTERM 143, SIGHUP 129)"""
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


__all__ = ["EXIT_ERROR", "EXIT_SANDBOX_LOST", "live_container", "lost_reason", "session",
           "shell", "shell_command", "shell_env", "watch_sandbox"]  # fmt: skip

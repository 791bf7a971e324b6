"""``harombe run FILE|-``: run one program in a new gVisor sandbox, stream its output, exit
with its exit code, and remove the sandbox (also on Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from harombe.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Status,
    run_async,
    say_error,
    start_command,
    started_manager,
    with_limits,
)
from harombe.cli.run_gate import command_gate, say_policy
from harombe.cli.run_mnt import check_mnt, mnt_exit_code, mnt_report, run_mounted
from harombe.cli.screen import RESET, PlainText
from harombe.config import LANGUAGES, HarombeConfig, load_config
from harombe.errors import HarombeError, UsageError

NAME = "harombe run"
#: File name endings and the language they mean.
EXTENSIONS = {
    ".py": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".sh": "shell",
    ".bash": "shell",
}
#: Exit codes of runs that did not end by themselves (as coreutils ``timeout`` and shells).
EXIT_TIMEOUT = 124
EXIT_OOM = 137
#: Run statuses that are not the program's own exit, and the code each exits with.
STATUS_EXITS = {"timeout": EXIT_TIMEOUT, "oom": EXIT_OOM, "cancelled": EXIT_INTERRUPTED}
#: harombe's own output closed by its reader (as a shell reports a pipeline killed by SIGPIPE).
EXIT_BROKEN_PIPE = 128 + 13

HELP = f"""Run FILE (or - for the program on stdin) in a new gVisor sandbox.

The language comes from FILE's extension ({", ".join(EXTENSIONS)}) or --language, which
reading stdin needs. Output is streamed as it is printed: the program's stdout to stdout, its
stderr to stderr. The sandbox is removed at the end, also on Ctrl-C.

\b
Exit codes:
  the program's own    it ended by itself (killed by signal N: 128+N)
  {EXIT_TIMEOUT}                  it ran past --timeout (as coreutils `timeout`)
  {EXIT_OOM}                  it used more than the memory limit and was killed
  {EXIT_INTERRUPTED}                  interrupted (Ctrl-C)
  {EXIT_BROKEN_PIPE}                  its output's reader went away (`harombe run x | head`)
  128+N                harombe got SIGTERM (143) or SIGHUP (129); the sandbox is removed
  1                    harombe could not run it (Docker, image, sandbox lost, not approved),
                       or with --mnt, it ran but its changes could not be brought back
  2                    bad usage (options, config file, unreadable FILE)

The person who runs this command chose the program, so the HITL gate asks only when the
config (file or HAROMBE__SECURITY__HITL__* variables) has a security.hitl section that
leaves it enabled: then a run above security.hitl.auto_approve_up_to (default high) is
shown on the terminal and runs only on a yes, and without a terminal on stdin it is refused.
The first line on stderr says which policy is in force (when a gate is, or stderr is a
terminal: otherwise stderr carries the program's own output only).
"""


def detect_language(file: str, language: str | None) -> str:
    """``language`` if given, else the one ``file``'s extension names; :class:`UsageError`
    when neither says."""
    if language is not None:
        return language
    if file == "-":
        raise UsageError("reading the program from stdin needs --language (python, "
                         "javascript or shell)")  # fmt: skip
    found = EXTENSIONS.get(Path(file).suffix.lower())
    if found is None:
        raise UsageError(
            f"cannot tell the language of {file!r} from its extension; name it with "
            f"--language ({', '.join(LANGUAGES)}) or use one of {', '.join(EXTENSIONS)}"
        )
    return found


def exit_code_of(result: Mapping[str, Any]) -> int:
    """The exit code the CLI ends with for a ``code_execute`` result (see :data:`HELP`)."""
    status = result.get("status")
    if status is None or status == "lost":  # the call failed before or outside the program
        return EXIT_ERROR
    if status == "ok":
        return 0
    if status in STATUS_EXITS:
        return STATUS_EXITS[status]
    code = result.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return EXIT_ERROR
    if code < 0:  # killed by signal -code, as a shell reports it
        return min(128 - code, 255)
    return code if code <= 255 else EXIT_ERROR


def message_of(result: Mapping[str, Any]) -> str | None:
    """What harombe says on stderr after the run, if anything (the program said the rest)."""
    status = result.get("status")
    if status is None or status in ("lost", "oom", "cancelled"):
        return str(result.get("error"))
    if status == "timeout":
        return f"timed out after {result.get('timeout_s', 0):g} s (exit {EXIT_TIMEOUT})"
    return None


def read_program(file: str) -> str:
    """The program's text from ``file`` (``-``: stdin); :class:`UsageError` when unreadable."""
    try:
        if file == "-":
            return sys.stdin.read()
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        where = "stdin" if file == "-" else repr(file)
        raise UsageError(f"cannot read the program from {where}: {exc}") from None


class Output:
    """The program's output passed through as it comes, on the stream it was written to: to a
    pipe or file as it is, to a terminal as plain text and colours (:class:`PlainText`: the
    program may not write the clipboard, retitle the window or move the cursor over what was
    shown). :meth:`finish` readies the terminal for harombe's own lines."""

    def __init__(self) -> None:
        self.filters = {name: PlainText() if getattr(sys, name).isatty() else None
                        for name in ("stdout", "stderr")}  # fmt: skip
        self.at_line_start = True
        self.shown = False  # anything reached a terminal
        self.broken = False  # the reader of stdout or stderr went away
        self._task = asyncio.current_task()

    def write(self, stream: str, data: bytes) -> None:
        name = "stdout" if stream == "stdout" else "stderr"
        out, screen = getattr(sys, name), self.filters[name]
        if screen is not None:
            data = screen.feed(data)
            self.shown = self.shown or bool(data)
        if data:
            self.at_line_start = data.endswith(b"\n")
        try:
            out.buffer.write(data)
            out.flush()
        except BrokenPipeError:  # `harombe run x | head`: stop the program, as SIGPIPE would
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # nothing more to flush
            if not self.broken and self._task is not None:
                self.broken = True
                self._task.cancel()

    def finish(self) -> None:
        """End on a new line, with the terminal's colours and modes reset, before harombe
        speaks (a program cannot leave them hiding or restyling harombe's lines)."""
        sys.stdout.flush()
        if self.filters["stderr"] is not None:
            tail = b"" if self.at_line_start else b"\n"
            sys.stderr.buffer.write((RESET if self.shown else b"") + tail)
            sys.stderr.flush()
        elif self.shown:  # only stdout is a terminal: it is reset for what the user types next
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.buffer.write(RESET)
                sys.stdout.flush()


async def install_first(
    manager: Any, tools: Any, *, language: str, network: bool | None,
    allowed_domains: Sequence[str], packages: Sequence[str],
) -> str:  # fmt: skip
    """A new sandbox with ``packages`` installed (from npm for JavaScript, else PyPI), each
    shown as a step with its seconds; :class:`UsageError` naming the first that fails."""
    default = manager.config.security.sandbox.network.enabled_by_default
    box = await manager.create_sandbox(
        language, network_enabled=default if network is None else network,
        allowed_domains=tuple(allowed_domains),
    )  # fmt: skip
    registry = "npm" if language == "javascript" else "pypi"
    with Status() as status:
        for package in packages:
            status.update(f"installing {package} from {registry}")

            def show(event: dict[str, Any], package: str = package) -> None:
                status.update(f"{package}: {event['message']}")

            done = await tools.code_install_package(
                box.sandbox_id, package, registry, on_progress=show
            )
            if not done["success"]:
                raise UsageError(f"--install {package}: {done['error']}")
            status.echo(f"installed {package} from {registry}", err=True)
    return str(box.sandbox_id)


async def run_program(
    config: HarombeConfig,
    *,
    language: str,
    code: str,
    timeout_s: float | None,
    network: bool | None,
    allowed_domains: Sequence[str],
    profile: str | None,
    gate: Any,
    output: Output,
    packages: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``code`` in a new sandbox (with ``packages`` installed first), its output
    streamed; the ``code_execute`` result. With a ``gate`` (:func:`command_gate`), it
    decides each step first."""
    from harombe.tools.code_execution import CodeExecutionTools

    async with started_manager(config) as manager:
        tools = CodeExecutionTools(manager, gate)
        sandbox_id = None
        if packages:
            sandbox_id = await install_first(
                manager, tools, language=language, network=network,
                allowed_domains=allowed_domains, packages=packages,
            )  # fmt: skip
            network, allowed_domains = None, ()  # the sandbox has them now
        return await tools.code_execute(
            language=language, code=code, sandbox_id=sandbox_id, timeout=timeout_s,
            network_enabled=network, allowed_domains=list(allowed_domains), fresh=True,
            profile=profile, on_output=output.write,
        )  # fmt: skip


@click.command(help=HELP)
@click.argument("file", metavar="FILE|-")
@click.option("-l", "--language", type=click.Choice(LANGUAGES), help="the program's language")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="kill it after this long (default: max_execution_time)",
)
@click.option("--memory-mb", type=click.IntRange(min=32), help="memory limit, MiB")
@click.option(
    "--cpus",
    type=click.FloatRange(min=0, min_open=True, max=64),
    help="CPU cores it may use (e.g. 0.5)",
)
@click.option(
    "--network/--no-network",
    default=None,
    help="give it network access, limited to --allow-domain names",
)
@click.option(
    "--allow-domain",
    "allowed_domains",
    multiple=True,
    metavar="NAME",
    help="a host name it may reach (repeatable; implies --network)",
)
@click.option("--profile", help="a policy profile to run under (Python), e.g. minimal")
@click.option(
    "--install",
    "packages",
    multiple=True,
    metavar="PACKAGE",
    help="install PACKAGE first (repeatable; from npm for JavaScript, else PyPI), "
    "e.g. --install 'six==1.16.0'",
)
@click.option(
    "--mnt",
    "mnt_dir",
    type=click.Path(exists=True, file_okay=False),
    metavar="DIR",
    help="copy DIR into the sandbox at /mnt (its working directory), "
    "and what the program changed there back into DIR",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="config file (default $HAROMBE_CONFIG)",
)
@click.pass_context
def run(ctx: click.Context, file: str, language: str | None, timeout_s: float | None,
        memory_mb: int | None, cpus: float | None, network: bool | None,
        allowed_domains: tuple[str, ...], profile: str | None, packages: tuple[str, ...],
        mnt_dir: str | None, config_path: str | None) -> int:  # fmt: skip
    start_command(ctx)
    try:
        chosen = detect_language(file, language)
        code = read_program(file)
        loaded = load_config(config_path)
        config = with_limits(loaded, max_memory_mb=memory_mb, max_cpu_cores=cpus,
                             max_execution_time=timeout_s)  # fmt: skip
        if packages and profile:
            raise UsageError("--install and --profile cannot be combined: a profile's sandbox "
                             "takes no installs; drop one of them")  # fmt: skip
        if mnt_dir is not None:
            check_mnt(packages=packages, profile=profile)
        gate = command_gate(loaded, config)
    except HarombeError as exc:  # UsageError, ConfigError: how it was asked
        return say_error(NAME, exc, EXIT_USAGE)
    say_policy(gate)
    if allowed_domains and network is None:
        network = True

    async def main() -> int:
        output = Output()
        try:
            if mnt_dir is not None:
                result = await run_mounted(
                    config,
                    mnt_dir=mnt_dir,
                    language=chosen,
                    code=code,
                    timeout_s=timeout_s,
                    network=network,
                    allowed_domains=allowed_domains,
                    on_output=output.write,
                    gate=gate,
                )
            else:
                result = await run_program(config, language=chosen, code=code,
                                           timeout_s=timeout_s, network=network,
                                           allowed_domains=allowed_domains, profile=profile,
                                           gate=gate, output=output,
                                           packages=packages)  # fmt: skip
        except HarombeError as exc:  # Docker away, image missing, runtime not registered
            return say_error(NAME, exc)
        except asyncio.CancelledError:
            if not output.broken:
                raise
            return EXIT_BROKEN_PIPE
        finally:
            output.finish()  # before any line of harombe's, also after Ctrl-C
        for stream in ("stdout", "stderr"):
            if result.get(f"{stream}_truncated"):
                say_error(NAME, f"warning: the program's {stream} was cut at "
                          f"security.sandbox.limits.max_output_bytes")  # fmt: skip
        for warning in result.get("warnings") or ():
            say_error(NAME, f"warning: {warning}")
        for line in mnt_report(result):
            say_error(NAME, line)
        message = message_of(result)
        if message:
            say_error(NAME, message)
        return mnt_exit_code(result, exit_code_of(result))

    return run_async(main)

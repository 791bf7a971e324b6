"""The ``harombe`` command line (click): one module per command, imported only when run.

``harombe --help`` lists the commands without importing them, so starting the CLI stays fast;
each command lives in ``harombe/cli/<module>.py`` as a click command named in :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
import sys

import click

#: command name → (module under harombe.cli, attribute, one-line help shown by --help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run", "run a file (or - for stdin) in a gVisor sandbox"),
    "shell": ("shell", "shell", "an interactive bash or Python shell inside a gVisor sandbox"),
    "ls": ("sandboxes", "ls", "list live sandboxes on this Docker daemon"),
    "rm": ("sandboxes", "rm", "remove sandboxes by id (or --all)"),
    "doctor": ("doctor", "doctor", "check Docker, runsc, the images and isolation"),
    "mcp": ("mcp", "mcp", "serve the tools over MCP on stdio"),
    "serve": ("serve", "serve", "serve the sidecar contract, the /v1 API and the approvals page"),
    "demo": ("demo", "demo", "run Python, JavaScript and shell in gVisor and print results"),
    "images": ("images", "images", "build the sandbox image from Debian packages"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attribute, _ = entry
        module = importlib.import_module(f"harombe.cli.{module_name}")
        command = getattr(module, attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="show harombe's log events on stderr")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Run LLM-written code in gVisor sandboxes."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (``python -m harombe`` exits)."""
    try:
        code = cli.main(args=argv, prog_name="harombe", standalone_mode=False)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    # A command returns its exit code (an int); one that returns nothing succeeded.
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

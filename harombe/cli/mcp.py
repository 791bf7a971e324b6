"""``harombe mcp``: the tools over MCP on stdin/stdout (see :mod:`harombe.service.mcp`)."""

from __future__ import annotations

import click

from harombe.cli.common import EXIT_USAGE, say_error, start_command

HELP = """\
Serve harombe's six tools to an MCP client over stdin/stdout.

\b
Claude Desktop, Cursor and other clients start it themselves, e.g.:
  {"mcpServers": {"harombe": {"command": "harombe", "args": ["mcp"]}}}

Sandboxes live between calls (pass a result's sandbox_id) and are all removed
when the client disconnects. Calls up to security.hitl.auto_approve_up_to
(default high: plain code) run at once; calls above it are put to the person
at the client through MCP elicitation, and a client without elicitation gets
them denied at once with the reason. The first line on stderr says so. Logs
go to stderr; stdout carries the protocol.
"""


@click.command(help=HELP)
@click.option("--config", "config_path", help="config file (default $HAROMBE_CONFIG)")
@click.pass_context
def mcp(ctx: click.Context, config_path: str | None) -> int:
    from harombe.errors import ConfigError
    from harombe.service.mcp import run_stdio

    start_command(ctx)
    try:
        return run_stdio(config_path)
    except ConfigError as exc:
        return say_error("harombe mcp", exc, EXIT_USAGE)

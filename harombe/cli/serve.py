"""``harombe serve``: the click front of :mod:`harombe.service.serve`, which does the work."""

from __future__ import annotations

import argparse

import click

from harombe.cli.common import EXIT_USAGE, say_error, start_command
from harombe.service.serve import HELP


@click.command(help="\b\n" + HELP.replace("\n\n", "\n\n\b\n"))
@click.option("--host", help="address to bind (default service.host, 127.0.0.1)")
@click.option("--port", type=int, help="port (default service.port, 8000)")
@click.option("--config", "config_path", help="config file (default $HAROMBE_CONFIG)")
@click.pass_context
def serve(ctx: click.Context, host: str | None, port: int | None, config_path: str | None) -> int:
    from harombe.errors import ConfigError
    from harombe.service import serve as service_serve

    start_command(ctx)
    args = argparse.Namespace(host=host, port=port, config=config_path)
    try:
        return service_serve.run(args)
    except ConfigError as exc:
        return say_error("harombe serve", exc, EXIT_USAGE)

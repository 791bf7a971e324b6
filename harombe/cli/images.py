"""``harombe images build``: build the sandbox image from Debian packages, its steps shown as
they start (with the time since the build began)."""

from __future__ import annotations

import time

import click

from harombe.cli.common import Status, start_command


@click.group(help="Build the sandbox image harombe's sandboxes start from.")
def images() -> None:
    """The ``images`` command group."""


@images.command(help="Build the sandbox image (Debian, Python, Node.js, a non-root user) and "
                "tag it harombe/sandbox:latest; a build whose recipe is unchanged takes "
                "seconds. Needs root.")  # fmt: skip
@click.option("--force", is_flag=True, help="rebuild even if up to date")
@click.pass_context
def build(ctx: click.Context, force: bool) -> int:
    from harombe.errors import InfrastructureError
    from harombe.images import build as build_image

    start_command(ctx)
    started = time.monotonic()
    with Status("starting the image build") as status:

        def say(message: str) -> None:
            status.echo(f"[{time.monotonic() - started:6.1f} s] {message}")
            status.update(message.strip())

        try:
            build_image(force=force, say=say)
        except InfrastructureError as exc:  # BuildError, or Docker itself failing
            status.echo(f"harombe: image build failed: {exc}", err=True)
            return 1
    return 0

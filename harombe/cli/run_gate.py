"""The HITL gate of ``harombe run``: the terminal approver, the gate the config asks for, and
the policy line said at start."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import Any

import click

from harombe.cli.common import hitl_requested, say_error
from harombe.config import HarombeConfig
from harombe.security.approval.approvers import HELD_ON_TERMINAL, stdin_is_tty
from harombe.security.approval.gate import gate_from_config
from harombe.security.approval.policy_line import policy_line

NAME = "harombe run"


async def ask_on_terminal(request: Any) -> Any:
    """The CLI's approver: show the request and ask yes/no on the terminal (the person
    running the command is the human in the loop); deny when stdin is not a terminal."""
    from harombe.security.approval.approvers import render_request
    from harombe.security.approval.gate import ApprovalResponse

    if not sys.stdin.isatty():
        return ApprovalResponse(
            False, approver="harombe run", comment="no terminal on stdin to ask for approval"
        )
    click.echo(render_request(request), err=True)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bool] = loop.create_future()

    def ask() -> None:  # a daemon thread: Ctrl-C or the gate's timeout leave it behind
        try:
            yes = click.confirm("Run it?", default=False, err=True)
        except (click.Abort, EOFError):
            yes = False

        def give() -> None:
            if not answer.done():
                answer.set_result(yes)

        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(give)

    threading.Thread(target=ask, daemon=True, name="harombe-approval").start()
    return ApprovalResponse(await answer, approver="harombe run")


ask_on_terminal.held_calls = HELD_ON_TERMINAL  # type: ignore[attr-defined]


def command_gate(loaded: HarombeConfig, config: HarombeConfig) -> Any:
    """The gate of ``harombe run``: none unless the config asks for one
    (:func:`~harombe.cli.common.hitl_requested`); then the config's, asking on this terminal
    (or the approver ``security.hitl.approver`` names). A bad approver is a ConfigError."""
    if not hitl_requested(loaded):
        return None
    return gate_from_config(config, surface_approver=ask_on_terminal if stdin_is_tty() else None)


def say_policy(gate: Any) -> None:
    """The policy line on stderr, when a gate is in force or stderr is a terminal: ungated and
    piped, stderr stays exactly the program's own (``2>err``, pipelines)."""
    if gate is not None or sys.stderr.isatty():
        say_error(NAME, policy_line(gate, "run"))

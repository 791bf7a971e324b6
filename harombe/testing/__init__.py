"""Test helpers shipped with harombe, for its own tests and for yours.

* :class:`ScriptedApprover` — an approver that answers from a script and records every request,
  so a test can assert what a human would have been shown.
* :func:`capture_events` — the structured log events emitted inside a ``with`` block (a thin
  wrapper over :func:`structlog.testing.capture_logs`), for asserting audit events.
* :class:`FakeDocker` — Docker in memory, a
  :class:`~harombe.security.runtime.backend.DockerBackend` to hand to a real
  :class:`~harombe.security.sandbox_manager.SandboxManager`: everything above the Docker seam
  (the warm pool, the channel, result mapping, lost-sandbox replacement, ``stop()``, the HITL
  gate and the tools) runs for real, in milliseconds, without Docker or gVisor. Faults on
  demand: :meth:`FakeDocker.fail` (the next calls of a method raise, e.g. Docker away),
  :meth:`FakeDocker.kill` and :meth:`FakeDocker.pause` (a sandbox dies or hangs).
* :class:`FakeGuest` — what runs "inside" each fake container: it speaks the supervisor's wire
  protocol, keeps workspace files in a dict, and computes each run's :class:`RunOutcome` with a
  handler you can replace (the default, :func:`echo_handler`, understands ``print(<literal>)``,
  ``exit(<n>)``, ``echo`` and a few more; :func:`code_of` gives a handler the code it was sent).
* :class:`FakeTerminal` — the pseudo-terminal :meth:`FakeDocker.exec_interactive` hands out
  (what ``harombe shell`` talks to): it echoes lines, records resizes, ends on ``exit N``.

What the fakes do not do: run code, enforce limits other than the timeout and the output cap,
or give network-enabled sandboxes a network (those need the host's firewall: test them against
real Docker).

Example::

    from harombe.config import parse_config
    from harombe.security.sandbox_manager import SandboxManager
    from harombe.testing import FakeDocker, RunOutcome
    from harombe.tools.code_execution import CodeExecutionTools

    async def test_my_agent_reports_failures() -> None:
        docker = FakeDocker(handler=lambda msg, stdin: RunOutcome(stderr="boom\\n", exit_code=2))
        await docker.start()
        manager = SandboxManager(docker, config=parse_config({}))
        await manager.start()
        try:
            tools = CodeExecutionTools(manager)
            result = await tools.code_execute(language="python", code="anything")
            assert result["exit_code"] == 2 and result["stderr"] == "boom\\n"
        finally:
            await manager.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

from harombe.security.approval.gate import ApprovalRequest, ApprovalResponse
from harombe.testing.docker import FakeContainer, FakeDocker, FakeNetwork, FakeStdio
from harombe.testing.echo import RunHandler, RunOutcome, code_of, echo_handler, language_of
from harombe.testing.guest import FakeGuest
from harombe.testing.terminal import FakeTerminal

__all__ = [
    "HANG", "FakeContainer", "FakeDocker", "FakeGuest", "FakeNetwork", "FakeStdio",
    "FakeTerminal", "RunHandler", "RunOutcome", "ScriptedApprover", "capture_events", "code_of",
    "echo_handler", "language_of",
]  # fmt: skip

#: A scripted answer that never comes: the gate's timeout decides.
HANG = "hang"


class ScriptedApprover:
    """Answers requests in order from ``answers`` (bools, :class:`ApprovalResponse` objects or
    :data:`HANG`), then with ``default``; every request is appended to ``requests``."""

    name = "scripted"

    def __init__(
        self, answers: Iterable[bool | ApprovalResponse | str] = (), *, default: bool = False
    ) -> None:
        self.answers = list(answers)
        self.default = default
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest) -> bool | ApprovalResponse:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else self.default
        if answer == HANG:
            await asyncio.Event().wait()  # never set: cancelled by the gate's timeout
        assert not isinstance(answer, str), f"unknown scripted answer {answer!r}"
        return answer


@contextmanager
def capture_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """Collect the structlog events emitted in the block, as dicts with an ``event`` key."""
    with structlog.testing.capture_logs() as events:
        yield events

"""Test helpers shipped with harombe, for its own tests and for yours.

* :class:`ScriptedApprover` — an approver that answers from a script and records every request,
  so a test can assert what a human would have been shown.
* :func:`capture_events` — the structured log events emitted inside a ``with`` block (a thin
  wrapper over :func:`structlog.testing.capture_logs`), for asserting audit events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

from harombe.security.approval.gate import ApprovalRequest, ApprovalResponse

__all__ = ["ScriptedApprover", "capture_events"]

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

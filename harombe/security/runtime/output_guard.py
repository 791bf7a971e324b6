"""The caller's ``on_output`` callback, guarded so that its failures cost only the streaming.

The sandbox's channel calls ``on_output`` (and awaits it, when it is async) from the task that
reads the sandbox's replies; an exception there would end that task and lose the sandbox with
all its state, and a callback that never returns would stall the run until its timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import structlog

from harombe.security.policy.paths import preview
from harombe.security.runtime.channel import OutputCallback

log = structlog.get_logger(__name__)

#: How long an async ``on_output`` may take with one chunk before streaming to it stops (the
#: sandbox's channel waits for it, so a stuck consumer would otherwise stall the run).
ON_OUTPUT_WAIT_S = 10.0


class GuardedOutput:
    """``on_output`` as the sandbox's channel calls it. An exception from the caller's callback,
    or an async callback still pending after ``ON_OUTPUT_WAIT_S``, stops the streaming (said in
    the result's warnings) and never reaches the channel, where it would end the sandbox's
    connection and lose the sandbox and its state."""

    def __init__(self, callback: OutputCallback) -> None:
        self.callback = callback
        self.failure: str | None = None

    def __call__(self, stream: str, data: bytes) -> Awaitable[None] | None:
        if self.failure is not None:
            return None
        try:
            maybe = self.callback(stream, data)
        except Exception as exc:  # noqa: BLE001 - the caller's bug must not cost the sandbox
            self._failed(f"raised {type(exc).__name__}: {preview(str(exc))}")
            return None
        return None if maybe is None else self._wait(maybe)

    async def _wait(self, pending: Awaitable[None]) -> None:
        try:
            await asyncio.wait_for(pending, ON_OUTPUT_WAIT_S)
        except TimeoutError:
            self._failed(f"did not return within {ON_OUTPUT_WAIT_S:g}s")
        except Exception as exc:  # noqa: BLE001 - as above
            self._failed(f"raised {type(exc).__name__}: {preview(str(exc))}")

    def _failed(self, what: str) -> None:
        self.failure = (
            f"on_output {what}; output after that was not streamed to it (it is still in "
            "stdout/stderr)"
        )
        log.warning("execution.on_output_failed", error=self.failure)

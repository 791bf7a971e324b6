"""Output as it is produced: an async iterator over a call that reports chunks by callback.

``iterate(start)`` runs ``start(on_output)`` in a task and yields :class:`OutputChunk` objects
(UTF-8 decoded per stream, never splitting a character) as the sandbox sends them, then the
call's own return value as the last item. Leaving the loop early cancels the call, which
cancels the run inside the sandbox.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from harombe.security.runtime.channel import OutputCallback

T = TypeVar("T")


@dataclass(frozen=True)
class OutputChunk:
    """Text a run wrote to ``stream`` (``stdout`` or ``stderr``)."""

    stream: str
    text: str


_DONE = object()


async def iterate(
    start: Callable[[OutputCallback], Awaitable[T]],
) -> AsyncGenerator[OutputChunk | T, None]:
    """Chunks while ``start`` runs, then its result; see the module docstring."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    decoders = {
        name: codecs.getincrementaldecoder("utf-8")(errors="replace")
        for name in ("stdout", "stderr")
    }

    def on_output(stream: str, data: bytes) -> None:
        text = decoders[stream].decode(data)
        if text:
            queue.put_nowait(OutputChunk(stream, text))

    task = asyncio.ensure_future(start(on_output))
    task.add_done_callback(lambda _: queue.put_nowait(_DONE))
    try:
        while (item := await queue.get()) is not _DONE:
            yield item  # type: ignore[misc]
        yield task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

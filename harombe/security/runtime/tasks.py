"""Task helpers for work that must not be cut short: clean-up that outlives a cancelled
caller, and fire-and-forget tasks that are kept, logged and awaitable."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


async def settle(work: Awaitable[T], *, undo: Callable[[T], Awaitable[object]] | None = None) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then re-raise the
    cancellation — after ``undo(result)`` has removed what the work made, when given. For
    clean-up that must not be cut short, and for steps that create something only they know.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled, not only the caller
                raise
            cancelled = True
            continue
        except BaseException:
            if cancelled:
                raise asyncio.CancelledError from None
            raise
        if cancelled:
            if undo is not None:
                with contextlib.suppress(Exception):
                    await settle(undo(result))
            raise asyncio.CancelledError
        return result


async def outlast(future: asyncio.Future[T]) -> tuple[T] | None:
    """Wait for ``future`` through any cancellation; ``(result,)``, or None if it failed."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future})
    if future.cancelled() or future.exception() is not None:  # retrieved: never logged
        return None
    return (future.result(),)


class Background:
    """Fire-and-forget tasks that are kept referenced, whose failures are logged (never left
    as "exception was never retrieved"), and that can be waited for."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, so asyncio never reports it
        if exc is not None:
            log.warning("background.task_failed", task=task.get_name(), error=repr(exc))

    async def wait(self) -> None:
        """Until every task spawned so far (and any they spawn) has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

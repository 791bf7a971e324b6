"""A warm pool: sandboxes started ahead of need, so creating one is a hand-over, not a boot.

One queue per key (language, image, runtime, limits). A sandbox in the pool has run nothing:
it was created, its supervisor answered, and for Python and JavaScript its session interpreter
was started, and that is all. It leaves the pool exactly once, to one caller, and never comes
back: a sandbox anyone ran code in is never handed to anyone else. Waiting sandboxes older than
``max_age_s`` are replaced. Refills run in the background, one sandbox at a time, so a burst of
claims does not start a burst of containers competing for the CPU with the code being run.

Pooled containers carry the same labels as every other sandbox (plus ``harombe.pooled``), so
``SandboxManager.stop()`` and the orphan sweep remove them like the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

import structlog

from harombe.security.sandbox import Sandbox

log = structlog.get_logger(__name__)

Launch = Callable[[Hashable], Coroutine[Any, Any, Sandbox]]
Discard = Callable[[Sandbox], Coroutine[Any, Any, None]]


class WarmPool:
    """Keeps up to ``size`` ready sandboxes per key; see the module docstring."""

    def __init__(self, launch: Launch, discard: Discard, *, size: int, max_age_s: float) -> None:
        self._launch = launch
        self._discard = discard
        self.size = size
        self.max_age_s = max_age_s
        self._ready: dict[Hashable, deque[Sandbox]] = {}
        self._refills: dict[Hashable, asyncio.Task[None]] = {}
        self._closed = False

    def ready(self, key: Hashable) -> list[str]:
        """The ids of the sandboxes waiting for ``key`` now, oldest first."""
        return [box.sandbox_id for box in self._ready.get(key, ())]

    def claim(self, key: Hashable) -> Sandbox | None:
        """A ready sandbox for ``key`` (removed from the pool), or None; starts a refill."""
        if self.size <= 0 or self._closed:
            return None
        queue = self._ready.setdefault(key, deque())
        box = None
        now = time.time()
        while queue:
            candidate = queue.popleft()
            if now - candidate.created_at < self.max_age_s and candidate.runs == 0:
                box = candidate
                break
            self._retire(candidate, "expired")
        self.fill(key)
        return box

    def fill(self, key: Hashable) -> None:
        """Top the pool for ``key`` up to ``size`` in the background (no-op if already doing so)."""
        if self.size <= 0 or self._closed:
            return
        task = self._refills.get(key)
        if task is None or task.done():
            self._refills[key] = asyncio.create_task(self._refill(key))

    async def settled(self) -> None:
        """Wait until no refill is running (every pool is full, or failed to fill)."""
        while tasks := [t for t in self._refills.values() if not t.done()]:
            await asyncio.wait(tasks)

    async def _refill(self, key: Hashable) -> None:
        queue = self._ready.setdefault(key, deque())
        while not self._closed and len(queue) < self.size:
            started = time.perf_counter()
            try:
                box = await self._launch(key)
            except Exception as exc:  # noqa: BLE001 - a failed refill must not kill the pool
                log.warning("pool.refill_failed", key=str(key), error=repr(exc))
                return  # claims fall back to cold starts; the next claim tries again
            if self._closed:
                await self._discard(box)
                return
            queue.append(box)
            log.debug(
                "pool.filled",
                key=str(key),
                sandbox_id=box.sandbox_id,
                ready=len(queue),
                duration_s=round(time.perf_counter() - started, 4),
            )

    def _retire(self, box: Sandbox, reason: str) -> None:
        log.info("pool.retired", sandbox_id=box.sandbox_id, reason=reason)
        task: asyncio.Task[None] = asyncio.create_task(self._discard(box))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def close(self) -> list[Sandbox]:
        """Stop refilling; the sandboxes still waiting, for the caller to remove."""
        self._closed = True
        for task in self._refills.values():
            task.cancel()
        for task in self._refills.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        waiting = [box for queue in self._ready.values() for box in queue]
        self._ready.clear()
        return waiting

"""A warm pool: sandboxes started ahead of need, so creating one is a hand-over, not a boot.

One queue per key (language, image, runtime, limits). A sandbox in the pool has run nothing:
it was created, its supervisor answered, and for Python and JavaScript its session interpreter
was started, and that is all. It leaves the pool exactly once, to one caller, and never comes
back: a sandbox anyone ran code in is never handed to anyone else. Waiting sandboxes older than
``max_age_s`` are replaced. Refills run in the background, one sandbox at a time, so a burst of
claims does not start a burst of containers competing for the CPU with the code being run.

A claim hands out only a sandbox that answers: one whose channel has ended (its container was
killed, removed, or Docker's connection to it dropped) is discarded without a round trip, and
the rest must answer ``probe`` (a ping) in time, so a paused or hung one is discarded too. The
claim then tries the next, and returns None when none is left (the caller cold-starts).

Pooled containers carry the same labels as every other sandbox (plus ``harombe.pooled``), so
``SandboxManager.stop()`` and the orphan sweep remove them like the rest.

A *lazy* pool (``lazy=True``) starts a key's refills only at that key's second claim (or when
:meth:`WarmPool.fill` is called): a process that asks for one sandbox starts exactly one, and
one that keeps asking has a warm pool from its third sandbox on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

import structlog

from harombe.security.runtime.sandbox import Sandbox
from harombe.security.runtime.tasks import Background, settle

log = structlog.get_logger(__name__)

Launch = Callable[[Hashable], Coroutine[Any, Any, Sandbox]]
Discard = Callable[[Sandbox], Coroutine[Any, Any, None]]
Probe = Callable[[Sandbox], Coroutine[Any, Any, bool]]


async def _always_alive(box: Sandbox) -> bool:
    return box.channel.lost is None


class WarmPool:
    """Keeps up to ``size`` ready sandboxes per key; see the module docstring."""

    def __init__(
        self,
        launch: Launch,
        discard: Discard,
        *,
        size: int,
        max_age_s: float,
        probe: Probe = _always_alive,
        lazy: bool = False,
    ) -> None:
        self._launch = launch
        self._discard = discard
        self._probe = probe
        self.size = size
        self.sizes: dict[Hashable, int] = {}  # keys whose pool is not ``size`` (environments)
        self.max_age_s = max_age_s
        self.lazy = lazy
        self._claims: dict[Hashable, int] = {}  # by key: claims so far (a lazy pool's trigger)
        self._ready: dict[Hashable, deque[Sandbox]] = {}
        self._refills: dict[Hashable, asyncio.Task[None]] = {}
        self._background = Background()
        self._closed = False

    def size_of(self, key: Hashable) -> int:
        """How many sandboxes the pool keeps ready for ``key`` (0 when the pool is off)."""
        return self.sizes.get(key, self.size) if self.size > 0 else 0

    def ready(self, key: Hashable) -> list[str]:
        """The ids of the sandboxes waiting for ``key`` now, oldest first."""
        return [box.sandbox_id for box in self._ready.get(key, ())]

    def waiting(self) -> list[Sandbox]:
        """Every sandbox waiting now, whatever its key."""
        return [box for boxes in self._ready.values() for box in boxes]

    def all_ready(self) -> list[str]:
        """The ids of every sandbox waiting now, whatever its key (profiles included)."""
        return [box.sandbox_id for boxes in self._ready.values() for box in boxes]

    async def claim(self, key: Hashable) -> Sandbox | None:
        """A ready, live sandbox for ``key`` (removed from the pool), or None; starts a refill
        (in a lazy pool, from the key's second claim on).

        Candidates that are too old, were used, or do not answer are retired on the way."""
        if self.size_of(key) <= 0 or self._closed:
            return None
        self._claims[key] = claims = self._claims.get(key, 0) + 1
        queue = self._ready.setdefault(key, deque())
        box = None
        try:
            while queue and box is None:
                candidate = queue.popleft()
                if time.time() - candidate.created_at >= self.max_age_s or candidate.runs:
                    self._retire(candidate, "expired")
                    continue
                try:
                    alive = candidate.channel.lost is None and await self._probe(candidate)
                except BaseException:
                    queue.appendleft(candidate)  # the claimer gave up; the sandbox is still good
                    raise
                if alive:
                    box = candidate
                else:
                    self._retire(candidate, "dead")
        finally:
            if claims > 1 or not self.lazy:
                self.fill(key)
        return box

    def fill(self, key: Hashable) -> None:
        """Top the pool for ``key`` up to ``size`` in the background (no-op if already doing so)."""
        if self.size_of(key) <= 0 or self._closed:
            return
        task = self._refills.get(key)
        if task is None or task.done():
            self._refills[key] = self._background.spawn(self._refill(key), name=f"refill-{key}")

    async def settled(self) -> None:
        """Wait until no refill or removal is running (every pool is full, or failed to fill)."""
        while tasks := [t for t in self._refills.values() if not t.done()]:
            await asyncio.wait(tasks)
        await self._background.wait()

    async def _refill(self, key: Hashable) -> None:
        queue = self._ready.setdefault(key, deque())
        while not self._closed and len(queue) < self.size_of(key):
            started = time.perf_counter()
            try:
                box = await self._launch(key)
            except Exception as exc:  # noqa: BLE001 - a failed refill must not kill the pool
                log.warning("pool.refill_failed", key=str(key), error=repr(exc))
                return  # claims fall back to cold starts; the next claim tries again
            if self._closed:  # close() raced this launch: the sandbox is nobody's
                await settle(self._discard(box))
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
        self._background.spawn(self._discard(box), name=f"retire-{box.sandbox_id}")

    async def close(self) -> list[Sandbox]:
        """Stop refilling; the sandboxes still waiting, for the caller to remove."""
        self._closed = True
        for task in self._refills.values():
            task.cancel()
        for task in self._refills.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._background.wait()  # retirements finish: their containers are gone
        waiting = [box for queue in self._ready.values() for box in queue]
        self._ready.clear()
        return waiting

"""Keeping the install cache within its size: least recently used environments out, and the
debris of builders that died removed. Part of :class:`.environments.EnvironmentStore`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

import structlog

from harombe.security.runtime.environment_unpack import remove_tree

log = structlog.get_logger(__name__)


class EnvironmentStore(Protocol):
    """What eviction reads of :class:`.environments.EnvironmentStore`."""

    directory: Path
    envs: Path
    max_bytes: int

    def load(self, key: str, *, reused: bool) -> Any: ...


#: Environments used within this long are never evicted (a sandbox may be importing from one).
EVICT_GRACE_S = 3600.0
#: A staging tree this old belongs to a builder that died (builds end within their timeouts).
DEBRIS_AGE_S = 4 * 3600.0


def _used_at(store: EnvironmentStore, key: str) -> float:
    try:
        return os.stat(store.directory / "used" / key).st_mtime
    except OSError:
        return 0.0


def evict(
    store: EnvironmentStore, in_use: Collection[str], *, now: float | None = None
) -> list[str]:
    """Remove least recently used environments until the cache fits its size; never one used
    within :data:`EVICT_GRACE_S` or in ``in_use`` (linked into a live sandbox here, or held).
    The keys removed. Debris (staging trees of dead builders, half-removed entries) goes too."""
    now = time.time() if now is None else now
    sweep_debris(store, now=now)
    entries = []
    for entry in os.scandir(store.envs):
        env = store.load(entry.name, reused=True)
        if env is not None:
            entries.append((_used_at(store, entry.name), entry.name, env.size_bytes))
    total = sum(size for _, _, size in entries)
    removed = []
    for _, key, size in sorted(entries):
        if total <= store.max_bytes:
            break
        # Read again just before: a user in another process may have touched it meanwhile.
        if key in in_use or now - _used_at(store, key) < EVICT_GRACE_S:
            continue
        gone = store.directory / "tmp" / f"evicted-{key}.{time.monotonic_ns()}"
        try:
            os.rename(store.envs / key, gone)  # out of sight at once, then deleted
        except OSError:
            continue
        remove_tree(gone)
        with contextlib.suppress(OSError):
            os.unlink(store.directory / "used" / f"{key}.imports-ok")
        total -= size
        removed.append(key)
        log.info("environment.evicted", key=key, size_bytes=size)
    return removed


def sweep_debris(store: EnvironmentStore, *, now: float) -> None:
    """What ``tmp/`` holds that nobody will finish: a staging tree (``<key>.<pid>.<n>``) of a
    builder that is gone, an evicted tree, anything older than :data:`DEBRIS_AGE_S`."""
    tmp: Path = store.directory / "tmp"
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp):
            parts = entry.name.split(".")
            dead = len(parts) == 3 and parts[1].isdigit() and not _alive(int(parts[1]))
            with contextlib.suppress(OSError):
                old = now - entry.stat(follow_symlinks=False).st_mtime > DEBRIS_AGE_S
                if dead or old or entry.name.startswith("evicted-"):
                    remove_tree(tmp / entry.name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True

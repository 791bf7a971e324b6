"""Keeping the install cache within its size: least recently used environments out, and the
debris of builders that died removed. Part of :class:`.environments.EnvironmentStore`.

What is in use is never evicted: a process records each environment its live (or pooled)
sandboxes link, and each one it is about to hand out, as a hold file (:mod:`.environment_holds`)
whose mtime is the time it holds until. A hold counts while its process (pid and start time)
is alive and its time has not passed."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from harombe.errors import PackageFetchError
from harombe.security.runtime.environment_holds import hold_alive
from harombe.security.runtime.environment_unpack import remove_tree

log = structlog.get_logger(__name__)


class EnvironmentStore(Protocol):
    """What eviction reads of :class:`.environments.EnvironmentStore`."""

    directory: Path
    envs: Path
    max_bytes: int

    def load(self, key: str, *, reused: bool) -> Any: ...


#: A staging tree this old belongs to a builder that died (builds end within their timeouts).
DEBRIS_AGE_S = 4 * 3600.0


def _used_at(store: EnvironmentStore, key: str) -> float:
    try:
        return os.stat(store.directory / "used" / key).st_mtime
    except OSError:
        return 0.0


def held_keys(store: EnvironmentStore, *, now: float) -> set[str]:
    """Keys with a hold of a live process that has not run out; dead holds are removed."""
    held: set[str] = set()
    alive: dict[tuple[str, str], bool] = {}  # a process holds many keys: look it up once
    with contextlib.suppress(OSError):
        for entry in os.scandir(store.directory / "holds"):
            parts = entry.name.split(".")
            with contextlib.suppress(OSError, ValueError):
                owner = (parts[1], parts[2].partition("-")[0]) if len(parts) == 3 else None
                if owner is not None and owner not in alive:
                    alive[owner] = hold_alive(int(owner[0]), owner[1])
                if owner is not None and alive[owner]:
                    if entry.stat(follow_symlinks=False).st_mtime > now:
                        held.add(parts[0])
                    continue
                os.unlink(entry.path)
    return held


def evict(
    store: EnvironmentStore,
    in_use: Collection[str],
    *,
    now: float | None = None,
    need_bytes: int = 0,
) -> tuple[list[str], int]:
    """Remove least recently used environments until the cache, plus ``need_bytes`` about to
    be added, fits its size; never one in ``in_use`` (this process's) or held by a process
    (see the module docstring). The keys removed and the bytes that stay in the cache. Debris
    (staging trees of dead builders, half-removed entries, dead holds) goes too."""
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
        if total + need_bytes <= store.max_bytes:
            break
        # Read the holds just before: a user in another process may have taken one meanwhile.
        if key in in_use or key in held_keys(store, now=now):
            continue
        gone = store.directory / "tmp" / f"evicted-{key}.{time.monotonic_ns()}"
        try:
            os.rename(store.envs / key, gone)  # out of sight at once, then deleted
        except OSError:
            continue
        if key in held_keys(store, now=now):  # held as it went: it stays
            with contextlib.suppress(OSError):
                os.rename(gone, store.envs / key)
                continue
        remove_tree(gone)
        with contextlib.suppress(OSError):
            os.unlink(store.directory / "used" / f"{key}.imports-ok")
        total -= size
        removed.append(key)
        log.info("environment.evicted", key=key, size_bytes=size)
    return removed, total


@contextlib.contextmanager
def publishing(directory: Path) -> Iterator[None]:
    """The cache-wide lock (threads and processes) under which a builder makes room and
    publishes: two builders at once cannot each count the room the other is taking.
    Blocking: builds run in a thread."""
    fd = os.open(directory / "locks" / "publish.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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


def make_room(
    store: EnvironmentStore, in_use: Collection[str], size_bytes: int, requirements: Sequence[str]
) -> None:
    """Evict until ``size_bytes`` more fit, else raise :class:`PackageFetchError` naming the
    cap, what is held and the setting to raise."""
    _, kept = evict(store, in_use, need_bytes=size_bytes)
    if kept + size_bytes > store.max_bytes:
        raise PackageFetchError(
            f"{', '.join(requirements)} needs {_mb(size_bytes)} MB in the install cache, "
            f"which holds {_mb(kept)} MB that sandboxes use or are about to, and its cap is "
            f"{store.max_bytes >> 20} MB; raise security.sandbox.install_cache.max_mb (to "
            f"at least {_mb(kept + size_bytes)}), or destroy sandboxes that use other "
            "packages and install again"
        )


def _mb(count: int) -> int:
    """Whole MiB, rounded up."""
    return -(-count // (1 << 20))

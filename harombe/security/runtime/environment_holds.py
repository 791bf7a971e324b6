"""Which environments a process's sandboxes use, recorded where every process sharing the
install cache sees it: ``holds/<key>.<pid>.<started>-<n>``, whose mtime is the time it holds
until (``started``: the process's start time in clock ticks since boot, 0 where unknown).
Eviction (:mod:`.environment_evict`) never takes a key held by a live process."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

#: How long a hold of a linked environment lasts unless its process writes it again.
HOLD_S = 86400.0
#: How long an environment just built or looked up is held for the sandbox it is for.
BRIEF_HOLD_S = 120.0
#: How many times (LINK_POLL_S apart) a link looks for an environment an eviction moved aside.
LINK_CHECKS = 20
LINK_POLL_S = 0.05


class Holds:
    """One store's holds: leases (:meth:`hold`), brief holds of environments about to be
    linked, and what its live sandboxes link (``in_use``), written to ``directory``."""

    def __init__(self, directory: Path, in_use: Callable[[], Collection[str]]) -> None:
        self.directory = directory
        self._in_use = in_use
        self._leases: dict[str, int] = {}
        self._brief: dict[str, float] = {}  # key -> held until
        # The process's start time beside its pid: a pid reused by another process (a
        # restarted container's pid 1) does not keep a dead process's holds alive.
        pid = os.getpid()
        self._tag = f"{pid}.{process_started(pid) or 0}-{secrets.randbelow(10**9)}"
        self._lock = threading.Lock()

    def mine(self) -> set[str]:
        """Keys this store holds, leases and live sandboxes' links (brief holds are in the
        files only: eviction reads them there)."""
        return {*self._leases, *self._in_use()}

    def hold(self, key: str) -> None:
        self._leases[key] = self._leases.get(key, 0) + 1
        self.write()

    def release(self, key: str) -> None:
        if self._leases.get(key, 0) > 1:
            self._leases[key] -= 1
        else:
            self._leases.pop(key, None)
        self.write()

    def hold_briefly(self, key: str, envs: Path | None = None) -> bool:
        """Hold ``key`` for a sandbox about to link it; whether it is still published in
        ``envs`` (not evicted since it was looked up; True without ``envs``)."""
        self._brief[key] = time.time() + BRIEF_HOLD_S
        self.write()
        return envs is None or (envs / key / "manifest.json").is_file()

    def unhold(self, key: str) -> None:
        self._brief.pop(key, None)
        self.write()

    def hold_linked(self, key: str, envs: Path) -> bool:
        """Hold ``key`` as linked into a sandbox, then confirm it is still published in
        ``envs``: once this returns True no eviction, in any process, takes it while the
        hold lasts; False means it was evicted before the hold (link nothing). Blocking."""
        self.write([key])
        # An eviction that moved it aside just before the hold puts it back when it sees it.
        for _ in range(LINK_CHECKS):
            if (envs / key / "manifest.json").is_file():
                return True
            time.sleep(LINK_POLL_S)
        return False

    def write(self, linked: Collection[str] = ()) -> None:
        """Make this store's hold files what it holds now; ``linked`` keys were just linked
        (their brief hold becomes a link's)."""
        now = time.time()
        with self._lock:
            for key in linked:
                self._brief.pop(key, None)
            self._brief = {k: until for k, until in self._brief.items() if until > now}
            wanted = {key: now + HOLD_S for key in {*self.mine(), *linked}}
            for key, until in self._brief.items():
                wanted.setdefault(key, until)
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.directory):
                    key, _, tag = entry.name.partition(".")
                    if tag == self._tag and key not in wanted:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
            for key, until in wanted.items():
                path = self.directory / f"{key}.{self._tag}"
                with contextlib.suppress(OSError):
                    path.touch()
                    os.utime(path, (until, until))


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``), or None
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


def hold_alive(pid: int, started: str) -> bool:
    """Whether the process of a hold is alive: ``pid`` runs and, where both are known, it is
    the process that started at ``started`` (not another that got the pid later)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # another user's process: alive
    now = process_started(pid)
    return now is None or not started.isdigit() or int(started) in (0, now)

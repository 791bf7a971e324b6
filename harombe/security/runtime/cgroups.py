"""A running container's CPU quota, set through its host cgroup.

Docker applies ``--cpus`` when a container is created, so a sandbox would boot (its supervisor
and session interpreter starting, before any user code) under the quota meant for user code;
under gVisor's ptrace platform that boot is CPU-bound and a 0.5-core quota stretches it by
about a third. ``runsc`` has no ``update`` command, so ``docker update`` cannot set the quota
later; writing the container's own cgroup can. The sandbox manager does that once the sandbox
is ready and before any code runs in it, and falls back to Docker's create-time quota where
the cgroup cannot be written.

Pure parsing here is unit-tested; the functions that touch files are small, and
:class:`CpuQuota` runs them off the event loop. This is the only module that writes cgroups.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from harombe.errors import LimitNotAppliedError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def cpu_cgroup(proc_cgroup: str) -> tuple[int, str]:
    """(cgroup version, path) of the CPU controller in a ``/proc/<pid>/cgroup`` text."""
    unified = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpu" in controllers.split(","):
            return 1, path
        if hierarchy == "0" and controllers == "":
            unified = path
    if unified is not None:
        return 2, unified
    raise ValueError("no cpu controller in this cgroup listing")


def quota_files(version: int, path: str, root: Path = CGROUP_ROOT) -> list[tuple[Path, str]]:
    """The files to write, in order, and what to write, for a quota of ``cpu_cores`` later."""
    relative = path.lstrip("/")
    if version == 2:
        return [(root / relative / "cpu.max", "{quota} {period}")]
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / mount
        if base.is_dir():
            return [
                (base / relative / "cpu.cfs_period_us", "{period}"),
                (base / relative / "cpu.cfs_quota_us", "{quota}"),
            ]
    raise FileNotFoundError(f"no cgroup v1 cpu hierarchy under {root}")


def cgroup_of(pid: int) -> tuple[int, str]:
    """(version, path) of host process ``pid``'s CPU cgroup."""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        return cpu_cgroup(f.read())


def set_cpu_quota(version: int, path: str, cpu_cores: float) -> None:
    """Limit cgroup ``path`` to ``cpu_cores`` CPUs (raises OSError if it cannot)."""
    values = {"quota": max(1000, int(cpu_cores * PERIOD_US)), "period": PERIOD_US}
    files = quota_files(version, path)
    if not files[-1][0].exists():
        raise FileNotFoundError(f"no cgroup at {files[-1][0].parent}")
    for file, template in files:
        with open(file, "w", encoding="ascii") as out:
            out.write(template.format(**values))


def read_cpu_quota(pid: int) -> float | None:
    """The CPU limit of ``pid``'s cgroup in cores, or None when it has none."""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        version, path = cpu_cgroup(f.read())
    files = [file for file, _ in quota_files(version, path)]
    if version == 2:
        quota, period = files[0].read_text(encoding="ascii").split()
        return None if quota == "max" else int(quota) / int(period)
    period_us = int(files[0].read_text(encoding="ascii"))
    quota_us = int(files[1].read_text(encoding="ascii"))
    return None if quota_us < 0 else quota_us / period_us


def read_cpu_usage_s(pid: int) -> float:
    """CPU seconds used so far by ``pid``'s cgroup (all of a sandbox: sentry and guest)."""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        text = f.read()
    version, path = cpu_cgroup(text)
    relative = path.lstrip("/")
    if version == 2:
        stat = (CGROUP_ROOT / relative / "cpu.stat").read_text(encoding="ascii")
        fields = dict(line.split() for line in stat.splitlines() if line.strip())
        return int(fields["usage_usec"]) / 1e6
    for mount in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
        usage = CGROUP_ROOT / mount / relative / "cpuacct.usage"
        if usage.exists():
            return int(usage.read_text(encoding="ascii")) / 1e9
    raise FileNotFoundError(f"no cpuacct.usage for cgroup {path}")


class _States(Protocol):
    async def container_state(self, container_id: str) -> dict[str, object]: ...


class CpuQuota:
    """Sets and reads the CPU quota of running containers through their host cgroups.

    The cgroup path of the first container is found through its process; later ones reuse its
    pattern (the container id in it swapped), which saves an inspect call on every cold start,
    and fall back to the process when that path does not exist."""

    def __init__(self, docker: _States) -> None:
        self._docker = docker
        self._template: tuple[int, str] | None = None

    async def _pid(self, container_id: str) -> int:
        return int(str((await self._docker.container_state(container_id)).get("Pid") or 0))

    async def apply(self, container_id: str, *, cpu_cores: float) -> None:
        """Limit the running container to ``cpu_cores``; :class:`LimitNotAppliedError` if its
        cgroup cannot be written (the caller falls back to Docker's create-time quota)."""
        try:
            if self._template is not None:
                version, pattern = self._template
                try:
                    path = pattern.replace("{id}", container_id)
                    await asyncio.to_thread(set_cpu_quota, version, path, cpu_cores)
                    return
                except OSError:
                    pass  # another cgroup layout for this one: ask its process
            pid = await self._pid(container_id)
            version, path = await asyncio.to_thread(cgroup_of, pid)
            await asyncio.to_thread(set_cpu_quota, version, path, cpu_cores)
            if container_id in path:
                self._template = (version, path.replace(container_id, "{id}"))
        except (OSError, ValueError) as exc:
            raise LimitNotAppliedError(
                f"could not set the CPU quota of container {container_id[:12]} through its "
                f"cgroup ({exc}); run harombe as root on the Docker host, or it falls back to "
                "Docker's create-time quota"
            ) from exc

    async def limit(self, container_id: str) -> float | None:
        """The CPU limit of a running container in cores (None: unlimited)."""
        return await asyncio.to_thread(read_cpu_quota, await self._pid(container_id))

    async def usage_s(self, container_id: str) -> float:
        """CPU seconds a running container has used (sentry included)."""
        return await asyncio.to_thread(read_cpu_usage_s, await self._pid(container_id))


__all__ = [
    "CpuQuota",
    "cgroup_of",
    "cpu_cgroup",
    "quota_files",
    "read_cpu_quota",
    "read_cpu_usage_s",
    "set_cpu_quota",
]

"""A running container's CPU quota, set through its host cgroup.

Docker applies ``--cpus`` when a container is created, so a sandbox would boot (its supervisor
and session interpreter starting, before any user code) under the quota meant for user code;
under gVisor's ptrace platform that boot is CPU-bound and a 0.5-core quota stretches it by
about a third. ``runsc`` has no ``update`` command, so ``docker update`` cannot set the quota
later; writing the container's own cgroup can. The sandbox manager does that once the sandbox
is ready and before any code runs in it, and falls back to Docker's create-time quota where
the cgroup cannot be written.

Pure parsing here is unit-tested; the two functions that touch files are small.
"""

from __future__ import annotations

from pathlib import Path

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


__all__ = [
    "cgroup_of",
    "cpu_cgroup",
    "quota_files",
    "read_cpu_quota",
    "read_cpu_usage_s",
    "set_cpu_quota",
]

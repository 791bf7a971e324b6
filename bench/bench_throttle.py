"""Where the slow tail of back-to-back calls comes from: the sandbox's CPU quota.

    python bench/bench_throttle.py [--calls 150]

Runs ``print(1)`` on one sandbox, back to back and with a 20 ms pause between calls, under
``max_cpu_cores`` 0.5 (the default) and 1.0, and prints each run's p50 / p95 with the CFS
periods of the sandbox's host cgroup (cgroup v1 ``cpu.stat``) that ran out of quota.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import logging
import time

import structlog

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct


def cpu_stat(container_id: str) -> dict[str, int]:
    paths = glob.glob(f"/sys/fs/cgroup/cpu/docker/{container_id}/cpu.stat")
    if not paths:
        raise SystemExit("no cgroup v1 cpu.stat for the sandbox: this bench reads cgroup v1")
    with open(paths[0]) as f:
        return {key: int(value) for key, value in (line.split() for line in f)}


async def measure(docker: DockerManager, cpu_cores: float, pause_s: float, calls: int) -> str:
    manager = SandboxManager(docker_manager=docker, runtime="runsc", max_cpu_cores=cpu_cores)
    await manager.start()
    try:
        tools = CodeExecutionTools(sandbox_manager=manager, hitl_gate=None)
        made = await tools.code_execute(language="python", code="pass")
        sid = made["sandbox_id"]
        container_id = manager.get(sid).container_id
        before, samples = cpu_stat(container_id), []
        for _ in range(calls):
            started = time.perf_counter()
            result = await tools.code_execute(language="python", code="print(1)", sandbox_id=sid)
            samples.append(time.perf_counter() - started)
            assert result["stdout"] == "1\n", result
            await asyncio.sleep(pause_s)
        after = cpu_stat(container_id)
        periods = after["nr_periods"] - before["nr_periods"]
        throttled = after["nr_throttled"] - before["nr_throttled"]
        return (
            f"max_cpu_cores {cpu_cores:<4} pause {pause_s * 1000:4.0f} ms   "
            f"p50 {pct(samples, 0.5) * 1000:6.1f} ms   p95 {pct(samples, 0.95) * 1000:6.1f} ms   "
            f"throttled {throttled} of {periods} periods"
        )
    finally:
        await manager.stop()


async def main(calls: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker = DockerManager()
    await docker.start()
    try:
        for cpu_cores, pause_s in ((0.5, 0.0), (0.5, 0.02), (1.0, 0.0)):
            print(await measure(docker, cpu_cores, pause_s, calls), flush=True)
    finally:
        await docker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    asyncio.run(main(parser.parse_args().calls))

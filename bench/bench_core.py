"""Core timings on this machine, each next to its raw-Docker baseline measured in the same run.

    python bench/bench_core.py [--runs N]

Prints p50 / p95 of: sandbox cold create (harombe) vs ``docker run --runtime=runsc`` of the same
image; ``code_execute('print(1)')`` on an existing sandbox vs ``docker exec <same container>
python3 -c 'print(1)'``; and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import time

import structlog

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, samples: list[float]) -> str:
    return f"{name:<48} p50 {pct(samples, .5) * 1000:8.1f} ms   p95 {pct(samples, .95) * 1000:8.1f} ms"


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager)
    await manager.start()
    image = manager.sandbox_config.image_for("python")
    create, raw_run, execute, raw_exec = [], [], [], []
    try:
        for _ in range(runs):
            t = time.perf_counter()
            box = await manager.create_sandbox("python")
            create.append(time.perf_counter() - t)
            await manager.destroy_sandbox(box.sandbox_id)
            t = time.perf_counter()
            subprocess.run(["docker", "run", "--rm", "--runtime=runsc", "--network=none", image,
                            "true"], check=True, capture_output=True)
            raw_run.append(time.perf_counter() - t)
        box = await manager.create_sandbox("python")
        for _ in range(runs * 3):
            t = time.perf_counter()
            result = await manager.execute(box.sandbox_id, "print(1)")
            execute.append(time.perf_counter() - t)
            assert result.stdout == "1\n", result
            t = time.perf_counter()
            subprocess.run(["docker", "exec", box.container_id, "python3", "-c", "print(1)"],
                           check=True, capture_output=True)
            raw_exec.append(time.perf_counter() - t)
    finally:
        await manager.stop()
        await docker_manager.stop()
    print(row("sandbox cold create (harombe)", create))
    print(row("docker run --runtime=runsc (raw, cold)", raw_run))
    print(row("code_execute print(1), existing sandbox", execute))
    print(row("docker exec python3 -c print(1) (raw)", raw_exec))
    print(f"ratio create / raw run  (p50): {statistics.median(create) / statistics.median(raw_run):.2f}x")
    print(f"speed-up exec vs docker exec (p50): "
          f"{statistics.median(raw_exec) / statistics.median(execute):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))

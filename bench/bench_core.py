"""Core timings on this machine, each next to its raw-Docker baseline measured in the same run.

    python bench/bench_core.py [--runs N]

Prints p50 / p95 of: sandbox cold create with the warm pool off (harombe: create, attach,
start, supervisor ready) vs ``docker run --runtime=runsc`` of the same image running ``true``,
and file operations through the supervisor. Execution speed is ``bench_speed.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import time

import structlog
from bench_density import config as pool_off_config  # bench/ is the script's directory

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, samples: list[float]) -> str:
    p50, p95 = pct(samples, 0.5) * 1000, pct(samples, 0.95) * 1000
    return f"{name:<48} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms"


async def timed(*argv: str) -> float:
    """Wall time of one command, run without blocking the event loop."""
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv} failed")
    return time.perf_counter() - t


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    # Pool off: this measures a cold start (bench_speed.py measures the pool).
    manager = SandboxManager(docker_manager, config=pool_off_config())
    await manager.start()
    image = manager.sandbox_config.image_for("python")
    create, raw_run, files = [], [], []
    try:
        for _ in range(runs):
            t = time.perf_counter()
            box = await manager.create_sandbox("python")
            create.append(time.perf_counter() - t)
            await manager.destroy_sandbox(box.sandbox_id)
            raw_run.append(
                await timed(
                    "docker", "run", "--rm", "--runtime=runsc", "--network=none", image, "true"
                )
            )
        box = await manager.create_sandbox("python")
        for _ in range(runs * 3):
            t = time.perf_counter()
            await manager.write_file(box.sandbox_id, "f.txt", "x" * 1024)
            await manager.read_file(box.sandbox_id, "f.txt")
            files.append((time.perf_counter() - t) / 2)
    finally:
        await manager.stop()
        await docker_manager.stop()
    print(row("sandbox cold create (harombe)", create))
    print(row("docker run --runtime=runsc (raw, cold)", raw_run))
    print(row("file write or read (1 KiB), per operation", files))
    create_ratio = statistics.median(create) / statistics.median(raw_run)
    print(f"ratio create / raw run  (p50): {create_ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))

"""How many idle sandboxes fit on this machine, and what each costs in memory.

    python bench/bench_density.py [--count N] [--concurrency C]

Creates N Python sandboxes (warm pool off; each has its supervisor and its session interpreter
running), checks that every one still answers a call, and prints the host memory they take in
all and per sandbox (from /proc/meminfo's MemAvailable before and after), then removes them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import structlog

from harombe.config import load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager


def available_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def config() -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"]["size"] = 0
    return parse_config(data)


async def main(count: int, concurrency: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager, config=config())
    await manager.start()
    before = available_mb()
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()

    async def one() -> str:
        async with gate:
            return (await manager.create_sandbox("python")).sandbox_id

    try:
        ids = await asyncio.gather(*(one() for _ in range(count)))
        created_s = time.perf_counter() - started
        await asyncio.sleep(5)  # let start-up work settle before measuring idle memory
        used = before - available_mb()
        answers = await asyncio.gather(
            *(manager.execute(sid, "print(6 * 7)") for sid in ids), return_exceptions=True
        )
        ok = sum(1 for a in answers if not isinstance(a, BaseException) and a.stdout == "42\n")
    finally:
        await manager.stop()
        await docker_manager.stop()
    print(f"idle sandboxes: {count} created in {created_s:.0f} s ({concurrency} at a time)")
    print(f"answering a call afterwards: {ok}/{count}")
    print(f"host memory used: {used:.0f} MB in all, {used / count:.1f} MB per sandbox")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.count, args.concurrency))

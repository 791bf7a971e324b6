"""A first install from a loopback index (``harombe.testing.wheel_index``), with the progress
it reports: total seconds, seconds until the first progress event, events seen.

    python bench/bench_install_progress.py [--runs N] [--wheels N] [--wheel-kb N] [--delay-s S]

Each run uses a fresh, empty install cache and a new sandbox; the index serves ``--wheels``
wheels of ``--wheel-kb`` KiB each (64 KiB, then ``--delay-s`` pause: a slow download). The
ratio printed is time-to-first-event over the whole install, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import statistics
import tempfile
import time
from typing import Any

import structlog

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing.wheel_index import WheelIndex, make_wheel
from harombe.tools.code_execution import CodeExecutionTools


async def one_run(docker: DockerManager, index: WheelIndex) -> tuple[float, float | None, int]:
    with tempfile.TemporaryDirectory() as cache:
        config = parse_config({"security": {"sandbox": {
            "pool": {"size": 0}, "install_cache": {"directory": cache},
        }}})  # fmt: skip
        manager = SandboxManager(docker_manager=docker, runtime="runsc", config=config)
        await manager.start()
        try:
            tools = CodeExecutionTools(manager)
            box = await manager.create_sandbox("python")
            events: list[float] = []
            started = time.perf_counter()
            kwargs: dict[str, Any] = {}
            if "on_progress" in inspect.signature(tools.code_install_package).parameters:
                kwargs["on_progress"] = lambda _event: events.append(time.perf_counter())
            result = await tools.code_install_package(box.sandbox_id, "benchroot==1.0", **kwargs)
            total = time.perf_counter() - started
            assert result["success"], result
            first = events[0] - started if events else None
            return total, first, len(events)
        finally:
            await manager.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wheels", type=int, default=4)
    parser.add_argument("--wheel-kb", type=int, default=1024)
    parser.add_argument("--delay-s", type=float, default=0.05)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    deps = [f"benchdep{i}" for i in range(args.wheels - 1)]
    with WheelIndex(chunk_delay_s=args.delay_s) as index, index.as_pip_config():
        index.publish(make_wheel("benchroot", "1.0", requires=deps, padding_bytes=1024))
        for name in deps:
            index.publish(make_wheel(name, "1.0", padding_bytes=args.wheel_kb << 10))
        docker = DockerManager()
        await docker.start()
        try:
            runs = [await one_run(docker, index) for _ in range(args.runs)]
        finally:
            await docker.stop()
    totals = [r[0] for r in runs]
    firsts = [r[1] for r in runs if r[1] is not None]
    print(f"first install, {args.wheels} wheels of {args.wheel_kb} KiB: "
          f"p50 {statistics.median(totals):.2f} s over {len(runs)} runs")  # fmt: skip
    if firsts:
        ratio = statistics.median(firsts) / statistics.median(totals)
        counts = [r[2] for r in runs]
        print(f"first progress event after p50 {statistics.median(firsts):.2f} s "
              f"({ratio:.2f} of the install); events per install: {counts}")  # fmt: skip
    else:
        print("no progress events (the tool takes no on_progress)")


if __name__ == "__main__":
    asyncio.run(main())

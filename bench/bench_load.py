"""Latency under load: many concurrent sessions, each creating a sandbox, running calls in it
and destroying it, for a bounded time; with the idle latency of the same calls measured first
in the same run.

    python bench/bench_load.py [--sessions 40] [--duration 60] [--calls 100] [--think-ms 0]

A session is what an agent does: ``code_execute`` without a sandbox id (a new sandbox), then
``--calls`` calls on it (``print(1)``-sized Python) with ``--think-ms`` between them, then
``code_destroy_sandbox``; then it starts over, until ``--duration`` seconds have passed.

Prints calls/s and errors, p50 / p95 / p99 of calls on an existing sandbox and of new-sandbox
calls, under load and idle, the event loop's lag (how late a 5 ms timer fires), and the
ratio of the loaded p99 to the idle p50 of a call on an existing sandbox (aim: <= 10).
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
from harombe.tools.code_execution import CodeExecutionTools

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct

CALL = "x = sum(range(100))\nprint(x)"
EXPECTED = "4950\n"


def config(pool_size: int, cpu_cores: float | None) -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"].update(size=pool_size, prewarm=["python"])
    if cpu_cores is not None:
        data["security"]["sandbox"]["limits"]["max_cpu_cores"] = cpu_cores
    return parse_config(data)


def line(name: str, samples: list[float]) -> str:
    if not samples:
        return f"{name:<44} (no samples)"
    p50, p95, p99 = (pct(samples, q) * 1000 for q in (0.5, 0.95, 0.99))
    return (
        f"{name:<44} n {len(samples):6d}   p50 {p50:8.1f} ms   p95 {p95:8.1f} ms   "
        f"p99 {p99:8.1f} ms"
    )


class LoopLag:
    """How late a 5 ms timer fires: the event loop's own contribution to every latency."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            self.samples.append(time.perf_counter() - t - 0.005)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def idle_baseline(tools: CodeExecutionTools, manager: SandboxManager, runs: int) -> Any:
    existing: list[float] = []
    new: list[float] = []
    first = await tools.code_execute(language="python", code=CALL)
    sid = first["sandbox_id"]
    await manager.wait_pool_settled()
    for _ in range(runs):
        t = time.perf_counter()
        result = await tools.code_execute(language="python", code=CALL, sandbox_id=sid)
        existing.append(time.perf_counter() - t)
        assert result["stdout"] == EXPECTED, result
    await tools.code_destroy_sandbox(sid)
    for _ in range(max(3, runs // 40)):
        await manager.wait_pool_settled()
        t = time.perf_counter()
        result = await tools.code_execute(language="python", code=CALL)
        new.append(time.perf_counter() - t)
        assert result["stdout"] == EXPECTED, result
        await tools.code_destroy_sandbox(result["sandbox_id"])
    await manager.wait_pool_settled()
    return existing, new


async def load(
    tools: CodeExecutionTools, *, sessions: int, duration_s: float, calls: int, think_s: float
) -> dict[str, Any]:
    existing: list[tuple[float, float]] = []  # (when it started, how long it took)
    new: list[float] = []
    errors: list[str] = []
    first_sandboxes: list[float] = []  # when each session's first sandbox was ready
    deadline = time.perf_counter() + duration_s

    def check(result: dict[str, Any]) -> bool:
        if result.get("stdout") != EXPECTED:
            errors.append(str(result.get("error") or result)[:200])
            return False
        return True

    async def session() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            result = await tools.code_execute(language="python", code=CALL)
            new.append(time.perf_counter() - t)
            if not check(result):
                continue
            if len(first_sandboxes) < sessions:
                first_sandboxes.append(time.perf_counter())
            sid = result["sandbox_id"]
            for _ in range(calls):
                if time.perf_counter() >= deadline:
                    break
                if think_s:
                    await asyncio.sleep(think_s)
                t = time.perf_counter()
                result = await tools.code_execute(language="python", code=CALL, sandbox_id=sid)
                existing.append((t, time.perf_counter() - t))
                if not check(result):
                    break
            await tools.code_destroy_sandbox(sid)

    started = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    elapsed = time.perf_counter() - started
    all_up = max(first_sandboxes, default=deadline)
    return {
        "existing": [took for _, took in existing],
        "steady": [took for when, took in existing if when > all_up],
        "all_up_s": all_up - started,
        "new": new,
        "errors": errors,
        "elapsed": elapsed,
    }


async def main(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager, config=config(args.pool, args.cpus))
    await manager.start()
    tools = CodeExecutionTools(manager, hitl_gate=None)
    lag = LoopLag()
    try:
        await manager.wait_pool_settled()
        idle_existing, idle_new = await idle_baseline(tools, manager, args.idle_runs)
        lag.start()
        loaded = await load(
            tools,
            sessions=args.sessions,
            duration_s=args.duration,
            calls=args.calls,
            think_s=args.think_ms / 1000,
        )
        lag.stop()
    finally:
        await manager.stop()
        await docker_manager.stop()
    total = len(loaded["existing"]) + len(loaded["new"])
    print(
        f"{args.sessions} sessions, {loaded['elapsed']:.0f} s, {args.calls} calls per sandbox, "
        f"think {args.think_ms:g} ms, max_cpu_cores {manager.limits.max_cpu_cores:g}, "
        f"pool {args.pool}"
    )
    print(f"calls/s {total / loaded['elapsed']:.0f}   errors {len(loaded['errors'])}")
    for error in sorted(set(loaded["errors"]))[:5]:
        print(f"  error: {error}")
    print(line("idle: call on an existing sandbox", idle_existing))
    print(line("idle: new sandbox (pool warm)", idle_new))
    print(line("load: call on an existing sandbox", loaded["existing"]))
    print(line("  of which after every session had one", loaded["steady"]))
    print(f"  (every session had its first sandbox after {loaded['all_up_s']:.1f} s)")
    print(line("load: new sandbox", loaded["new"]))
    print(line("load: event-loop lag (5 ms timer)", lag.samples))
    idle_p50 = pct(idle_existing, 0.5)
    ratio = pct(loaded["existing"], 0.99) / idle_p50 if loaded["existing"] else float("nan")
    print(f"p99 under load / idle p50, call on an existing sandbox: {ratio:.1f}x (aim <= 10x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--calls", type=int, default=100, help="calls per sandbox")
    parser.add_argument("--think-ms", type=float, default=0.0, help="pause between calls")
    parser.add_argument("--idle-runs", type=int, default=200)
    parser.add_argument("--pool", type=int, default=2, help="warm pool size")
    parser.add_argument("--cpus", type=float, default=None, help="max_cpu_cores per sandbox")
    asyncio.run(main(parser.parse_args()))

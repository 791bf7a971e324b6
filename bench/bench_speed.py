"""Speed targets of the session interpreter and the warm pool, with raw Docker baselines
measured in the same run.

    python bench/bench_speed.py [--runs N] [--seconds S]

Prints p50 / p95 of:
- ``code_execute('print(1)')`` on an existing sandbox vs ``docker exec <same container>
  python3 -c 'print(1)'`` (target: 50x faster);
- ``code_execute('print(1)')`` without a sandbox id, pool warm and pool empty, vs a cold
  ``docker run --runtime=runsc <same image> python3 -c 'print(1)'`` (targets: 30x faster; within
  1.1x). The raw container is removed after the clock stops, as harombe's sandboxes are;
- executions per second of ``print(1)`` across 8 concurrent sandboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import time
from typing import Any

import structlog

from harombe.config import load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct, row
except ImportError:  # pragma: no cover
    from bench.bench_core import pct, row


def config(pool_size: int, cpu_cores: float | None) -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"].update(size=pool_size, prewarm=["python"])
    if cpu_cores is not None:
        data["security"]["sandbox"]["limits"]["max_cpu_cores"] = cpu_cores
    return parse_config(data)


async def run_cmd(*argv: str) -> tuple[float, str]:
    """Wall time and stdout of one command, run without blocking the event loop."""
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed")
    return time.perf_counter() - t, out.decode().strip()


async def raw_cold_run(image: str, cpus: float | None = None) -> float:
    limit = [f"--cpus={cpus}"] if cpus else []
    elapsed, cid = await run_cmd(
        "docker", "create", "--runtime=runsc", "--network=none", *limit, image, "python3",
        "-c", "print(1)",
    )  # fmt: skip
    # create + start -a is what `docker run` does; timed together, removal is not.
    elapsed_start, out = await run_cmd("docker", "start", "-a", cid)
    assert out == "1", out
    await run_cmd("docker", "rm", "-f", cid)
    return elapsed + elapsed_start


async def throughput(tools: CodeExecutionTools, sandboxes: list[str], seconds: float) -> float:
    count = 0
    deadline = time.perf_counter() + seconds

    async def worker(sid: str) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            result = await tools.code_execute(language="python", code="print(1)", sandbox_id=sid)
            assert result["stdout"] == "1\n", result
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(sid) for sid in sandboxes))
    return count / (time.perf_counter() - started)


async def main(runs: int, seconds: float, cpu_cores: float | None) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    warm = SandboxManager(docker_manager, config=config(2, cpu_cores))
    cold = SandboxManager(docker_manager, config=config(0, cpu_cores))
    cores = cold.limits.max_cpu_cores
    await warm.start()
    await cold.start()
    image = warm.sandbox_config.image_for("python")
    tools, cold_tools = (
        CodeExecutionTools(warm, hitl_gate=None),
        CodeExecutionTools(cold, hitl_gate=None),
    )
    existing, docker_exec, new_warm, new_cold, raw_cold, raw_capped = [], [], [], [], [], []
    try:
        await warm.wait_pool_settled()
        sid = (await tools.code_execute(language="python", code="pass"))["sandbox_id"]
        box = warm.get(sid)
        await warm.wait_pool_settled()  # the refill this claim started would compete for CPU
        for _ in range(runs * 10):
            t = time.perf_counter()
            result = await tools.code_execute(language="python", code="print(1)", sandbox_id=sid)
            existing.append(time.perf_counter() - t)
            assert result["stdout"] == "1\n", result
        for _ in range(runs):
            elapsed, out = await run_cmd(
                "docker", "exec", box.container_id, "python3", "-c", "print(1)"
            )
            assert out == "1"
            docker_exec.append(elapsed)
        for _ in range(runs):
            await warm.wait_pool_settled()  # measured with a sandbox waiting, as in steady use
            t = time.perf_counter()
            result = await tools.code_execute(language="python", code="print(1)")
            new_warm.append(time.perf_counter() - t)
            assert result["stdout"] == "1\n", result
            await tools.code_destroy_sandbox(result["sandbox_id"])
            t = time.perf_counter()
            result = await cold_tools.code_execute(language="python", code="print(1)")
            new_cold.append(time.perf_counter() - t)
            assert result["stdout"] == "1\n", result
            await cold_tools.code_destroy_sandbox(result["sandbox_id"])
            raw_cold.append(await raw_cold_run(image))
            raw_capped.append(await raw_cold_run(image, cores))
        await warm.wait_pool_settled()
        sandboxes = [
            (await tools.code_execute(language="python", code="pass"))["sandbox_id"]
            for _ in range(8)
        ]
        await warm.wait_pool_settled()
        per_s = await throughput(tools, sandboxes, seconds)
    finally:
        await warm.stop()
        await cold.stop()
        await docker_manager.stop()
    print(row("code_execute print(1), existing sandbox", existing))
    print(row("docker exec python3 -c print(1) (raw)", docker_exec))
    print(row("code_execute print(1), new sandbox, pool warm", new_warm))
    print(row("code_execute print(1), new sandbox, pool empty", new_cold))
    print(row("docker run --runtime=runsc python3 (raw, cold)", raw_cold))
    print(row(f"the same with --cpus={cores:g} (harombe's CPU limit)", raw_capped))
    p50 = {name: pct(s, 0.5) for name, s in
           (("existing", existing), ("exec", docker_exec), ("warm", new_warm),
            ("cold", new_cold), ("raw", raw_cold))}  # fmt: skip
    print(f"existing sandbox: {p50['exec'] / p50['existing']:.1f}x faster than docker exec "
          "(target 50x)")  # fmt: skip
    print(f"new sandbox, pool warm: {p50['raw'] / p50['warm']:.1f}x faster than a cold docker "
          "run (target 30x)")  # fmt: skip
    print(f"new sandbox, pool empty: {p50['cold'] / p50['raw']:.2f}x a cold docker run "
          "(target <= 1.1x)")  # fmt: skip
    print(f"new sandbox, pool empty: {p50['cold'] / pct(raw_capped, 0.5):.2f}x a cold docker "
          f"run under the same --cpus={cores:g}")  # fmt: skip
    print(f"throughput, 8 concurrent sandboxes: {per_s:.0f} executions/s (aim 300/s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--cpus", type=float, default=None, help="max_cpu_cores for harombe (default: config)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.seconds, args.cpus))

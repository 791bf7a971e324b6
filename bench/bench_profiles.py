"""What a profile's preimports save: a data-science call on a pooled sandbox whose runtime
layer has already imported numpy, pandas and scipy, against a pooled sandbox without a
profile that imports pandas itself, measured in the same run.

    python bench/bench_profiles.py [--runs N]

Prints p50 / p95 of ``code_execute('import pandas; print(pandas.__name__)')`` without a
sandbox id (each call takes a new sandbox from its warm pool, which is refilled before the
next measurement, and the sandbox is destroyed after the clock stops):
- under ``profile="data-science"`` (pool keyed by the profile, layer up, pandas preimported);
- without a profile (plain pool: the call pays the pandas import);
and the ratio of their p50s.
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
    from bench_core import pct, row
except ImportError:  # pragma: no cover
    from bench.bench_core import pct, row

CODE = "import pandas; print(pandas.__name__)"


def config() -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"].update(size=1, prewarm=["python"])
    return parse_config(data)


async def measure(
    tools: CodeExecutionTools, manager: SandboxManager, runs: int, **call: Any
) -> list[float]:
    """Wall times of ``runs`` calls of CODE, each on a new sandbox from a full warm pool."""
    samples = []
    for _ in range(runs):
        await manager.wait_pool_settled()  # a sandbox waiting, and no refill competing
        t = time.perf_counter()
        result = await tools.code_execute(language="python", code=CODE, **call)
        samples.append(time.perf_counter() - t)
        assert result["stdout"] == "pandas\n", result
        await tools.code_destroy_sandbox(result["sandbox_id"])
    return samples


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager, config=config())
    await manager.start()
    tools = CodeExecutionTools(manager, hitl_gate=None)
    try:
        manager.prewarm("python", profile=tools.profiles.get("data-science"))
        await manager.wait_pool_settled()
        await measure(tools, manager, 1, profile="data-science")  # first claims: warm-up
        await measure(tools, manager, 1)
        preimported = await measure(tools, manager, runs, profile="data-science")
        plain = await measure(tools, manager, runs)
    finally:
        await manager.stop()
        await docker_manager.stop()
    print(row("data-science, pooled, pandas preimported", preimported))
    print(row("no profile, pooled, imports pandas itself", plain))
    ratio = pct(plain, 0.5) / pct(preimported, 0.5)
    print(f"preimported data-science call: {ratio:.1f}x faster than importing pandas in the call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.runs))

"""What MCP costs per call: ``code_execute`` of ``print(1)`` on an existing sandbox through
``harombe mcp`` (stdio, the MCP SDK's client) next to the same call made on the library.

    python bench/bench_mcp.py [--runs N]

Both sides run with the HITL gate off (an approval would be a person's time, not the
server's) and no warm pool. Prints p50 / p95 of each and the ratio of the p50s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

import structlog
from mcp import ClientSession, StdioServerParameters, stdio_client

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

ROOT = Path(__file__).resolve().parents[1]
ENV = {"HAROMBE__SECURITY__HITL__ENABLED": "false", "HAROMBE__SECURITY__SANDBOX__POOL__SIZE": "0"}
CALL = {"language": "python", "code": "print(1)"}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, samples: list[float]) -> str:
    p50, p95 = pct(samples, 0.5) * 1000, pct(samples, 0.95) * 1000
    return f"{name:<40} p50 {p50:8.2f} ms   p95 {p95:8.2f} ms"


async def library(runs: int) -> list[float]:
    docker_manager = DockerManager()
    await docker_manager.start()
    config = parse_config({"security": {"sandbox": {"pool": {"size": 0}}}})
    manager = SandboxManager(docker_manager=docker_manager, config=config)
    await manager.start()
    try:
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(**CALL))["sandbox_id"]
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            result = await tools.code_execute(**CALL, sandbox_id=sid)
            samples.append(time.perf_counter() - started)
            assert result["stdout"] == "1\n", result
        return samples
    finally:
        await manager.stop()
        await docker_manager.stop()


async def over_mcp(runs: int) -> list[float]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "harombe", "mcp"], env=ENV, cwd=str(ROOT)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        first = await session.call_tool("code_execute", CALL)
        sid = (first.structured_content or {})["sandbox_id"]
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            result = await session.call_tool("code_execute", {**CALL, "sandbox_id": sid})
            samples.append(time.perf_counter() - started)
            assert (result.structured_content or {}).get("stdout") == "1\n", result
        return samples


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    direct = await library(runs)
    mcp = await over_mcp(runs)
    print(row("library code_execute print(1)", direct))
    print(row("MCP stdio tools/call code_execute", mcp))
    ratio = pct(mcp, 0.5) / pct(direct, 0.5)
    extra_ms = (pct(mcp, 0.5) - pct(direct, 0.5)) * 1000
    print(f"ratio of p50s (MCP / library): {ratio:.2f}  (+{extra_ms:.2f} ms per call)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))

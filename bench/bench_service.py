"""Latency of the HTTP service against direct library calls, measured in the same run.

    python bench/bench_service.py [--runs N]

Prints p50 / p95 of:
- fips ``POST /execute {"code": "print(1)"}`` (a fresh gVisor sandbox from the minimal
  profile's warm pool per request, removed afterwards) vs the same call made directly:
  ``tools.code_execute(language="python", code="print(1)", profile="minimal")`` (target: p50
  ≤ 15 ms on this machine);
- ``POST /v1/sandboxes/{id}/execute`` on an existing sandbox vs ``code_execute`` with its
  ``sandbox_id``.

Each pool claim is measured with the pool refilled first (the refill of the previous claim is
waited for, outside the clock): the figure is a claim, not a cold start. The service and its
client share one event loop in this process, as a sidecar and its agent share a pod.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import structlog

from harombe.config import load_config, merge, parse_config
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing.http import serving

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct, row
except ImportError:  # pragma: no cover
    from bench.bench_core import pct, row


async def sample(
    runs: int, call: Callable[[], Awaitable[Any]], settle: Callable[[], Awaitable[None]]
) -> list[float]:
    times = []
    for _ in range(runs):
        await settle()
        t = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t)
    return times


async def main(runs: int) -> None:
    quiet = {"security": {"sandbox": {"pool": {"size": 2}}, "hitl": {"enabled": False}}}
    data = merge(load_config(environ={}).model_dump(), quiet)
    service = Service(parse_config(data), environ={})
    async with (
        serving(create_app(service=service)) as base,
        httpx.AsyncClient(base_url=base, timeout=60) as http,
    ):
        manager, tools = service.manager, service.tools

        async def settle() -> None:
            await manager.wait_pool_settled()
            await asyncio.gather(*service._removals)

        async def fips() -> None:
            answer = (await http.post("/execute", json={"code": "print(1)"})).json()
            assert answer["stdout"] == "1\n", answer

        async def direct() -> None:
            result = await tools.code_execute(language="python", code="print(1)",
                                              profile="minimal")  # fmt: skip
            assert result["stdout"] == "1\n", result
            service.remove_later(result["sandbox_id"])

        await sample(3, fips, settle)  # warm-up: the pool's first fill, imports, connections
        http_s = await sample(runs, fips, settle)
        lib_s = await sample(runs, direct, settle)
        sid = (await http.post("/v1/sandboxes", json={})).json()["sandbox_id"]

        async def v1_existing() -> None:
            body = await http.post(f"/v1/sandboxes/{sid}/execute", json={"code": "print(1)"})
            assert body.json()["stdout"] == "1\n"

        async def lib_existing() -> None:
            result = await tools.code_execute(language="python", code="print(1)", sandbox_id=sid)
            assert result["stdout"] == "1\n"

        async def nothing() -> None:
            return None

        v1_s = await sample(runs, v1_existing, nothing)
        lib_existing_s = await sample(runs, lib_existing, nothing)
    print(row("POST /execute print(1) (fresh pooled sandbox)", http_s))
    print(row("library code_execute, profile=minimal (same)", lib_s))
    print(
        f"  ratio HTTP / library p50: {pct(http_s, 0.5) / pct(lib_s, 0.5):.2f}x"
        f"   target p50 <= 15 ms: {'met' if pct(http_s, 0.5) <= 0.015 else 'missed'}"
    )
    print(row("POST /v1/sandboxes/{id}/execute (existing)", v1_s))
    print(row("library code_execute(sandbox_id=...) (existing)", lib_existing_s))
    print(f"  ratio HTTP / library p50: {pct(v1_s, 0.5) / pct(lib_existing_s, 0.5):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main(args.runs))

"""The README's ``harombe serve`` + ``curl …/execute -d '{"code": "print(6*7)"}'``, with no
config: the wall time of the answer, against the same server with the gate off.

    python bench/bench_serve_first_call.py [--runs N]

Starts ``python -m harombe serve`` twice as a process with no config of the caller's (once as
is, once with ``HAROMBE__SECURITY__HITL__ENABLED=false``), waits until it answers, then times
the first ``POST /execute`` (sent as soon as ``/healthz`` answers, the pool maybe still
filling) and ``N`` more once the warm pool is full (as when a person types the README's curl
after the start). Prints the first call, p50 / p95 of the others, and the ratio of
the gated server's p50 to the ungated one's (the default policy runs HIGH calls at once, so it
should be about 1).

On this machine (2 cores shared with other work, so the ratio is noise-bound): the first call,
sent the moment ``/healthz`` answers, 0.8–1.35 s; once the pool is warm, p50 17–36 ms with the
default policy against 27–68 ms with the gate off (ratios 0.24–2.2 across runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import httpx

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct

ROOT = Path(__file__).resolve().parents[1]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE_")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def warm(http: httpx.AsyncClient, *, pool_size: int = 2) -> None:
    """Return once the service holds its warm pool (polled: it has no event to wait on)."""
    for _ in range(600):
        if (await http.get("/v1/health")).json()["sandboxes"] >= pool_size:
            return
        await asyncio.sleep(0.1)


async def measure(runs: int, env: dict[str, str]) -> list[float]:
    """Seconds of each ``POST /execute`` (the first one first) against a fresh server."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harombe", "serve", "--port", str(port),
        env={**env, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    times = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=90) as http:
            while True:
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            for attempt in range(runs + 1):
                if attempt == 1:  # a person types curl after the start: the pool is warm
                    await warm(http)
                started = time.perf_counter()
                answer = await http.post("/execute", json={"code": "print(6*7)"})
                times.append(time.perf_counter() - started)
                assert answer.json()["stdout"] == "42\n", answer.text
                await asyncio.sleep(1.0)  # the pool refills: the next call is a claim
    finally:
        process.terminate()
        await process.wait()
    return times


async def main(runs: int) -> None:
    gated = await measure(runs, CLEAN)
    ungated = await measure(runs, {**CLEAN, "HAROMBE__SECURITY__HITL__ENABLED": "false"})
    for name, times in (("default policy", gated), ("gate off", ungated)):
        rest = times[1:]
        print(f"{name:>15}: first {times[0] * 1000:7.1f} ms   p50 {pct(rest, 0.5) * 1000:7.1f} ms"
              f"   p95 {pct(rest, 0.95) * 1000:7.1f} ms")  # fmt: skip
    print(f"p50 ratio default/off: {pct(gated[1:], 0.5) / pct(ungated[1:], 0.5):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))

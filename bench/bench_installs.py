"""Package installs with and without the install cache, and claims from an environment's
pool, measured in the same run.

    python bench/bench_installs.py [--runs N] [--skip-pandas]

1. An uncached small install (``six``, a fresh, empty cache every time) into a new sandbox,
   against the same install through the sandbox's own pip (cache off).
2. ``pandas`` into a new sandbox: once cold (empty cache), then p50 of repeats, each in a new
   sandbox (the cached path).
3. A sandbox of a named environment (pandas, numpy, matplotlib; pandas preimported) claimed
   from its pool, against a plain sandbox started cold (pool off).

Every install is followed by an import of the package in the session, which must succeed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager


def config(*, cache: bool, directory: str | None = None, pool_size: int = 1) -> Any:
    return parse_config({"security": {"sandbox": {
        "pool": {"size": pool_size},
        "install_cache": {"enabled": cache, **({"directory": directory} if directory else {})},
    }}})  # fmt: skip


async def started(docker: DockerManager, cfg: Any) -> SandboxManager:
    manager = SandboxManager(docker_manager=docker, runtime="runsc", config=cfg)
    await manager.start()
    return manager


async def install_once(manager: SandboxManager, package: str, module: str) -> float:
    """Seconds for ``install_package`` in a new sandbox (already started); checks the import."""
    box = await manager.create_sandbox("python")
    await manager.execute(box.sandbox_id, "1")
    began = time.perf_counter()
    result = await manager.install_package(box.sandbox_id, package)
    elapsed = time.perf_counter() - began
    used = await manager.execute(box.sandbox_id, f"import {module}", timeout_s=120)
    assert result.success and used.success, (result, used)
    await manager.destroy_sandbox(box.sandbox_id)
    await manager.wait_pool_settled()
    return elapsed


async def p50(runs: int, measure: Callable[[], Awaitable[float]]) -> float:
    return statistics.median([await measure() for _ in range(runs)])


async def small_install(docker: DockerManager, runs: int) -> None:
    async def cached_cold() -> float:
        manager = await started(docker, config(cache=True, directory=tempfile.mkdtemp()))
        try:
            return await install_once(manager, "six", "six")
        finally:
            await manager.stop()

    pip_manager = await started(docker, config(cache=False))
    try:
        pip_s = await p50(runs, lambda: install_once(pip_manager, "six", "six"))
    finally:
        await pip_manager.stop()
    cold_s = await p50(runs, cached_cold)
    print(f"six, uncached, new sandbox:  install cache {cold_s:6.3f} s   sandbox pip "
          f"{pip_s:6.3f} s   ({pip_s / cold_s:.1f}x faster)")  # fmt: skip


async def pandas_install(docker: DockerManager, runs: int) -> None:
    manager = await started(docker, config(cache=True, directory=tempfile.mkdtemp()))
    try:
        cold_s = await install_once(manager, "pandas", "pandas")
        cached_s = await p50(runs, lambda: install_once(manager, "pandas", "pandas"))
    finally:
        await manager.stop()
    print(f"pandas, new sandbox:         cold {cold_s:6.3f} s   cached p50 {cached_s:6.3f} s   "
          f"({cold_s / cached_s:.0f}x faster)")  # fmt: skip


async def environment_claims(docker: DockerManager, runs: int) -> None:
    directory = tempfile.mkdtemp()
    manager = await started(docker, config(cache=True, directory=directory))
    cold_manager = await started(docker, config(cache=True, directory=directory, pool_size=0))
    try:
        manager.define_environment("data", ["pandas", "numpy", "matplotlib"],
                                   preimport=["pandas"], pool_size=1)  # fmt: skip
        began = time.perf_counter()
        await manager.prepare_environment("data")
        build_s = time.perf_counter() - began
        claims, colds = [], []
        for _ in range(runs):
            await manager.wait_pool_settled()
            began = time.perf_counter()
            box = await manager.create_sandbox("python", environment="data")
            claims.append(time.perf_counter() - began)
            done = await manager.execute(box.sandbox_id, "import sys\n'pandas' in sys.modules")
            assert done.result == "True", done
            await manager.destroy_sandbox(box.sandbox_id)
            began = time.perf_counter()
            plain = await cold_manager.create_sandbox("python")
            colds.append(time.perf_counter() - began)
            await cold_manager.destroy_sandbox(plain.sandbox_id)
        claim_ms, cold_ms = statistics.median(claims) * 1000, statistics.median(colds) * 1000
        print(f"environment (pandas+numpy+matplotlib, built in {build_s:.1f} s): pool claim p50 "
              f"{claim_ms:6.1f} ms   cold plain sandbox {cold_ms:6.1f} ms   "
              f"({cold_ms / claim_ms:.0f}x faster)")  # fmt: skip
    finally:
        await manager.stop()
        await cold_manager.stop()


async def main(runs: int, skip_pandas: bool) -> None:
    docker = DockerManager()
    await docker.start()
    try:
        await small_install(docker, runs)
        if not skip_pandas:
            await pandas_install(docker, runs)
            await environment_claims(docker, max(runs, 5))
    finally:
        await docker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-pandas", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main(args.runs, args.skip_pandas))

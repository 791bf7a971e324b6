"""A one-shot process: the README's ``to_toml`` script against the work of its one sandbox.

    python bench/bench_oneshot.py [--runs N]

Each run alternates two measurements on the same machine state:

* **script**: the first Python block of the README's section "Dependencies in seconds, …",
  verbatim, run as a program of its own (``python -c``, no ``HAROMBE_*`` variables, bytecode
  cached as on a user's machine): wall time from starting the interpreter to its exit
  (import, Docker, the call, the exit's clean-up), and how many sandboxes it started
  (Docker's ``create`` events labelled with its pid).
* **one sandbox's work**: in this process, what the script's one sandbox does for its call,
  step by step on a manager with the warm pool off (started beforehand, untimed): a cold
  ``create_sandbox`` with the same dependency environment (its install-cache entry built, as
  the script finds it after the first run) and the same limits, cloudpickle written and
  imported, the pickled call written, run and its answer read, and ``destroy_sandbox`` until
  the container is gone. Printed beside it, as a reference: the bare sandbox (cold create with
  the dependency, the function's body run directly, removal).

Prints the p50 (and p95) of both, their ratio, and the sandboxes per script run. The first
script run (which fills the install cache) is a warm-up and not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import docker
import structlog

from harombe.config import load_config, parse_config
from harombe.decorator_call import CallSpec, decode
from harombe.decorator_wire import (
    CALL_PATH,
    LIBRARY_PATH,
    RESULT_PATH,
    WARMUP_CODE,
    dumps_call,
    library_zip,
    runner_code,
)
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Dependencies in seconds, `@sandbox` functions, and host directories"
DEPENDENCY = "toml==0.10.2"
BODY = "import toml\nprint(toml.dumps({'name': 'harombe'}), end='')\n"
SPEC = CallSpec(name="to_toml", source="", is_async=False)
# As a user runs it: no HAROMBE_* settings, and bytecode cached (the warm-up run writes it).
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith("HAROMBE") and k != "PYTHONDONTWRITEBYTECODE"}  # fmt: skip


def readme_script() -> str:
    text = (ROOT / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    script = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    if f'"{DEPENDENCY}"' not in script:
        raise SystemExit(f"the README's script no longer uses {DEPENDENCY}; update this bench")
    return script


def sandboxes_started(pid: int, since: float, until: float) -> int:
    """Containers created by harombe process ``pid`` between ``since`` and ``until``."""
    client = docker.from_env()
    try:
        events = client.events(
            since=int(since) - 1, until=int(until) + 1, decode=True,
            filters={"type": "container", "event": "create", "label": "harombe.managed=1"},
        )  # fmt: skip
        owners = [e["Actor"]["Attributes"].get("harombe.owner", "") for e in events]
    finally:
        client.close()
    return sum(owner.split(":")[1:2] == [str(pid)] for owner in owners)


def run_script(script: str) -> tuple[float, int]:
    """Wall time of the README script as a process of its own, and sandboxes it started."""
    since = time.time()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)  # fmt: skip
    out, err = proc.communicate(timeout=600)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or out != 'name = "harombe"\n':
        raise SystemExit(f"the README script failed ({proc.returncode}): {out!r} {err[-2000:]}")
    return wall, sandboxes_started(proc.pid, since, time.time())


def to_toml(data: dict[str, str]) -> str:
    """The README's function (what its call pickles)."""
    import toml  # type: ignore[import-untyped]

    return str(toml.dumps(data))


async def one_sandbox(docker_manager: DockerManager, *, bare: bool) -> float:
    """Cold boot of one sandbox with the dependency, the call in it, its removal; ``bare``:
    the function's body run directly instead of the pickled call."""
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"]["size"] = 0
    manager = SandboxManager(docker_manager, config=parse_config(data),
                             max_memory_mb=1024, max_cpu_cores=1)  # fmt: skip
    await manager.start()
    try:
        started = time.perf_counter()
        box = await manager.create_sandbox("python", environment=[DEPENDENCY])
        sid, cap = box.sandbox_id, manager.limits.max_file_bytes
        if bare:
            value = (await manager.execute(sid, BODY)).stdout
        else:
            await manager.write_file(sid, LIBRARY_PATH, library_zip())
            await manager.execute(sid, WARMUP_CODE)
            await manager.write_file(
                sid, CALL_PATH, dumps_call(to_toml, ({"name": "harombe"},), {})
            )
            await manager.execute(sid, runner_code(max_result_bytes=cap, is_async=False))
            value = decode(SPEC, await manager.read_file(sid, RESULT_PATH), cap)
        await manager.destroy_sandbox(sid)
        took = time.perf_counter() - started
    finally:
        await manager.stop()
    if value != 'name = "harombe"\n':
        raise SystemExit(f"the call in one sandbox gave {value!r}")
    return took


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    script = readme_script()
    await asyncio.to_thread(run_script, script)  # warm-up: the install cache gets the set
    docker_manager = DockerManager()
    await docker_manager.start()
    walls, works, bares, counts = [], [], [], []
    try:
        for _ in range(runs):
            wall, count = await asyncio.to_thread(run_script, script)
            walls.append(wall)
            counts.append(count)
            works.append(await one_sandbox(docker_manager, bare=False))
            bares.append(await one_sandbox(docker_manager, bare=True))
    finally:
        await docker_manager.stop()
    rows = (("README to_toml script, wall", walls), ("its one sandbox's work", works),
            ("  bare: boot, body, removal", bares))  # fmt: skip
    for name, samples in rows:
        p50, p95 = pct(samples, 0.5) * 1e3, pct(samples, 0.95) * 1e3
        print(f"{name:<32} ({runs} runs)  p50 {p50:8.1f} ms   p95 {p95:8.1f} ms")
    print(f"sandboxes started per script run: {sorted(counts)}")
    print(
        f"script wall / one sandbox's work, p50: {pct(walls, 0.5) / pct(works, 0.5):.2f}x "
        f"(/ bare: {pct(walls, 0.5) / pct(bares, 0.5):.2f}x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    asyncio.run(main(parser.parse_args().runs))

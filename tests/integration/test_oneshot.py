"""One-shot processes against real gVisor: a program that makes one ``@sandbox`` call (sync or
async) or one ``run_sandboxed`` starts exactly the one sandbox it uses and leaves nothing
behind; a program that makes more calls still gets each answer. Sandboxes are counted from
Docker's own ``create`` events, by the owner label that carries the program's pid."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker
import pytest

from harombe.security.docker_manager import DockerManager
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_OWNER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}

DECORATED_SYNC = """
from harombe import sandbox

@sandbox(dependencies=["toml==0.10.2"], memory_mb=1024, timeout_sec=30)
def to_toml(data: dict) -> str:
    import toml
    return toml.dumps(data)

print(to_toml({"name": "harombe"}), end="")
"""
DECORATED_ASYNC = """
import asyncio
from harombe import sandbox, sandbox_async

@sandbox()
async def add(a, b):
    await asyncio.sleep(0)
    return a + b

@sandbox_async()
def double(x):
    return 2 * x

async def main():
    print(await add(40, 2), end=" ")

asyncio.run(main())
"""
DECORATED_ASYNC_WRAPPER = """
import asyncio
from harombe import sandbox_async

@sandbox_async()
def double(x):
    return 2 * x

print(asyncio.run(double(21)), end=" ")
"""
RUN_SANDBOXED = """
import sys
from harombe import run_sandboxed

run_sandboxed(code="open('answer.txt', 'w').write(str(6 * 7))", mnt_dir=sys.argv[1])
"""
THREE_CALLS = """
from harombe import sandbox

@sandbox()
def square(x):
    return x * x

print([square(i) for i in (2, 3, 4)], end="")
"""


def created_by(pid: int, since: float, until: float) -> list[str]:
    """The harombe containers Docker created for process ``pid`` in that time."""
    client = docker.from_env()
    try:
        events = client.events(
            since=int(since) - 1, until=int(until) + 1, decode=True,
            filters={"type": "container", "event": "create", "label": f"{LABEL_MANAGED}=1"},
        )  # fmt: skip
        found = [(e["id"], e["Actor"]["Attributes"].get(LABEL_OWNER, "")) for e in events]
    finally:
        client.close()
    return [cid for cid, owner in found if owner.split(":")[1:2] == [str(pid)]]


async def left_by(docker_manager: DockerManager, pid: int) -> list[str]:
    """Containers still there whose owner label names process ``pid``."""
    found = await docker_manager.list_containers({LABEL_MANAGED: "1"})
    return [c.id for c in found if c.labels.get(LABEL_OWNER, "").split(":")[1:2] == [str(pid)]]


async def run_and_check(docker_manager: DockerManager, source: str, *args: str) -> tuple[str, int]:
    """Run ``source`` as a program of its own; check it succeeded and left no container; its
    output and how many sandboxes it started."""
    since = time.time()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", textwrap.dedent(source), *args, cwd=ROOT, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert await left_by(docker_manager, proc.pid) == []  # removed before the exit
    started = await asyncio.to_thread(created_by, proc.pid, since, time.time())
    return out.decode(), len(started)


@pytest.mark.parametrize(
    ("source", "output"),
    [
        pytest.param(DECORATED_SYNC, 'name = "harombe"\n', id="sync-with-dependency"),
        pytest.param(DECORATED_ASYNC, "42 ", id="async-def-and-an-uncalled-one"),
        pytest.param(DECORATED_ASYNC_WRAPPER, "42 ", id="sandbox-async"),
    ],
)
async def test_one_decorated_call_starts_one_sandbox(
    docker_manager: DockerManager, source: str, output: str
) -> None:
    """A program that makes one decorated call starts one sandbox and leaves none."""
    out, started = await run_and_check(docker_manager, source)
    assert out == output
    assert started == 1


async def test_one_run_sandboxed_starts_one_sandbox(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """A program that makes one run_sandboxed call starts one sandbox and leaves none; what
    the code wrote in /mnt is in the host directory."""
    _, started = await run_and_check(docker_manager, RUN_SANDBOXED, str(tmp_path))
    assert (tmp_path / "answer.txt").read_text() == "42"
    assert started == 1


async def test_later_calls_in_one_process_still_work(docker_manager: DockerManager) -> None:
    """A second and third call (which start the warm pools) get their answers; the pools'
    sandboxes are removed at exit too."""
    out, started = await run_and_check(docker_manager, THREE_CALLS)
    assert out == "[4, 9, 16]"
    assert started >= 3

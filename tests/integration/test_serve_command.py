"""``harombe serve`` as a process: SIGTERM removes every sandbox it made; after SIGKILL the next
start sweeps what was left."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import httpx

from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_OWNER, LABEL_SANDBOX


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start(port: int) -> asyncio.subprocess.Process:
    env = {**os.environ, "HAROMBE__SECURITY__HITL__ENABLED": "false",
           "HAROMBE__SECURITY__SANDBOX__POOL__SIZE": "1"}  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harombe", "serve", "--port", str(port), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        for _ in range(300):
            try:
                if (await http.get("/v1/health")).json()["status"] == "ok":
                    return process
            except httpx.TransportError:
                pass
            if process.returncode is not None:
                raise AssertionError(f"harombe serve exited {process.returncode}")
            await asyncio.sleep(0.1)
    raise AssertionError("harombe serve did not come up within 30 s")


async def make_sandbox(port: int) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        made = await http.post("/v1/sandboxes", json={})
    assert made.status_code == 201, made.text
    return str(made.json()["sandbox_id"])


async def containers_of(docker_manager: DockerManager, sandbox_id: str) -> int:
    return len(await docker_manager.list_containers({LABEL_SANDBOX: sandbox_id}))


async def test_sigterm_removes_every_sandbox(docker_manager: DockerManager) -> None:
    """SIGTERM: the process exits 0 after removing its sandboxes (made and pooled alike)."""
    port = free_port()
    process = await start(port)
    sandbox_id = await make_sandbox(port)
    assert await containers_of(docker_manager, sandbox_id) == 1
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 60) == 0
    assert await containers_of(docker_manager, sandbox_id) == 0
    prefix = f"{socket.gethostname()}:{process.pid}:"  # the pool's sandboxes too
    managed = await docker_manager.list_containers({LABEL_MANAGED: "1"})
    assert [c.id for c in managed if c.labels.get(LABEL_OWNER, "").startswith(prefix)] == []


async def test_after_sigkill_the_next_start_sweeps(docker_manager: DockerManager) -> None:
    """SIGKILL leaves the sandbox behind; the next harombe serve removes it as it starts."""
    port = free_port()
    killed = await start(port)
    sandbox_id = await make_sandbox(port)
    killed.kill()
    await killed.wait()
    assert await containers_of(docker_manager, sandbox_id) == 1
    process = await start(port)
    try:
        assert await containers_of(docker_manager, sandbox_id) == 0
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0

"""Adversarial probes of ``harombe serve``'s fips contract that need real gVisor: odd
timeouts, raw output bytes, and a sandbox that dies under its run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.security.runtime.docker import DockerManager
from harombe.service.state import Service
from tests.integration.service_support import client, live_service, service_config

pytestmark = pytest.mark.integration

#: No static scans and os/sys allowed, so a probe can write raw bytes or kill its sandbox.
LAB_PROFILE = """\
name: lab
description: no static scans, runtime layer observing (tests only)
extends: minimal
imports:
  additional: [os, sys]
scan_stages:
  pre: []
  post: []
audit:
  mode: {runtime: observe}
"""


@pytest.fixture(scope="module")
async def fips(
    docker_manager: DockerManager, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Service, str]]:
    profiles = tmp_path_factory.mktemp("profiles")
    (profiles / "lab.yaml").write_text(LAB_PROFILE)
    config = service_config({"security": {"profiles": {"directory": str(profiles)}},
                             "service": {"profile": "lab"}})  # fmt: skip
    async with live_service(docker_manager, config) as running:
        yield running


async def post(base_url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with client(base_url) as http:
        response = await http.post("/execute", json=body)
    return response.status_code, response.json()


@pytest.mark.parametrize("timeout_s", [1e-9, 0.001], ids=["nanosecond", "millisecond"])
async def test_a_tiny_timeout_is_a_timed_out_run(
    fips: tuple[Service, str], timeout_s: float
) -> None:
    """A valid but tiny timeout (0 < t) answers 200 timed out, as the sidecar does."""
    status, body = await post(fips[1], {"code": "while True:\n    pass", "timeout": timeout_s})
    assert status == 200, body
    assert body["timed_out"] is True and body["exit_code"] == -9
    assert body["stderr"] == f"Execution timed out after {timeout_s}s"


async def test_raw_output_bytes_are_cut_by_their_own_count(fips: tuple[Service, str]) -> None:
    """30000 raw bytes of stdout (not UTF-8) are under 50 KB, so they are not cut."""
    code = "import sys\nsys.stdout.buffer.write(b'\\xff' * 30000)"
    status, body = await post(fips[1], {"code": code})
    assert status == 200 and body["exit_code"] == 0, body
    assert "[output truncated at 50 KB]" not in body["stdout"]


async def test_a_sandbox_lost_under_its_run_says_why(fips: tuple[Service, str]) -> None:
    """A run whose container is removed from outside answers the killed exit code (-9) with
    the reason in stderr, never a silent -1 with empty output."""
    svc, base_url = fips
    call = asyncio.ensure_future(post(base_url, {"code": "import time\ntime.sleep(20)"}))
    for _ in range(200):
        running = [box for box in svc.manager.sandboxes.values() if box.runs]
        if running:
            break
        await asyncio.sleep(0.05)
    assert running, "the run never started"
    await asyncio.sleep(0.5)
    await svc.docker_manager.remove_container(running[0].container_id)
    status, body = await call
    assert status == 200, body
    assert body["exit_code"] == -9 and "lost" in body["stderr"], body

"""Adversarial probes of ``harombe mcp`` over stdio against real gVisor: user code that puts a
lone surrogate into its result, and SIGTERM while a call runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_OWNER
from tests.integration.test_mcp_stdio import _children, body, connected, run

pytestmark = pytest.mark.integration

#: Python that makes the image note of its result hold a lone surrogate: a fake ``PIL.Image``
#: whose rendering fails with one in its message.
SURROGATE_NOTE = """
import sys, types
fake = types.ModuleType("PIL.Image")
class Image:
    def save(self, target, format=None):
        raise ValueError("bad \\udcff name")
    def convert(self, mode):
        return self
fake.Image = Image
sys.modules["PIL.Image"] = fake
Image()
"""


async def test_a_lone_surrogate_from_user_code_does_not_end_the_server() -> None:
    """Code whose result carries a lone surrogate gets that result (escaped), and the server
    and its sandbox keep serving; the encoding failure used to end ``harombe mcp``."""
    async with connected(HAROMBE__SECURITY__HITL__ENABLED="false") as session:
        # Bounded: a server that died leaves the client waiting for ever.
        first = await asyncio.wait_for(run(session, SURROGATE_NOTE), 120)
        second = await run(session, "print(2)", sandbox_id=first["sandbox_id"])
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": first["sandbox_id"]})
    assert first["success"] is True
    assert any("\\udcff" in warning for warning in first["warnings"])
    assert second["stdout"] == "2\n"


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_sigterm_while_a_call_runs_leaves_no_container(
    docker_manager: DockerManager,
) -> None:
    """SIGTERM to ``harombe mcp`` while code is running in a sandbox it just made: the server
    ends and no container of it is left behind."""
    before = set(_children())
    printed = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        printed.set()

    with contextlib.suppress(Exception):
        async with connected(HAROMBE__SECURITY__HITL__ENABLED="false") as session:
            (server,) = set(_children()) - before
            code = "import time\nprint('go', flush=True)\ntime.sleep(60)"
            call = asyncio.ensure_future(session.call_tool(
                "code_execute", {"language": "python", "code": code},
                progress_callback=on_progress,
            ))  # fmt: skip
            await asyncio.wait_for(printed.wait(), 120)
            os.kill(server, signal.SIGTERM)
            with contextlib.suppress(Exception):
                body(await asyncio.wait_for(call, 120))
    for _ in range(1200):  # the server exits once its sandboxes are gone
        if not _running(server):
            break
        await asyncio.sleep(0.05)
    assert not _running(server)
    left = await docker_manager.list_containers({LABEL_MANAGED: "1"})
    mine = [c for c in left if f":{server}:" in c.labels.get(LABEL_OWNER, "")]
    assert printed.is_set() and mine == []

"""A real SandboxManager over FakeDocker, for the fast tests of everything above the Docker seam."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from harombe.config import HarombeConfig, parse_config
from harombe.security.runtime.sandbox import LABEL_POOLED, LABEL_SANDBOX
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import FakeDocker, RunOutcome, code_of, echo_handler


def config(**sandbox: Any) -> HarombeConfig:
    """A config whose ``security.sandbox`` has ``sandbox``'s keys; no warm pool and no install
    cache unless given (installs then take the sandbox-pip path the fake guest answers, and a
    patched ``packages.fetch_pypi`` is what they download with)."""
    defaults = {"pool": {"size": 0}, "install_cache": {"enabled": False}}
    return parse_config({"security": {"sandbox": {**defaults, **sandbox}}})


@asynccontextmanager
async def running(
    docker: FakeDocker | None = None, **sandbox: Any
) -> AsyncIterator[tuple[FakeDocker, SandboxManager]]:
    """A started FakeDocker and a started manager on it; the manager is stopped afterwards."""
    docker = docker or FakeDocker()
    await docker.start()
    manager = SandboxManager(docker, config=config(**sandbox))
    await manager.start()
    try:
        yield docker, manager
    finally:
        await manager.stop()


def container_of(docker: FakeDocker, sandbox_id: str) -> str | None:
    """The id of the fake container of ``sandbox_id``, None once it is gone."""
    found = docker.labelled({LABEL_SANDBOX: sandbox_id})
    return found[0].id if found else None


def started_sandboxes(docker: FakeDocker) -> dict[str, bool]:
    """From now on, each sandbox the fake Docker is asked to create: whether it was pooled
    (a container made again after a CPU-quota fallback counts once)."""
    started: dict[str, bool] = {}
    create = docker.create_container

    async def recording(**spec: Any) -> str:
        labels = spec.get("labels") or {}
        started[labels[LABEL_SANDBOX]] = labels.get(LABEL_POOLED) == "1"
        return await create(**spec)

    docker.create_container = recording  # type: ignore[method-assign]
    return started


class Hold:
    """A run handler that holds runs whose code contains ``hold`` until told, and signals
    when one is held; others get the default echo behaviour."""

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def until_held(self, call: asyncio.Future[Any]) -> None:
        """Wait until a run is held; fail (not hang) if ``call`` ends before that."""
        held = asyncio.ensure_future(self.held.wait())
        await asyncio.wait({held, call}, return_when=asyncio.FIRST_COMPLETED)
        if not held.done():
            held.cancel()
            raise AssertionError(f"the call ended before its run was held: {call.result()!r}")

    async def __call__(self, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        if "hold" not in code_of(msg, stdin):
            return echo_handler(msg, stdin)
        self.held.set()
        await self.release.wait()
        return RunOutcome(stdout="released\n")

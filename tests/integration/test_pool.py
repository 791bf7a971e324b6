"""The warm pool against real gVisor: hand-overs, refills, age limits, never a dirty sandbox."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.config import load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools


def pooled_config(**pool: Any) -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"].update(pool)
    return parse_config(data)


@pytest.fixture
async def pooled(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    """A manager whose Python pool (2 sandboxes) fills at start."""
    manager = SandboxManager(docker_manager, config=pooled_config(size=2, prewarm=["python"]))
    await manager.start()
    await manager.wait_pool_settled()
    yield manager
    await manager.stop()


async def pooled_ids(manager: SandboxManager) -> set[str]:
    labels = {"harombe.manager": manager.manager_id, "harombe.pooled": "1"}
    return {c.labels["harombe.sandbox"] for c in await manager.docker.list_containers(labels)}


async def test_new_sandbox_comes_from_the_pool_with_its_interpreter_running(
    pooled: SandboxManager,
) -> None:
    """A call without a sandbox id is handed a pooled sandbox whose interpreter already runs."""
    waiting = await pooled_ids(pooled)
    assert len(waiting) == 2
    tools = CodeExecutionTools(pooled, hitl_gate=None)
    with capture_events() as events:
        result = await tools.code_execute(language="python", code="x = 1\nx + 1")
    assert result["success"] and result["result"] == "2"
    assert result["sandbox_id"] in waiting
    assert [e["sandbox_id"] for e in events if e["event"] == "sandbox.claimed"] == [
        result["sandbox_id"]
    ]
    assert not [e for e in events if e["event"] == "sandbox.created"], "no cold start"
    processes = await tools.code_execute(
        language="shell",
        code="for p in /proc/[0-9]*; do cat $p/comm; done | grep -c '^python3$'",
        sandbox_id=result["sandbox_id"],
    )
    assert processes["stdout"] == "2\n"  # the supervisor and the session interpreter


async def test_pool_refills_and_never_hands_out_a_used_sandbox(pooled: SandboxManager) -> None:
    """Every claim gets a sandbox nobody ran code in; the pool tops itself up again."""
    tools = CodeExecutionTools(pooled, hitl_gate=None)
    handed: list[str] = []
    for round_ in range(4):
        result = await tools.code_execute(
            language="python",
            code="import os\nsecret = 'mine'\nopen('left-behind', 'w').write('x')\n"
            "(sorted(os.listdir('.')), 'secret' in globals())",
        )
        # Everything the previous user left is absent: files and interpreter state alike.
        assert result["result"] == "(['left-behind'], True)", (round_, result)
        handed.append(result["sandbox_id"])
        await pooled.wait_pool_settled()
        waiting = pooled.pool.ready(pooled.pool_key("python"))
        assert len(waiting) == 2 and not set(handed) & set(waiting)
    assert len(set(handed)) == 4


async def test_destroyed_sandboxes_do_not_return_to_the_pool(pooled: SandboxManager) -> None:
    """Destroying a claimed sandbox removes its container; the pool holds only new ones."""
    tools = CodeExecutionTools(pooled, hitl_gate=None)
    result = await tools.code_execute(language="python", code="1")
    await tools.code_destroy_sandbox(result["sandbox_id"])
    await pooled.wait_pool_settled()
    assert result["sandbox_id"] not in await pooled_ids(pooled)


async def test_waiting_sandboxes_older_than_max_age_are_replaced(
    docker_manager: DockerManager,
) -> None:
    """A pooled sandbox past max_age_s is retired at the next claim, never handed out."""
    config = pooled_config(size=1, prewarm=["python"], max_age_s=0.5)
    manager = SandboxManager(docker_manager, config=config)
    await manager.start()
    try:
        await manager.wait_pool_settled()
        (old,) = await pooled_ids(manager)
        await asyncio.sleep(1.0)
        box = await manager.create_sandbox("python")
        assert box.sandbox_id != old
        await manager.wait_pool_settled()
        await asyncio.sleep(0.5)  # the retired container's removal runs in the background
        assert old not in await pooled_ids(manager)
    finally:
        await manager.stop()


async def test_pool_size_zero_starts_nothing_ahead(docker_manager: DockerManager) -> None:
    """With size 0 every sandbox is a cold start and no container waits."""
    manager = SandboxManager(docker_manager, config=pooled_config(size=0, prewarm=["python"]))
    await manager.start()
    try:
        tools = CodeExecutionTools(manager, hitl_gate=None)
        result = await tools.code_execute(language="python", code="1")
        assert result["success"]
        await manager.wait_pool_settled()
        assert await pooled_ids(manager) == set()
    finally:
        await manager.stop()

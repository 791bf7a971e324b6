"""The warm pool of a real SandboxManager over FakeDocker: claim, refill, expiry, dead
sandboxes, close; no Docker."""

from __future__ import annotations

import asyncio

import pytest

from harombe.errors import DockerUnavailableError
from harombe.security.runtime import launcher as launcher_module
from harombe.security.runtime.sandbox import LABEL_POOLED
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import FakeDocker, capture_events
from tests.unit.fake_manager import config, container_of, running, started_sandboxes

POOL = {"pool": {"size": 2, "prewarm": ["python"]}}


async def test_claim_hands_out_the_oldest_and_refills() -> None:
    """A prewarmed pool fills; a create takes the oldest ready sandbox; the pool refills."""
    async with running(**POOL) as (docker, manager):
        await manager.wait_pool_settled()
        key = manager.pool_key("python")
        ready = manager.pool.ready(key)
        assert len(ready) == 2
        assert all(c.labels.get(LABEL_POOLED) == "1" for c in docker.containers.values())
        box = await manager.create_sandbox("python")
        assert box.sandbox_id == ready[0]
        # The session interpreter was started ahead of the first call.
        assert docker.guest(box.container_id).warmed == {"python"}
        await manager.wait_pool_settled()
        after = manager.pool.ready(key)
        assert after[0] == ready[1] and len(after) == 2 and box.sandbox_id not in after
        result = await manager.execute(box.sandbox_id, "print('claimed')")
        assert result.stdout == "claimed\n"


async def test_waiting_sandboxes_older_than_max_age_are_replaced() -> None:
    """A claim retires every ready sandbox past ``max_age_s`` and starts a new one instead."""
    async with running(pool={"size": 2, "prewarm": ["python"], "max_age_s": 0.05}) as (
        docker,
        manager,
    ):
        await manager.wait_pool_settled()
        old = manager.pool.ready(manager.pool_key("python"))
        await asyncio.sleep(0.06)  # both are past max_age_s now
        with capture_events() as events:
            box = await manager.create_sandbox("python")
            await manager.wait_pool_settled()
        assert box.sandbox_id not in old
        assert [e["reason"] for e in events if e["event"] == "pool.retired"] == ["expired"] * 2
        assert [container_of(docker, sid) for sid in old] == [None, None]


@pytest.mark.parametrize("fault", ["kill", "remove", "pause"])
async def test_a_pooled_sandbox_that_does_not_answer_is_discarded(
    fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed, removed or paused pooled sandbox is skipped for the next one, and removed."""
    if fault == "pause":  # the paused one's ping waits this long; the live one's is immediate
        monkeypatch.setattr(launcher_module, "CLAIM_PING_TIMEOUT_S", 0.5)
    async with running(**POOL) as (docker, manager):
        await manager.wait_pool_settled()
        dead, live = manager.pool.ready(manager.pool_key("python"))
        cid = container_of(docker, dead)
        assert cid is not None
        if fault == "kill":
            docker.kill(cid)
        elif fault == "remove":
            await docker.remove_container(cid)
        else:
            docker.pause(cid)
        await asyncio.sleep(0)  # the channel reads the end of a killed container's stream
        with capture_events() as events:
            box = await manager.create_sandbox("python")
            await manager.wait_pool_settled()
        assert box.sandbox_id == live
        assert [e["sandbox_id"] for e in events if e["event"] == "pool.retired"] == [dead]
        assert container_of(docker, dead) is None


async def test_close_returns_the_waiting_sandboxes_and_stops_refilling() -> None:
    """close() hands back what was waiting; a later create cold-starts; stop() removes them all."""
    async with running(**POOL) as (docker, manager):
        await manager.wait_pool_settled()
        ready = manager.pool.ready(manager.pool_key("python"))
        waiting = await manager.pool.close()
        assert [box.sandbox_id for box in waiting] == ready
        box = await manager.create_sandbox("python")
        assert box.sandbox_id not in ready
        await manager.wait_pool_settled()
        assert manager.pool.ready(manager.pool_key("python")) == []
    # stop() found the handed-back ones by their manager label.
    assert docker.containers == {}


async def test_stop_removes_pooled_sandboxes() -> None:
    """Sandboxes waiting in the pool are removed by stop() like every other."""
    async with running(**POOL) as (docker, manager):
        await manager.wait_pool_settled()
        assert len(docker.containers) == 2
    assert docker.containers == {}


async def test_a_failed_refill_falls_back_to_cold_starts() -> None:
    """Docker away while the pool fills: the refill gives up quietly, and a create cold-starts."""
    async with running(pool={"size": 1}) as (docker, manager):
        docker.fail("create_container", DockerUnavailableError("away"), times=1)
        with capture_events() as events:
            manager.pool.fill(manager.pool_key("python"))
            await manager.wait_pool_settled()
        assert [e["event"] for e in events if e["event"].startswith("pool.")] == [
            "pool.refill_failed"
        ]
        box = await manager.create_sandbox("python")
        assert (await manager.execute(box.sandbox_id, "print(1)")).stdout == "1\n"


@pytest.mark.parametrize("prewarm", [False, True], ids=["claims-only", "prewarm-asks"])
async def test_a_lazy_pool_fills_from_a_keys_second_claim(prewarm: bool) -> None:
    """A lazy pool starts nothing for a key's first claim, fills from its second; prewarm()
    fills it at once."""
    docker = FakeDocker()
    await docker.start()
    started = started_sandboxes(docker)
    manager = SandboxManager(docker, config=config(pool={"size": 2}), lazy_pool=True)
    await manager.start()
    key = manager.pool_key("python")
    try:
        if prewarm:
            manager.prewarm("python")
            await manager.wait_pool_settled()
            assert len(manager.pool.ready(key)) == 2
            return
        first = await manager.create_sandbox("python")
        await manager.wait_pool_settled()
        assert list(started.values()) == [False] and manager.pool.ready(key) == []
        await manager.destroy_sandbox(first.sandbox_id)
        second = await manager.create_sandbox("python")  # cold: the pool was empty
        await manager.wait_pool_settled()
        assert len(manager.pool.ready(key)) == 2 and second.sandbox_id in manager.sandboxes
        third = await manager.create_sandbox("python")
        assert third.sandbox_id not in manager.pool.ready(key)
        await manager.wait_pool_settled()
        assert sorted(started.values()) == [False, False, True, True, True]  # 2 cold, 3 pooled
    finally:
        await manager.stop()
    assert docker.containers == {}

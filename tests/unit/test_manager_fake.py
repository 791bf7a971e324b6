"""A real SandboxManager (and the tools over it) on FakeDocker: runs, lost-sandbox replacement,
the grant a lost sandbox takes with it, stop(), the orphan sweep; no Docker."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from harombe.errors import (
    DockerUnavailableError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxNotFoundError,
)
from harombe.security.approval.gate import ApprovalResponse, HITLGate
from harombe.security.runtime import network as network_module
from harombe.security.runtime.network import LABEL_NETWORK
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_MANAGER,
    LABEL_OWNER,
    process_owner,
)
from harombe.testing import FakeDocker, ScriptedApprover, capture_events
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit.fake_manager import Hold, container_of, running


async def test_code_runs_through_the_manager_and_the_session() -> None:
    """execute() sends the code to the sandbox's session and maps the reply."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        result = await manager.execute(box.sandbox_id, "print('hi')\n40 + 2\n42")
        assert (result.success, result.stdout, result.result, result.stateful) == (
            True,
            "hi\n",
            "42",
            True,
        )
        shell = await manager.execute(box.sandbox_id, "echo e >&2\nexit 3", language="shell")
        assert (shell.status, shell.exit_code, shell.stderr) == ("error", 3, "e\n")
        run = docker.guest(box.container_id).requests[-1]
        assert run["argv"][:2] == ["bash", "-c"] and not run.get("session")


async def test_files_go_through_the_guest() -> None:
    """write/read/list reach the sandbox's workspace; the path is checked on the host first."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        assert await manager.write_file(box.sandbox_id, "/workspace/d/a.txt", "abc") == 3
        assert docker.guest(box.container_id).files["/workspace/d/a.txt"] == b"abc"
        assert await manager.read_file(box.sandbox_id, "d/a.txt") == b"abc"
        names = [e["name"] for e in await manager.list_files(box.sandbox_id, "d")]
        assert names == ["a.txt"]


KILLS: list[tuple[Callable[[FakeDocker, str], object], str]] = [
    (lambda d, c: d.kill(c), "supervisor exited with code 137"),
    (lambda d, c: d.kill(c, oom=True), "exceeding its memory limit"),
    (lambda d, c: d.remove_container(c), "the container stopped"),
]
KILL_IDS = ["killed", "oom-killed", "removed"]


@pytest.mark.parametrize(("kill", "reason"), KILLS, ids=KILL_IDS)
async def test_a_sandbox_lost_during_a_run_is_replaced(
    kill: Callable[[FakeDocker, str], object], reason: str
) -> None:
    """The run ends ``lost`` with its cause; a replacement takes over; the old id names it."""
    hold = Hold()
    async with running(FakeDocker(handler=hold)) as (docker, manager):
        box = await manager.create_sandbox("python")
        call = asyncio.ensure_future(manager.execute(box.sandbox_id, "hold"))
        await hold.until_held(call)
        done = kill(docker, box.container_id)
        if asyncio.iscoroutine(done):
            await done
        result = await call
        assert (result.status, result.success, result.exit_code) == ("lost", False, -1)
        assert result.replaced_sandbox_id == box.sandbox_id
        assert reason in str(result.error)
        new_id = result.sandbox_id
        assert new_id != box.sandbox_id and container_of(docker, box.sandbox_id) is None
        with pytest.raises(SandboxNotFoundError, match=f"replaced by {new_id}"):
            manager.get(box.sandbox_id)
        assert (await manager.execute(new_id, "print('again')")).stdout == "again\n"


async def test_a_sandbox_killed_between_calls_is_replaced_on_the_next() -> None:
    """A sandbox that died while idle is found lost by the next call, which names its heir."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        docker.kill(box.container_id)
        await asyncio.sleep(0)  # the channel reads the end of the stream
        result = await manager.execute(box.sandbox_id, "print(1)")
        assert result.status == "lost" and result.replaced_sandbox_id == box.sandbox_id
        assert result.sandbox_id in manager.sandboxes


async def test_a_lost_sandbox_takes_its_grant_with_it() -> None:
    """A sandbox grant is dropped when its sandbox is lost; the replacement asks again."""
    hold = Hold()
    approver = ScriptedApprover([ApprovalResponse(True, scope="sandbox")], default=False)
    gate = HITLGate(approver=approver)
    async with running(FakeDocker(handler=hold)) as (docker, manager):
        tools = CodeExecutionTools(manager, hitl_gate=gate)
        first = await tools.code_execute(language="python", code="print(1)")
        sid = first["sandbox_id"]
        assert first["success"] and gate.grants(sid)
        second = await tools.code_execute(language="python", code="print(2)", sandbox_id=sid)
        assert second["approval"]["decided_by"] == "sandbox_grant"
        with capture_events() as events:
            call = asyncio.ensure_future(
                tools.code_execute(language="python", code="hold()", sandbox_id=sid)
            )
            await hold.until_held(call)
            docker.kill(manager.get(sid).container_id)
            lost = await call
        assert lost["status"] == "lost" and lost["replaced_sandbox_id"] == sid
        assert gate.grants(sid) == frozenset()
        assert [e["sandbox_id"] for e in events if e["event"] == "hitl.grants_dropped"] == [sid]
        asked = len(approver.requests)
        again = await tools.code_execute(
            language="python", code="print(3)", sandbox_id=lost["sandbox_id"]
        )
        assert len(approver.requests) == asked + 1
        assert again["success"] is False and again["approval"]["status"] == "denied"


async def test_stop_removes_everything_the_manager_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """stop() removes live, pooled and Docker-away leftovers of its own, nothing of others."""

    async def no_rules(chain: str, bridge: str) -> list[list[str]]:
        return []  # the fake's bridges have no firewall rules

    monkeypatch.setattr(network_module, "_rules_for", no_rules)
    docker = FakeDocker()
    async with running(docker, pool={"size": 1, "prewarm": ["python"]}) as (_, manager):
        await manager.wait_pool_settled()
        live = await manager.create_sandbox("javascript")
        doomed = await manager.create_sandbox("shell")
        docker.away("remove_container")
        await manager.destroy_sandbox(doomed.sandbox_id)
        assert container_of(docker, doomed.sandbox_id) is not None, "Docker was away"
        assert manager.launcher.unremoved == {doomed.container_id}
        labels = {LABEL_MANAGED: "1", LABEL_MANAGER: manager.manager_id, LABEL_NETWORK: "x"}
        await docker.create_network("harombe-left", labels=labels)
        other = {**labels, LABEL_MANAGER: "another"}
        await docker.create_network("harombe-other", labels=other)
        image = manager.sandbox_config.image_for("python")
        await docker.create_container(image=image, labels=other)
        await manager.wait_pool_settled()
        assert container_of(docker, live.sandbox_id) is not None
    assert [c.labels[LABEL_MANAGER] for c in docker.containers.values()] == ["another"]
    assert [n.name for n in docker.networks.values()] == ["harombe-other"]
    assert manager.launcher.unremoved == set()


async def test_a_deferred_removal_is_retried_when_docker_answers() -> None:
    """A removal that failed while Docker was away is done at the next sandbox start."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        docker.away("remove_container")
        await manager.destroy_sandbox(box.sandbox_id)
        assert container_of(docker, box.sandbox_id) is not None
        await manager.create_sandbox("python")
        await manager.wait_pool_settled()
        assert container_of(docker, box.sandbox_id) is None
        assert manager.launcher.unremoved == set()


async def test_the_orphan_sweep_removes_only_containers_of_dead_owners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """start() removes what a dead harombe process on this host left; the rest stays."""

    async def no_rules(chain: str, bridge: str) -> list[list[str]]:
        return []

    monkeypatch.setattr(network_module, "_rules_for", no_rules)
    host = socket.gethostname()
    owners = {
        "dead": f"{host}:999999999:12345",  # no such pid: its owner is gone
        "alive": process_owner(),
        "elsewhere": "another-host:1:1",
    }
    docker = FakeDocker()
    await docker.start()
    image = next(iter(docker.images))
    made = {
        name: await docker.create_container(
            image=image, labels={LABEL_MANAGED: "1", LABEL_OWNER: owner}
        )
        for name, owner in owners.items()
    }
    stranger = await docker.create_container(image=image, labels={"other": "1"})
    for name, owner in owners.items():
        labels = {LABEL_MANAGED: "1", LABEL_OWNER: owner, LABEL_NETWORK: name}
        await docker.create_network(f"net-{name}", labels=labels)
    async with running(docker):
        assert set(docker.containers) == {made["alive"], made["elsewhere"], stranger}
        assert {n.name for n in docker.networks.values()} == {"net-alive", "net-elsewhere"}


@pytest.mark.parametrize(
    ("docker", "error"),
    [
        (FakeDocker(runtimes=("runc",)), RuntimeNotAvailableError),
        (FakeDocker(images=()), ImageNotFoundError),
    ],
    ids=["no-runsc", "no-image"],
)
async def test_a_missing_runtime_or_image_is_named_and_nothing_is_made(
    docker: FakeDocker, error: type[Exception]
) -> None:
    """No runsc: start() refuses; no image: a create fails before making anything."""
    with pytest.raises(error):
        async with running(docker) as (_, manager):
            await manager.create_sandbox("python")
    assert docker.containers == {}


async def test_docker_away_during_create_leaves_nothing() -> None:
    """A create that Docker cannot serve raises its error and keeps no container."""
    async with running() as (docker, manager):
        docker.away("start_container")
        with pytest.raises(DockerUnavailableError):
            await manager.create_sandbox("python")
        assert docker.containers == {} and manager.sandboxes == {}

"""Fault probes against real gVisor: containers killed, removed or paused from outside, Docker
outages, and cancellation at every step of creating a sandbox.

Each probe asserts a sensible outcome — the call fails as ``lost`` and names a replacement that
really runs code, or it fails with a clear error — and that nothing of the manager is left
behind: no container or network that is not a live or pooled sandbox once the manager has
settled, and nothing at all after ``stop()``.

Docker outages go through :class:`DockerLink`, a unix socket the test owns that forwards to the
real daemon and can be cut (connections dropped, new ones refused or left unanswered) and
restored, so the daemon other tests use is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from harombe.config import load_config, parse_config
from harombe.errors import DockerUnavailableError, HarombeError
from harombe.security.docker_manager import DockerManager
from harombe.security.runtime.cgroups import CpuQuota
from harombe.security.runtime.channel import Channel
from harombe.security.runtime.launcher import Launcher
from harombe.security.sandbox_manager import SandboxManager

DOCKER_SOCKET = "/var/run/docker.sock"
LABEL_MANAGER = "harombe.manager"
TIMEOUT_S = 60  # no probe may take longer than this to return at all
SETTLE_S = 1.0  # after a cancellation has returned, time for anything still in flight to land


def config(pool_size: int = 2, prewarm: tuple[str, ...] = ("python",)) -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"].update(size=pool_size, prewarm=list(prewarm))
    data["security"]["sandbox"]["network"]["allow_private_destinations"] = True
    return parse_config(data)


class DockerLink:
    """A cuttable link to the real Docker daemon: a unix socket that forwards every connection.

    ``cut("refuse")`` drops every connection and stops listening (a daemon that died);
    ``cut("hang")`` drops every connection and then accepts new ones without ever answering
    (a daemon that hangs); ``restore()`` forwards again.
    """

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="harombe-link-")
        self.path = os.path.join(self.dir, "docker.sock")
        self.mode = "up"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.mode != "up":
            return  # held open, never answered
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(DOCKER_SOCKET)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, RuntimeError):
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def cut(self, mode: str) -> None:
        self.mode = mode
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        self.mode = "up"
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut("refuse")
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)


async def docker_cli(*argv: str) -> None:
    """An outside actor: the docker CLI against the real daemon."""
    proc = await asyncio.create_subprocess_exec(
        "docker", *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()


async def mine(docker_manager: DockerManager, manager: SandboxManager) -> tuple[set[str], set[str]]:
    """(sandbox ids of containers, sandbox ids of networks) labelled with ``manager``'s id."""
    labels = {LABEL_MANAGER: manager.manager_id}
    containers = {
        c.labels.get("harombe.sandbox", c.id) for c in await docker_manager.list_containers(labels)
    }
    networks = {
        found.get("harombe.network", nid)
        for nid, found in await docker_manager.list_networks(labels)
    }
    return containers, networks


async def assert_no_debris(docker_manager: DockerManager, manager: SandboxManager) -> None:
    """Every container and network of ``manager`` belongs to a live or pooled sandbox."""
    await manager.wait_pool_settled()
    live = set(manager.sandboxes)
    pooled = {sid for key in list(manager.pool._ready) for sid in manager.pool.ready(key)}
    containers, networks = await mine(docker_manager, manager)
    assert containers <= live | pooled, f"leaked containers: {containers - live - pooled}"
    with_network = {sid for sid, box in manager.sandboxes.items() if box.network_enabled}
    assert networks <= with_network, f"leaked networks: {networks - with_network}"


async def assert_live(manager: SandboxManager, sandbox_id: str) -> None:
    result = await manager.execute(sandbox_id, "print(6 * 7)", language="python")
    assert result.status == "ok" and result.stdout == "42\n", result


async def stop_and_check(docker_manager: DockerManager, manager: SandboxManager) -> None:
    await manager.stop()
    assert await mine(docker_manager, manager) == (set(), set()), "stop() left something"


@pytest.fixture
async def link() -> AsyncIterator[DockerLink]:
    link = DockerLink()
    await link.start()
    yield link
    await link.close()


@pytest.fixture
async def linked(docker_manager: DockerManager, link: DockerLink) -> AsyncIterator[SandboxManager]:
    """A manager that reaches Docker through ``link``, with a full Python pool of 2."""
    dm = DockerManager(link.url, timeout_s=20)
    await dm.start()
    manager = SandboxManager(dm, config=config())
    await manager.start()
    await manager.wait_pool_settled()
    assert len(manager.pool.ready(manager.pool_key("python"))) == 2
    yield manager
    await link.restore()
    await stop_and_check(docker_manager, manager)
    await dm.stop()


@pytest.fixture
async def pooled(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    manager = SandboxManager(docker_manager, config=config())
    await manager.start()
    await manager.wait_pool_settled()
    yield manager
    await stop_and_check(docker_manager, manager)


# ---------------------------------------------------------------------------------------------
# Kills, removals and pauses from outside


def pooled_ids(manager: SandboxManager) -> list[str]:
    return manager.pool.ready(manager.pool_key("python"))


def container_of(manager: SandboxManager, sandbox_id: str) -> str:
    box = manager._sandboxes.get(sandbox_id)
    if box is not None:
        return box.container_id
    return f"harombe-{sandbox_id}"


OUTSIDE = {
    "kill": lambda cid: docker_cli("kill", cid),
    "remove": lambda cid: docker_cli("rm", "-f", cid),
    "pause": lambda cid: docker_cli("pause", cid),
}


@pytest.mark.parametrize("action", list(OUTSIDE), ids=list(OUTSIDE))
async def test_sandbox_hit_during_a_call(
    docker_manager: DockerManager, pooled: SandboxManager, action: str
) -> None:
    """A container killed/removed/paused under a running call: the call returns `lost` with a
    live replacement before the call's own timeout, and the old container is gone."""
    box = await pooled.create_sandbox("python")
    call = asyncio.create_task(
        pooled.execute(box.sandbox_id, "import time\ntime.sleep(25)\nprint('late')", timeout_s=30)
    )
    await asyncio.sleep(1.0)
    await OUTSIDE[action](box.container_id)
    result = await asyncio.wait_for(call, 29)  # the run's own timeout is 30 s
    assert result.status == "lost" and not result.success, result
    assert result.replaced_sandbox_id == box.sandbox_id and result.sandbox_id != box.sandbox_id
    assert "late" not in result.stdout
    await assert_live(pooled, result.sandbox_id)
    await assert_no_debris(docker_manager, pooled)
    assert box.sandbox_id not in (await mine(docker_manager, pooled))[0]


@pytest.mark.parametrize("action", list(OUTSIDE), ids=list(OUTSIDE))
async def test_sandbox_hit_between_calls(
    docker_manager: DockerManager, pooled: SandboxManager, action: str
) -> None:
    """A container killed/removed/paused between calls: the next call is `lost` with a live
    replacement, and the old container is gone."""
    box = await pooled.create_sandbox("python")
    await assert_live(pooled, box.sandbox_id)
    await OUTSIDE[action](box.container_id)
    await asyncio.sleep(0.5)
    call = pooled.execute(box.sandbox_id, "print(1)", timeout_s=10)
    result = await asyncio.wait_for(call, 10)  # returned at all within the call's timeout
    assert result.status == "lost" and result.replaced_sandbox_id == box.sandbox_id, result
    await assert_live(pooled, result.sandbox_id)
    await assert_no_debris(docker_manager, pooled)
    assert box.sandbox_id not in (await mine(docker_manager, pooled))[0]


@pytest.mark.parametrize("count", [1, 2], ids=["one", "all"])
@pytest.mark.parametrize("action", list(OUTSIDE), ids=list(OUTSIDE))
async def test_pooled_sandboxes_hit_while_waiting(
    docker_manager: DockerManager, pooled: SandboxManager, action: str, count: int
) -> None:
    """Pooled sandboxes killed/removed/paused while they wait are never handed out: a new
    sandbox runs code at once, and the dead ones are removed."""
    hit = pooled_ids(pooled)[:count]
    await asyncio.gather(*(OUTSIDE[action](f"harombe-{sid}") for sid in hit))
    for _ in range(3):
        box = await asyncio.wait_for(pooled.create_sandbox("python"), TIMEOUT_S)
        assert box.sandbox_id not in hit
        await assert_live(pooled, box.sandbox_id)
    await assert_no_debris(docker_manager, pooled)
    assert not set(hit) & (await mine(docker_manager, pooled))[0]


async def test_lost_sandbox_replacement_is_live_when_the_pool_is_dead(
    docker_manager: DockerManager, pooled: SandboxManager
) -> None:
    """A sandbox lost under a call while every pooled one is dead too gets a live replacement,
    not another dead one."""
    box = await pooled.create_sandbox("python")
    await pooled.wait_pool_settled()
    doomed = [box.container_id, *(f"harombe-{sid}" for sid in pooled_ids(pooled))]
    await asyncio.gather(*(docker_cli("kill", cid) for cid in doomed))
    result = await asyncio.wait_for(pooled.execute(box.sandbox_id, "print(1)"), TIMEOUT_S)
    assert result.status == "lost", result
    await assert_live(pooled, result.sandbox_id)
    await assert_no_debris(docker_manager, pooled)


# ---------------------------------------------------------------------------------------------
# Docker outages, through a link the test cuts


@pytest.mark.parametrize("mode", ["refuse", "hang"], ids=["daemon_gone", "daemon_hangs"])
async def test_outage_while_idle_then_new_sandbox(
    docker_manager: DockerManager, linked: SandboxManager, link: DockerLink, mode: str
) -> None:
    """After an outage the pooled sandboxes (their channels cut) are discarded: the first new
    sandbox after Docker is back runs code, and nothing dead is left behind."""
    await link.cut(mode)
    await asyncio.sleep(0.5)
    await link.restore()
    box = await asyncio.wait_for(linked.create_sandbox("python"), TIMEOUT_S)
    await assert_live(linked, box.sandbox_id)
    await assert_no_debris(docker_manager, linked)


async def test_outage_during_a_call_then_recovery(
    docker_manager: DockerManager, linked: SandboxManager, link: DockerLink
) -> None:
    """Docker gone under a call: the call ends (lost, or a clear DockerUnavailableError) long
    before its timeout; once Docker is back, a new sandbox works and the dead one is removed."""
    box = await linked.create_sandbox("python")
    call = asyncio.create_task(linked.execute(box.sandbox_id, "import time\ntime.sleep(20)"))
    await asyncio.sleep(1.0)
    await link.cut("refuse")
    try:
        result = await asyncio.wait_for(call, TIMEOUT_S)
        assert result.status == "lost", result
    except DockerUnavailableError as exc:
        assert "Docker" in str(exc) and "socket" in str(exc), exc
    await link.restore()
    fresh = await asyncio.wait_for(linked.create_sandbox("python"), TIMEOUT_S)
    await assert_live(linked, fresh.sandbox_id)
    await assert_no_debris(docker_manager, linked)
    assert box.sandbox_id not in (await mine(docker_manager, linked))[0]


async def test_new_sandbox_during_an_outage_fails_clearly(
    docker_manager: DockerManager, linked: SandboxManager, link: DockerLink
) -> None:
    """A new sandbox asked for while Docker is gone fails with a DockerUnavailableError that
    says how to fix it; after the outage the next one works."""
    await link.cut("refuse")
    await asyncio.sleep(0.2)
    with pytest.raises(DockerUnavailableError) as caught:
        await asyncio.wait_for(linked.create_sandbox("python"), TIMEOUT_S)
    assert "setup.sh" in str(caught.value) or "DOCKER_HOST" in str(caught.value)
    await link.restore()
    box = await asyncio.wait_for(linked.create_sandbox("python"), TIMEOUT_S)
    await assert_live(linked, box.sandbox_id)
    await assert_no_debris(docker_manager, linked)


async def test_background_failures_are_never_left_unretrieved(
    docker_manager: DockerManager, linked: SandboxManager, link: DockerLink
) -> None:
    """Refills, retirements and removals that fail while Docker is gone leave no "exception
    was never retrieved" behind; the failures are logged instead."""
    import gc

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        await link.cut("refuse")
        await asyncio.sleep(0.2)
        for _ in range(2):  # the dead pooled sandboxes are retired, refills fail
            with contextlib.suppress(HarombeError):
                await linked.create_sandbox("python")
        await linked.wait_pool_settled()
        await link.restore()
        box = await asyncio.wait_for(linked.create_sandbox("python"), TIMEOUT_S)
        await assert_live(linked, box.sandbox_id)
        await assert_no_debris(docker_manager, linked)
        gc.collect()
        await asyncio.sleep(0.1)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


# ---------------------------------------------------------------------------------------------
# Docker at start: no socket, or one that accepts and never answers


@pytest.mark.parametrize("mode", ["missing", "hang"], ids=["no_socket", "socket_never_answers"])
async def test_docker_start_names_the_socket_and_the_fix(mode: str) -> None:
    """DockerManager.start() against a missing or silent socket fails fast with an error that
    names the socket and the fix (a plain Python socket server, no Docker SDK mock)."""
    link = DockerLink()
    try:
        if mode == "hang":
            link.mode = "hang"
            await link.start()
        manager = DockerManager(link.url)
        with pytest.raises(DockerUnavailableError) as caught:
            await asyncio.wait_for(manager.start(), 30)  # the health check's own limit is shorter
        message = str(caught.value)
        assert link.path in message
        assert "scripts/setup.sh" in message and "DOCKER_HOST" in message
        assert not manager.started
    finally:
        await link.close()


# ---------------------------------------------------------------------------------------------
# Cancellation at every step of creation


STEPS: list[tuple[type, str]] = [
    (DockerManager, "image_id"),
    (DockerManager, "create_network"),
    (DockerManager, "network_bridge"),
    (DockerManager, "create_container"),
    (DockerManager, "attach"),
    (DockerManager, "start_container"),
    (Channel, "hello"),
    (CpuQuota, "apply"),
    (Launcher, "install_ca_bundle"),
]


def cancel_on_entry(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, target: list[asyncio.Task[Any]]
) -> None:
    """Make ``owner.name`` cancel the task in ``target`` once the step is under way (5 ms in:
    a Docker call is then in its thread, past the point where it could be called off)."""
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)

    async def step(*args: Any, **kwargs: Any) -> Any:
        if target and asyncio.current_task() is target[0]:
            asyncio.get_running_loop().call_later(0.005, target[0].cancel)
        return await original(*args, **kwargs)

    monkeypatch.setattr(owner, name, step)


NETWORK_STEPS = {"create_network", "network_bridge", "install_ca_bundle"}
STEP_CASES = [(step, False) for step in STEPS if step[1] not in NETWORK_STEPS] + [
    (step, True) for step in STEPS
]


@pytest.mark.parametrize(
    ("step", "network"),
    STEP_CASES,
    ids=[f"{'network' if net else 'offline'}_{name.strip('_')}" for (_, name), net in STEP_CASES],
)
async def test_cancel_at_each_step_of_creation(
    docker_manager: DockerManager,
    monkeypatch: pytest.MonkeyPatch,
    step: tuple[type, str],
    network: bool,
) -> None:
    """Cancelling create_sandbox while step X is under way leaves no container or network,
    and the manager still creates sandboxes afterwards."""
    manager = SandboxManager(docker_manager, config=config(pool_size=0, prewarm=()))
    await manager.start()
    try:
        target: list[asyncio.Task[Any]] = []
        cancel_on_entry(monkeypatch, *step, target)
        task = asyncio.create_task(
            manager.create_sandbox(
                "python", network_enabled=network, allowed_domains=["example.org"]
            )
        )
        target.append(task)
        with contextlib.suppress(asyncio.CancelledError, HarombeError):
            await asyncio.wait_for(task, TIMEOUT_S)
        monkeypatch.undo()
        await asyncio.sleep(SETTLE_S)  # a Docker call still in flight would land by now
        await assert_no_debris(docker_manager, manager)
        assert not manager.sandboxes or (task.done() and not task.cancelled())
        box = await manager.create_sandbox("python")
        await assert_live(manager, box.sandbox_id)
    finally:
        await stop_and_check(docker_manager, manager)


DELAYS_S = [round(0.1 * i, 2) for i in range(16)]  # 0 .. 1.5 s


@pytest.mark.parametrize("network", [False, True], ids=["offline", "network"])
@pytest.mark.parametrize("delay_s", DELAYS_S, ids=[f"after_{d:.1f}s" for d in DELAYS_S])
async def test_cancel_creation_after_a_delay(
    docker_manager: DockerManager, delay_s: float, network: bool
) -> None:
    """Cancelling create_sandbox at any moment leaves nothing once the cancel has settled: a
    sandbox it made is either returned or removed, and stop() removes every network too."""
    manager = SandboxManager(docker_manager, config=config(pool_size=0, prewarm=()))
    await manager.start()
    try:
        task = asyncio.create_task(
            manager.create_sandbox(
                "python", network_enabled=network, allowed_domains=["example.org"]
            )
        )
        await asyncio.sleep(delay_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, TIMEOUT_S)
        await asyncio.sleep(SETTLE_S)  # a Docker call still in flight would land by now
        await assert_no_debris(docker_manager, manager)
        if task.cancelled():
            assert manager.sandboxes == {}
        else:
            assert list(manager.sandboxes) == [task.result().sandbox_id]
    finally:
        await stop_and_check(docker_manager, manager)


@pytest.mark.parametrize("step", STEPS[:1] + STEPS[3:8], ids=[n for _, n in STEPS[:1] + STEPS[3:8]])
async def test_stop_while_a_refill_is_at_each_step(
    docker_manager: DockerManager, monkeypatch: pytest.MonkeyPatch, step: tuple[type, str]
) -> None:
    """stop() called while the warm pool's refill is inside step X leaves no container."""
    manager = SandboxManager(docker_manager, config=config(pool_size=2, prewarm=()))
    await manager.start()
    owner, name = step
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)
    stopping: list[asyncio.Task[None]] = []
    test_task = asyncio.current_task()
    hooked_once: list[bool] = []

    def stop_now() -> None:
        stopping.append(asyncio.create_task(manager.stop()))

    async def hooked(*args: Any, **kwargs: Any) -> Any:
        if not hooked_once and asyncio.current_task() is not test_task:  # the refill's task
            hooked_once.append(True)
            asyncio.get_running_loop().call_later(0.005, stop_now)
        return await original(*args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)
    manager.pool.fill(manager.pool_key("python"))
    for _ in range(200):  # bounded: the refill reaches the step within seconds
        if stopping:
            break
        await asyncio.sleep(0.05)
    assert stopping, f"the refill never reached {name}"
    await asyncio.wait_for(stopping[0], TIMEOUT_S)
    monkeypatch.undo()
    assert await mine(docker_manager, manager) == (set(), set()), "stop() left something"
    await asyncio.sleep(SETTLE_S)  # nothing lands after stop() returned either
    assert await mine(docker_manager, manager) == (set(), set())


STOP_DELAYS_S = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.6]


@pytest.mark.parametrize(
    "delay_s", STOP_DELAYS_S, ids=[f"stop_after_{d:.1f}s" for d in STOP_DELAYS_S]
)
async def test_stop_racing_a_refill_leaves_nothing(
    docker_manager: DockerManager, delay_s: float
) -> None:
    """stop() while the warm pool is filling removes every container the refill made."""
    manager = SandboxManager(docker_manager, config=config(pool_size=2, prewarm=("python",)))
    await manager.start()
    await asyncio.sleep(delay_s)
    await stop_and_check(docker_manager, manager)
    await asyncio.sleep(SETTLE_S)  # a Docker call that was in flight during stop() has landed
    assert await mine(docker_manager, manager) == (set(), set())


async def test_cancelled_warm_up_of_a_pooled_sandbox_leaves_nothing(
    docker_manager: DockerManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill cancelled while the pooled sandbox's interpreter warms up removes it."""
    manager = SandboxManager(docker_manager, config=config(pool_size=1, prewarm=()))
    await manager.start()
    original = Channel.request

    async def request(self: Channel, msg: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if msg.get("op") == "warm":
            task = asyncio.current_task()
            assert task is not None
            asyncio.get_running_loop().call_soon(task.cancel)
        return await original(self, msg, *args, **kwargs)

    try:
        monkeypatch.setattr(Channel, "request", request)
        manager.pool.fill(manager.pool_key("python"))
        await manager.wait_pool_settled()
        monkeypatch.undo()
        await assert_no_debris(docker_manager, manager)
        assert pooled_ids(manager) == []
    finally:
        await stop_and_check(docker_manager, manager)


# ---------------------------------------------------------------------------------------------
# Values the manager API must refuse itself


@pytest.mark.parametrize(
    "timeout_s",
    [float("nan"), float("inf"), -1.0, 0.0, "5", True],
    ids=["nan", "inf", "negative", "zero", "string", "bool"],
)
async def test_execute_refuses_unusable_timeouts(pooled: SandboxManager, timeout_s: Any) -> None:
    """execute() refuses a NaN, infinite, non-positive or non-numeric timeout with UsageError
    before anything runs (NaN would otherwise slip past the time cap)."""
    from harombe.errors import UsageError

    box = await pooled.create_sandbox("python")
    with pytest.raises(UsageError, match="timeout"):
        await pooled.execute(box.sandbox_id, "print(1)", timeout_s=timeout_s)
    assert box.runs == 0

"""Review probes of the real Docker backend and a real sandbox (gVisor): the DockerBackend
protocol's error kinds, and the configured sandbox user. Few and bounded: two containers that
are created but never started, and one sandbox."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.config import DEFAULT_IMAGE, parse_config
from harombe.errors import ConfigError, DockerUnavailableError, HarombeError, SandboxLostError
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager

pytestmark = pytest.mark.integration

MISSING = "0" * 64
MISSING_CALLS: list[tuple[str, Callable[[DockerManager], Any]]] = [
    ("attach", lambda d: d.attach(MISSING)),
    ("start_container", lambda d: d.start_container(MISSING)),
    ("container_state", lambda d: d.container_state(MISSING)),
]


@pytest.mark.parametrize(("method", "call"), MISSING_CALLS, ids=[m for m, _ in MISSING_CALLS])
async def test_a_missing_container_is_sandbox_lost_in_every_call(
    docker_manager: DockerManager, method: str, call: Callable[[DockerManager], Any]
) -> None:
    """The DockerBackend protocol: a call on a container that does not exist raises
    SandboxLostError (FakeDocker does; attach must too, not DockerUnavailableError)."""
    with pytest.raises(SandboxLostError):
        await call(docker_manager)


async def test_a_start_without_its_network_does_not_say_the_container_is_gone(
    docker_manager: DockerManager,
) -> None:
    """A container whose network was removed before its start is still there: the start's
    error must not say the container is gone."""
    name = f"harombe-review-{uuid.uuid4().hex[:8]}"
    cid = await docker_manager.create_container(
        image=DEFAULT_IMAGE, name=name, command=["true"], runtime="runsc",
        network_mode=f"{name}-no-such-network", labels={"harombe.review": "1"},
    )  # fmt: skip
    try:
        with pytest.raises(HarombeError) as caught:
            await docker_manager.start_container(cid)
        state = await docker_manager.container_state(cid)
    finally:
        await docker_manager.remove_container(cid)
    assert state.get("Status") == "created"
    assert "container is gone" not in str(caught.value), str(caught.value)


async def test_import_of_a_missing_archive_is_not_docker_unavailable(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """import_image of an archive that does not exist is refused as such, not reported as
    Docker being unavailable (the SDK hands the daemon the missing path as a URL to fetch)."""
    with pytest.raises(HarombeError) as caught:
        await docker_manager.import_image(
            tmp_path / "rootfs.tar", repository="harombe-review", tag="missing"
        )
    assert not isinstance(caught.value, DockerUnavailableError), str(caught.value)


async def test_a_root_sandbox_user_is_refused_not_obeyed(docker_manager: DockerManager) -> None:
    """security.sandbox.user: "0:0" is refused: user code must never run as root beside the
    root supervisor (same uid: it could signal or trace PID 1 and keep its capabilities)."""
    try:
        cfg = parse_config({"security": {"sandbox": {"user": "0:0", "pool": {"size": 0}}}})
        manager = SandboxManager(docker_manager, config=cfg)
    except ConfigError:
        return
    await manager.start()
    try:
        box = await manager.create_sandbox("python")
        result = await manager.execute(
            box.sandbox_id, "import os\nprint(os.getuid(), open('/proc/self/status').read())"
        )
    finally:
        await manager.stop()
    assert not result.stdout.startswith("0 "), f"user code ran as root: {result.stdout[:80]}"

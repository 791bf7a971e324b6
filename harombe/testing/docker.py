"""FakeDocker: the :class:`~harombe.security.runtime.backend.DockerBackend` in memory.

Images are a set of names, runtimes a set of names, containers and networks dicts; every
container's attached stdio is connected to a :class:`~harombe.testing.guest.FakeGuest` that
starts when the container starts. Calls raise the :mod:`harombe.errors` exceptions the real
backend raises (an unknown image: ImageNotFoundError; a container that is gone:
SandboxLostError; an unregistered runtime: RuntimeNotAvailableError; any call before
:meth:`FakeDocker.start`: UsageError).

Faults a test can cause: :meth:`FakeDocker.fail` makes the next N calls of a method raise a
given error (Docker being away: ``DockerUnavailableError``); :meth:`FakeDocker.kill` stops a
container (its stdio ends, so the channel sees the sandbox lost, and its state says exited or
OOMKilled); :meth:`FakeDocker.pause` freezes it (its guest answers nothing; state Paused).

A container's ``Pid`` is above Linux's largest possible pid, so it is never a host process's:
code that reads ``/proc/<pid>`` finds nothing there, and the CPU quota harombe sets through a
container's host cgroup falls back, on the first start, to Docker's create-time quota.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harombe.config import DEFAULT_IMAGE
from harombe.errors import (
    BuildError,
    DockerUnavailableError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxLostError,
    SandboxStartError,
    UsageError,
)
from harombe.security.runtime.backend import ContainerInfo, DockerBackend
from harombe.testing.echo import RunHandler, echo_handler
from harombe.testing.guest import FakeGuest, Output
from harombe.testing.terminal import FakeTerminal

__all__ = ["FakeContainer", "FakeDocker", "FakeNetwork", "FakeStdio"]

#: Linux's PID_MAX_LIMIT: no host process has a pid at or above it.
PID_MAX_LIMIT = 4_194_304


def _id(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


@dataclass
class FakeContainer:
    """One container: its spec (the keyword arguments of ``create_container``) and state."""

    id: str
    name: str
    image: str
    labels: dict[str, str]
    spec: dict[str, Any]
    guest: FakeGuest
    pid: int
    status: str = "created"  # created | running | paused | exited
    exit_code: int = 0
    oom_killed: bool = False
    addresses: dict[str, str] = field(default_factory=dict)  # network name -> IPv4 address

    def state(self) -> dict[str, Any]:
        """Docker's ``State`` of this container."""
        running = self.status in ("running", "paused")
        return {
            "Status": self.status, "Running": running, "Paused": self.status == "paused",
            "OOMKilled": self.oom_killed, "ExitCode": self.exit_code,
            "Pid": self.pid if running else 0,
        }  # fmt: skip


@dataclass
class FakeNetwork:
    id: str
    name: str
    labels: dict[str, str]
    gateway: str
    bridge: str


class FakeStdio:
    """A container's attached stdio: what its guest writes, and a way to its stdin."""

    def __init__(self, container: FakeContainer) -> None:
        self._guest = container.guest
        self._queue = container.guest.connect()
        self._closed = False

    async def read(self) -> tuple[int, bytes] | None:
        if self._closed:
            return None
        item: Output = await self._queue.get()
        return item

    async def write(self, data: bytes) -> None:
        if self._closed or self._guest.ended:
            raise SandboxLostError("the sandbox's stdin is closed: the container stopped")
        self._guest.receive(bytes(data))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._guest.disconnect(self._queue)


def _matches(labels: dict[str, str], wanted: dict[str, str]) -> bool:
    """Docker's label filter: ``key=value``, or the key alone when the value is ''."""
    return all(k in labels and (not v or labels[k] == v) for k, v in wanted.items())


class FakeDocker(DockerBackend):
    """Docker in memory; see the module docstring. ``await start()`` before use, like
    :class:`~harombe.security.runtime.docker.DockerManager`.

    Every new container gets ``guest_factory()``, by default a :class:`FakeGuest` running
    ``handler`` (read when the container is created, so a test may swap it in between).
    ``calls`` records the name of every method called, in order."""

    def __init__(
        self,
        *,
        images: Iterable[str] = (DEFAULT_IMAGE,),
        runtimes: Iterable[str] = ("runsc", "runsc-net"),
        handler: RunHandler = echo_handler,
        guest_factory: Callable[[], FakeGuest] | None = None,
    ) -> None:
        self.images: set[str] = set(images)
        self._tagged: dict[str, str] = {}  # tag -> the image it names (they share an id)
        self.runtime_names: set[str] = set(runtimes)
        self.handler = handler
        self.guest_factory = guest_factory
        self.containers: dict[str, FakeContainer] = {}
        self.networks: dict[str, FakeNetwork] = {}
        self.calls: list[str] = []
        self.terminals: list[FakeTerminal] = []  # every exec_interactive, in order
        self._faults: dict[str, list[BaseException]] = {}
        self._started = False
        self._serial = itertools.count(1)

    # Fault injection.
    def fail(self, method: str, error: BaseException, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error`` (before doing anything)."""
        if not callable(getattr(DockerBackend, method, None)):
            raise UsageError(f"{method!r} is not a DockerBackend method")
        self._faults.setdefault(method, []).extend([error] * times)

    def away(self, *methods: str, times: int = 1) -> None:
        """Docker is unreachable for the next ``times`` calls of each of ``methods``."""
        for method in methods:
            self.fail(method, DockerUnavailableError("cannot reach the Docker daemon (fake)"),
                      times=times)  # fmt: skip

    def kill(self, container_id: str, *, exit_code: int = 137, oom: bool = False) -> None:
        """Stop a container as if killed from outside (``oom``: by the kernel's OOM killer):
        its guest stops, its stdio ends, its state says exited with ``exit_code``."""
        box = self._container(container_id)
        box.guest.stop()
        box.status, box.exit_code, box.oom_killed = "exited", exit_code, oom

    def pause(self, container_id: str) -> None:
        """``docker pause``: the guest answers nothing until :meth:`unpause`."""
        box = self._container(container_id)
        box.guest.pause()
        box.status = "paused"

    def unpause(self, container_id: str) -> None:
        box = self._container(container_id)
        box.guest.unpause()
        box.status = "running"

    def guest(self, container_id: str) -> FakeGuest:
        """The guest of a container (its files, the requests it got, its handler)."""
        return self._container(container_id).guest

    def labelled(self, labels: dict[str, str]) -> list[FakeContainer]:
        """The containers carrying all of ``labels`` (no call recorded, no fault)."""
        return [c for c in self.containers.values() if _matches(c.labels, labels)]

    def _container(self, container_id: str) -> FakeContainer:
        box = self.containers.get(container_id)
        if box is None:
            raise SandboxLostError(f"the container is gone: no such container {container_id}")
        return box

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        faults = self._faults.get(method)
        if faults:
            raise faults.pop(0)
        if not self._started:
            raise UsageError("Docker manager not started: await docker_manager.start() first")

    # DockerBackend.
    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        self.calls.append("start")
        faults = self._faults.get("start")
        if faults:
            raise faults.pop(0)
        self._started = True

    async def stop(self) -> None:
        self.calls.append("stop")
        self._started = False

    async def runtimes(self) -> dict[str, Any]:
        self._enter("runtimes")
        return {name: {"path": name} for name in sorted(self.runtime_names)}

    async def image_id(self, name: str) -> str:
        self._enter("image_id")
        if name not in self.images:
            raise ImageNotFoundError(
                f"sandbox image not found locally while looking up image {name}: no such image"
            )
        return self._id_of(name)

    def _id_of(self, name: str) -> str:
        while name in self._tagged:
            name = self._tagged[name]
        return f"sha256:{_id('image', name)}"

    async def image_exists(self, name: str) -> bool:
        self._enter("image_exists")
        return name in self.images

    async def tag_image(self, image: str, repository: str, tag: str) -> None:
        self._enter("tag_image")
        source = next((n for n in self.images if image in (n, self._id_of(n))), None)
        if source is None:
            raise ImageNotFoundError(f"sandbox image not found locally: {image}")
        target = f"{repository}:{tag}"
        if target != source:  # a tag is another name for the same image
            self.images.add(target)
            self._tagged[target] = source

    async def import_image(
        self, archive: Path, *, repository: str, tag: str, changes: Sequence[str] = ()
    ) -> str:
        self._enter("import_image")
        if not archive.is_file():  # noqa: ASYNC240 - a fake: one stat, no thread needed
            raise BuildError(f"no image archive at {archive}; make the root filesystem first")
        name = f"{repository}:{tag}"
        self._tagged.pop(name, None)  # an import makes a new image under the name
        self.images.add(name)
        return f"sha256:{_id('image', name)}"

    async def create_container(self, **spec: Any) -> str:
        self._enter("create_container")
        image, name = str(spec.get("image")), str(spec.get("name") or "")
        runtime = spec.get("runtime")
        if runtime and runtime not in self.runtime_names:
            raise RuntimeNotAvailableError(f"the {runtime!r} runtime is not registered")
        if image not in self.images:
            raise ImageNotFoundError(f"sandbox image not found locally: {image}")
        if name and any(c.name == name for c in self.containers.values()):
            raise DockerUnavailableError(
                f"Docker call failed while creating container {name}: Conflict. The "
                f"container name {name!r} is already in use"
            )
        serial = next(self._serial)
        container_id = _id("container", serial, name)
        guest = self.guest_factory() if self.guest_factory is not None else FakeGuest(self.handler)
        self.containers[container_id] = FakeContainer(
            id=container_id, name=name or f"fake-{serial}", image=image,
            labels=dict(spec.get("labels") or {}), spec=dict(spec), guest=guest,
            pid=PID_MAX_LIMIT + serial,
        )  # fmt: skip
        return container_id

    async def attach(self, container_id: str) -> FakeStdio:
        self._enter("attach")
        return FakeStdio(self._container(container_id))

    async def start_container(self, container_id: str) -> None:
        self._enter("start_container")
        box = self._container(container_id)
        if box.status != "created":
            return
        mode = str(box.spec.get("network_mode") or "none")
        network = next((n for n in self.networks.values() if mode in (n.name, n.id)), None)
        if network is None and mode not in ("none", "host", "bridge", "default"):
            raise SandboxStartError(f"Docker could not start it: network {mode} not found")
        box.status = "running"
        if network is not None:
            box.addresses[network.name] = network.gateway.rsplit(".", 1)[0] + ".2"
        box.guest.start()

    async def remove_container(self, container_id: str) -> None:
        self._enter("remove_container")
        box = self.containers.pop(container_id, None)
        if box is not None:
            box.guest.stop()
            await asyncio.sleep(0)  # a removal is a round trip to the daemon

    async def container_state(self, container_id: str) -> dict[str, Any]:
        self._enter("container_state")
        return self._container(container_id).state()

    async def container_address(self, container_id: str, network: str) -> str:
        self._enter("container_address")
        return self._container(container_id).addresses.get(network, "")

    async def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        self._enter("list_containers")
        return [
            ContainerInfo(id=c.id, name=c.name, status=c.status, labels=dict(c.labels))
            for c in self.labelled(labels)
        ]

    async def exec_interactive(
        self, container_id: str, cmd: Sequence[str], *, user: str, env: Mapping[str, str],
        workdir: str, size: tuple[int, int],
    ) -> FakeTerminal:  # fmt: skip
        """A :class:`~harombe.testing.terminal.FakeTerminal` (an echo, not a shell)."""
        self._enter("exec_interactive")
        if self._container(container_id).status != "running":
            raise SandboxLostError(f"the sandbox is not running: container {container_id[:12]}")
        terminal = FakeTerminal(
            _id("exec", len(self.terminals), container_id), container_id=container_id, cmd=cmd,
            user=user, env=env, workdir=workdir, size=size,
        )  # fmt: skip
        self.terminals.append(terminal)
        return terminal

    async def create_network(self, name: str, *, labels: dict[str, str]) -> tuple[str, str]:
        self._enter("create_network")
        serial = next(self._serial)
        network_id = _id("network", serial, name)
        gateway = f"172.{16 + serial // 256 % 16}.{serial % 256}.1"
        self.networks[network_id] = FakeNetwork(
            network_id, name, dict(labels), gateway, f"br-{network_id[:12]}"
        )
        return network_id, gateway

    async def network_bridge(self, network_id: str) -> str:
        self._enter("network_bridge")
        network = self.networks.get(network_id)
        if network is None:
            raise SandboxLostError(f"the network is gone: no such network {network_id}")
        return network.bridge

    async def list_networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        self._enter("list_networks")
        found = [n for n in self.networks.values() if _matches(n.labels, labels)]
        return [(n.id, dict(n.labels)) for n in found]

    async def remove_network(self, network_id: str) -> None:
        self._enter("remove_network")
        network = self.networks.get(network_id)
        if network is None:
            return
        users = [c.name for c in self.containers.values() if network.name in c.addresses
                 and c.status in ("running", "paused")]  # fmt: skip
        if users:  # as Docker: a network with active endpoints stays
            raise DockerUnavailableError(
                f"Docker call failed while removing network {network_id[:12]}: error while "
                f"removing network: network {network.name} has active endpoints ({users})"
            )
        del self.networks[network_id]

"""The Docker seam as a type: what the runtime needs from Docker, and nothing else.

:class:`~harombe.security.runtime.docker.DockerManager` implements it against a real daemon;
:class:`harombe.testing.FakeDocker` implements it in memory, for fast tests of everything
above it (pool, channel, result mapping, lost-sandbox replacement, ``stop()``). Every method
raises only :mod:`harombe.errors` exceptions: a missing container is
:class:`~harombe.errors.SandboxLostError`, a missing image
:class:`~harombe.errors.ImageNotFoundError`, an unreachable daemon
:class:`~harombe.errors.DockerUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ContainerInfo:
    """What harombe needs to know about a container it finds by label."""

    id: str
    name: str
    status: str
    labels: dict[str, str]
    image: str = ""  # the image name it was created from
    created_s: float = 0.0  # when it was created, seconds since the epoch (0: unknown)


@runtime_checkable
class Stdio(Protocol):
    """The attached stdin/stdout/stderr of one container."""

    async def read(self) -> tuple[int, bytes] | None:
        """Next ``(stream, payload)`` — 1 stdout, 2 stderr; ``None`` at end of stream."""

    async def write(self, data: bytes) -> None:
        """Send to stdin; :class:`~harombe.errors.SandboxLostError` once it is closed."""

    def close(self) -> None: ...


@runtime_checkable
class Terminal(Stdio, Protocol):
    """A process's pseudo-terminal: ``read`` gives ``(1, bytes)`` of what it shows (one raw
    stream, stderr included), ``write`` sends typed bytes (``\\x03`` is Ctrl-C)."""

    exec_id: str

    async def resize(self, *, rows: int, cols: int) -> None:
        """Resize the terminal; its foreground process group gets SIGWINCH."""

    async def exit_code(self) -> int | None:
        """The process's exit status; ``None`` while it runs."""


@runtime_checkable
class DockerBackend(Protocol):
    """Every Docker operation harombe performs. Async; never blocks the event loop."""

    @property
    def started(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def runtimes(self) -> dict[str, Any]:
        """The OCI runtimes registered with the daemon, by name."""

    # Images
    async def image_id(self, name: str) -> str:
        """The local id of image ``name``; ImageNotFoundError when absent."""

    async def image_exists(self, name: str) -> bool: ...

    async def tag_image(self, image: str, repository: str, tag: str) -> None: ...

    async def import_image(
        self, archive: Path, *, repository: str, tag: str, changes: Sequence[str] = ()
    ) -> str:
        """Import a root filesystem tarball as an image (``docker import``); its id."""

    # Containers
    async def create_container(self, **spec: Any) -> str:
        """Create (not start) a container from ``spec`` (Docker SDK names); its id."""

    async def attach(self, container_id: str) -> Stdio:
        """The container's stdio; attach before start so no output is missed."""

    async def start_container(self, container_id: str) -> None: ...

    async def remove_container(self, container_id: str) -> None:
        """Kill and remove; an absent container is not an error; never cut short."""

    async def container_state(self, container_id: str) -> dict[str, Any]:
        """Docker's ``State`` (``Running``, ``Paused``, ``OOMKilled``, ``ExitCode``, ``Pid``…)."""

    async def container_address(self, container_id: str, network: str) -> str:
        """The container's IPv4 address on ``network`` ('' if none)."""

    async def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Every container (running or not) carrying all of ``labels``."""

    # Interactive execs (``harombe shell``)
    async def exec_interactive(
        self,
        container_id: str,
        cmd: Sequence[str],
        *,
        user: str,
        env: Mapping[str, str],
        workdir: str,
        size: tuple[int, int],
    ) -> Terminal:
        """Start ``cmd`` in the running container as ``user`` with exactly ``env``, in
        ``workdir``, on a new pseudo-terminal of ``size`` (rows, columns), stdin attached."""

    # Networks
    async def create_network(self, name: str, *, labels: dict[str, str]) -> tuple[str, str]:
        """An ``--internal`` bridge network; its id and gateway address."""

    async def network_bridge(self, network_id: str) -> str:
        """The host interface name of a bridge network."""

    async def list_networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        """(id, labels) of every network carrying all of ``labels``."""

    async def remove_network(self, network_id: str) -> None:
        """Remove a network; an absent one is not an error."""

"""The one module that talks to Docker: :class:`DockerManager`, the real
:class:`~harombe.security.runtime.backend.DockerBackend`.

SDK calls run in a private thread pool so the event loop never blocks. Every foreign error is
mapped to a :mod:`harombe.errors` exception in one place, :func:`translate`, by its type and
by what the call was about (an image, a container, a network), never by its message text. The
attached stdio of a container and the health check use the daemon's socket directly
(:mod:`.docker_socket`), and so do interactive terminals (:mod:`.docker_exec`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlparse

import docker
import docker.errors
import requests.exceptions
import structlog

from harombe.errors import (
    BuildError,
    DockerUnavailableError,
    HarombeError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxLostError,
    SandboxStartError,
    UsageError,
)
from harombe.security.runtime import docker_exec, docker_socket
from harombe.security.runtime.backend import ContainerInfo, DockerBackend
from harombe.security.runtime.docker_socket import FIX_DAEMON, AttachedStdio
from harombe.security.runtime.tasks import outlast, settle

log = structlog.get_logger(__name__)

T = TypeVar("T")
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
#: How long start() waits for the daemon to accept a connection and answer ``/_ping``.
PING_TIMEOUT_S = 5.0
#: Docker's answer to a removal that another removal of the same container already runs.
CONFLICT = 409
Subject = Literal["image", "container", "network", "daemon"]


def _image_missing(text: str, about: str) -> HarombeError:
    return ImageNotFoundError(
        f"sandbox image not found locally{about}: {text}; build harombe's images with "
        "`python -m harombe images build` or pull/tag the image named in the config"
    )


def _not_found(text: str, about: str, subject: Subject) -> HarombeError:
    if subject == "image":
        return _image_missing(text, about)
    if subject == "daemon":  # a call not about one object: Docker answered, but oddly
        return DockerUnavailableError(f"Docker could not find what was asked{about}: {text}")
    return SandboxLostError(f"the {subject} is gone{about}: {text}")


def _unreachable(text: str, about: str, at: str) -> HarombeError:
    return DockerUnavailableError(
        f"cannot reach the Docker daemon{at}{about}: {text}; {FIX_DAEMON}"
    )


def _too_slow(text: str, about: str, at: str) -> HarombeError:
    return DockerUnavailableError(
        f"the Docker daemon{at} did not answer in time{about}: {text}; it may be hung or "
        f"overloaded: {FIX_DAEMON}"
    )


#: Foreign exception type → harombe error, first match wins (subclasses before their bases).
#: Each entry gets (message text, " while <what>", " at <socket>", subject).
ERROR_TABLE: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...],
                         Callable[[str, str, str, Subject], HarombeError]], ...] = (
    (docker.errors.ImageNotFound, lambda text, about, at, subject: _image_missing(text, about)),
    (docker.errors.NotFound, lambda text, about, at, subject: _not_found(text, about, subject)),
    ((requests.exceptions.ConnectionError, ConnectionError, FileNotFoundError),
     lambda text, about, at, subject: _unreachable(text, about, at)),
    (requests.exceptions.Timeout, lambda text, about, at, subject: _too_slow(text, about, at)),
    ((docker.errors.DockerException, requests.exceptions.RequestException),
     lambda text, about, at, subject: DockerUnavailableError(f"Docker call failed{about}: {text}")),
    ((OSError, EOFError), lambda text, about, at, subject: DockerUnavailableError(
        f"Docker socket error{at}{about}: {text}; {FIX_DAEMON}")),
)  # fmt: skip


def translate(
    exc: BaseException, *, what: str = "", socket: str = "", subject: Subject = "daemon"
) -> HarombeError:
    """Map a Docker SDK / socket error to the harombe error that says how to fix it; an
    exception the table does not know (a bug, not a Docker error) is re-raised unchanged."""
    if isinstance(exc, HarombeError):
        return exc
    about = f" while {what}" if what else ""
    at = f" at {socket}" if socket else ""
    text = str(exc) or repr(exc)
    for types, make in ERROR_TABLE:
        if isinstance(exc, types):
            return make(text, about, at, subject)
    raise exc


@contextlib.contextmanager
def _translated(what: str, socket: str = "", subject: Subject = "daemon") -> Iterator[None]:
    try:
        yield
    except HarombeError:
        raise
    except Exception as exc:
        raise translate(exc, what=what, socket=socket, subject=subject) from exc


def _labels_filter(labels: dict[str, str]) -> dict[str, list[str]]:
    return {"label": [f"{k}={v}" if v else k for k, v in labels.items()]}


class DockerManager(docker_exec.TerminalExecs, DockerBackend):
    """Owns the Docker client. ``await start()`` before use, ``await stop()`` after."""

    def __init__(
        self, base_url: str | None = None, *, timeout_s: float = 120, max_workers: int = 32
    ) -> None:
        self._base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._timeout_s = timeout_s
        self._max_workers = max_workers
        self._client: docker.DockerClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._runtimes: frozenset[str] = frozenset()

    @property
    def started(self) -> bool:
        return self._client is not None

    @property
    def socket_path(self) -> str:
        url = urlparse(self._base_url)
        if url.scheme not in ("unix", "http+unix"):
            raise UsageError(
                f"harombe talks to Docker over its unix socket, not {self._base_url!r}; "
                "set DOCKER_HOST=unix:///path/to/docker.sock"
            )
        return url.path

    async def start(self) -> None:
        """Connect to the daemon and check that it answers (within ``PING_TIMEOUT_S``)."""
        if self._client is not None:
            return
        path = self.socket_path
        await docker_socket.ping(path, timeout_s=PING_TIMEOUT_S)
        self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="harombe-docker")
        try:
            self._client = await self._in_thread(
                lambda: docker.DockerClient(
                    base_url=f"unix://{path}", timeout=int(self._timeout_s)
                ),
                what="connecting",
            )
        except HarombeError:
            await self.stop()
            raise
        log.info("docker.connected", socket=path)

    async def stop(self) -> None:
        client, pool = self._client, self._pool
        self._client, self._pool = None, None
        if client is not None:
            client.close()
        if pool is not None:
            pool.shutdown(wait=False)

    async def _in_thread(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        subject: Subject = "daemon",
        undo: Callable[[T], Awaitable[None]] | None = None,
        always: bool = False,
    ) -> T:
        """Run ``fn`` in the pool. A cancelled caller does not abandon a Docker call that has
        begun: the cancellation propagates once the call has returned, and what it created is
        removed first by ``undo``. With ``always``, a call not yet begun runs too (removals)."""
        pool = self._pool
        if pool is None:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        path = self._base_url

        def guarded() -> T:
            with _translated(what, path, subject):
                return fn()

        job = pool.submit(guarded)
        future = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not always and job.cancel():
                raise  # never began: nothing to wait for or undo
            done = await outlast(future)
            if undo is not None and done is not None:
                with contextlib.suppress(Exception):
                    await settle(undo(done[0]))
            raise

    async def _call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        what: str,
        subject: Subject = "daemon",
        undo: Callable[[T], Awaitable[None]] | None = None,
        always: bool = False,
    ) -> T:
        client = self._client
        if client is None:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        return await self._in_thread(
            functools.partial(fn, client), what=what, subject=subject, undo=undo, always=always
        )

    async def runtimes(self) -> dict[str, Any]:
        info = await self._call(lambda c: c.info(), what="reading daemon info")
        found = dict(info.get("Runtimes") or {})
        self._runtimes = frozenset(found)
        return found

    async def image_id(self, name: str) -> str:
        image = await self._call(
            lambda c: c.images.get(name), what=f"looking up image {name}", subject="image"
        )
        return str(image.id)

    async def image_exists(self, name: str) -> bool:
        try:
            await self.image_id(name)
        except ImageNotFoundError:
            return False
        return True

    async def tag_image(self, image: str, repository: str, tag: str) -> None:
        await self._call(
            lambda c: c.api.tag(image, repository, tag, force=True),
            what=f"tagging {image} as {repository}:{tag}",
            subject="image",
        )

    async def import_image(
        self, archive: Path, *, repository: str, tag: str, changes: Sequence[str] = ()
    ) -> str:
        def load(c: docker.DockerClient) -> str:
            if not archive.is_file():  # the SDK would hand the daemon a missing path as a URL
                raise BuildError(f"no image archive at {archive}; make the root filesystem first")
            # From the path: sent with its length (a stream goes chunked, which dockerd refuses)
            c.api.import_image_from_file(
                str(archive), repository=repository, tag=tag, changes=list(changes)
            )
            return str(c.images.get(f"{repository}:{tag}").id)

        return await self._call(load, what=f"importing {archive.name}", subject="image")

    async def create_container(self, **spec: Any) -> str:
        runtime = spec.get("runtime")
        if runtime and runtime not in self._runtimes and runtime not in await self.runtimes():
            raise RuntimeNotAvailableError(
                f"the {runtime!r} runtime is not registered with Docker (registered: "
                f"{', '.join(sorted(self._runtimes)) or 'none'}); register it in "
                "/etc/docker/daemon.json (scripts/setup.sh does) and restart dockerd"
            )
        return await self._call(
            lambda c: str(c.containers.create(**spec).id),
            what=f"creating container {spec.get('name')}",
            subject="image",  # the one thing a create can find missing
            undo=self.remove_container,
        )

    async def create_network(self, name: str, *, labels: dict[str, str]) -> tuple[str, str]:
        def create(c: docker.DockerClient) -> tuple[str, str]:
            network = c.networks.create(name, driver="bridge", internal=True, labels=labels)
            network.reload()
            config = (network.attrs.get("IPAM") or {}).get("Config") or [{}]
            return str(network.id), str(config[0].get("Gateway") or "")

        return await self._call(
            create, what=f"creating network {name}", undo=lambda made: self.remove_network(made[0])
        )

    async def network_bridge(self, network_id: str) -> str:
        data = await self._call(
            lambda c: c.api.inspect_network(network_id),
            what=f"inspecting network {network_id[:12]}",
            subject="network",
        )
        options = data.get("Options") or {}
        return str(options.get("com.docker.network.bridge.name") or f"br-{network_id[:12]}")

    async def list_networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        found = await self._call(
            lambda c: c.api.networks(filters=_labels_filter(labels)), what="listing networks"
        )
        return [(str(n["Id"]), dict(n.get("Labels") or {})) for n in found]

    async def remove_network(self, network_id: str) -> None:
        def remove(c: docker.DockerClient) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                c.api.remove_network(network_id)

        await self._call(remove, what=f"removing network {network_id[:12]}", always=True)

    async def start_container(self, container_id: str) -> None:
        def start(c: docker.DockerClient) -> None:
            try:
                c.api.start(container_id)
            except docker.errors.NotFound as exc:  # the container, or what it needs (a network)
                c.api.inspect_container(container_id)  # NotFound again: the container is gone
                raise SandboxStartError(f"Docker could not start it: {exc}") from None

        await self._call(start, what=f"starting container {container_id[:12]}", subject="container")

    async def remove_container(self, container_id: str) -> None:
        """Kill and remove; a container that is already gone is not an error.

        A paused container is unpaused first: runsc cannot kill a paused sandbox, and Docker
        would report it removed while its sandbox lived on. Runs to its end even if the
        caller is cancelled."""

        def unpause(c: docker.DockerClient) -> None:
            try:
                if (c.api.inspect_container(container_id).get("State") or {}).get("Paused"):
                    c.api.unpause(container_id)
            except docker.errors.APIError as exc:  # gone, or unpaused meanwhile: remove anyway
                if not isinstance(exc, docker.errors.NotFound) and exc.status_code != CONFLICT:
                    raise

        def remove(c: docker.DockerClient) -> None:
            unpause(c)
            try:
                c.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != CONFLICT:  # another removal of it is under way
                    raise

        await self._call(remove, what=f"removing container {container_id[:12]}", always=True)

    async def _inspect(self, container_id: str) -> dict[str, Any]:
        data = await self._call(
            lambda c: c.api.inspect_container(container_id),
            what=f"inspecting container {container_id[:12]}",
            subject="container",
        )
        return dict(data)

    async def container_state(self, container_id: str) -> dict[str, Any]:
        return dict((await self._inspect(container_id)).get("State") or {})

    async def container_address(self, container_id: str, network: str) -> str:
        data = await self._inspect(container_id)
        networks = (data.get("NetworkSettings") or {}).get("Networks") or {}
        return str((networks.get(network) or {}).get("IPAddress") or "")

    async def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        found = await self._call(
            lambda c: c.api.containers(all=True, filters=_labels_filter(labels)),
            what="listing containers",
        )
        return [
            ContainerInfo(
                id=item["Id"],
                name=(item.get("Names") or ["?"])[0].lstrip("/"),
                status=item.get("State", ""),
                labels=dict(item.get("Labels") or {}),
                image=str(item.get("Image") or ""),
                created_s=float(item.get("Created") or 0),
            )
            for item in found
        ]

    async def attach(self, container_id: str) -> AttachedStdio:
        if self._client is None:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        path = self.socket_path
        with _translated(f"attaching to {container_id[:12]}", path, "container"):
            return await docker_socket.attach(
                path, api_version=self._client.api.api_version, container_id=container_id
            )


__all__ = ["AttachedStdio", "ContainerInfo", "DockerManager", "settle", "translate"]

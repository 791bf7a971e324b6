"""The one seam between harombe and Docker.

Every Docker call harombe makes goes through :class:`DockerManager`: SDK calls run in a private
thread pool so the event loop never blocks, and every foreign error is translated to a
:mod:`harombe.errors` exception in :func:`translate` — the only place that knows the Docker SDK's
exception types. The attached stdio of a container (the sandbox supervisor's channel) is the one
call made without the SDK: an HTTP upgrade on the daemon's unix socket, read with asyncio, so a
channel costs one socket and no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import struct
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlparse

import docker
import docker.errors
import requests.exceptions
import structlog

from harombe.errors import (
    DockerUnavailableError,
    HarombeError,
    ImageNotFoundError,
    LimitNotAppliedError,
    RuntimeNotAvailableError,
    SandboxLostError,
    UsageError,
)
from harombe.security.runtime import cgroups

log = structlog.get_logger(__name__)

T = TypeVar("T")
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
FIX_DAEMON = (
    "start dockerd (scripts/setup.sh does, or `sudo systemctl start docker`), or point "
    "DOCKER_HOST at the daemon's socket"
)
#: How long start() waits for the daemon to accept a connection and answer ``/_ping``.
PING_TIMEOUT_S = 5.0
_MUX = struct.Struct(">BxxxI")


def translate(exc: BaseException, *, what: str = "", socket: str = "") -> HarombeError:
    """Map a Docker SDK / socket error to the harombe error that says how to fix it."""
    if isinstance(exc, HarombeError):
        return exc
    about = f" while {what}" if what else ""
    at = f" at {socket}" if socket else ""
    text = str(exc)
    if isinstance(exc, docker.errors.ImageNotFound) or (
        isinstance(exc, docker.errors.NotFound) and "image" in text.lower()
    ):
        return ImageNotFoundError(
            f"sandbox image not found locally{about}: {text}; build harombe's images with "
            "`python -m harombe images build` or pull/tag the image named in the config"
        )
    if isinstance(exc, docker.errors.NotFound):
        return SandboxLostError(f"the container is gone{about}: {text}")
    if isinstance(exc, docker.errors.APIError) and "runtime" in text.lower():
        return RuntimeNotAvailableError(
            f"Docker rejected the runtime{about}: {text}; register it in /etc/docker/daemon.json "
            "(scripts/setup.sh does) and restart dockerd"
        )
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return DockerUnavailableError(
            f"cannot reach the Docker daemon{at}{about}: {text}; {FIX_DAEMON}"
        )
    if isinstance(exc, requests.exceptions.Timeout):
        return DockerUnavailableError(
            f"the Docker daemon{at} did not answer in time{about}: {text}; it may be hung or "
            f"overloaded: {FIX_DAEMON}"
        )
    if isinstance(exc, docker.errors.DockerException | requests.exceptions.RequestException):
        return DockerUnavailableError(f"Docker call failed{about}: {text}")
    if isinstance(exc, OSError | EOFError):
        return DockerUnavailableError(f"Docker socket error{at}{about}: {exc!r}; {FIX_DAEMON}")
    raise exc


@contextlib.contextmanager
def _translated(what: str, socket: str = "") -> Iterator[None]:
    try:
        yield
    except HarombeError:
        raise
    except Exception as exc:
        raise translate(exc, what=what, socket=socket) from exc


async def settle(work: Awaitable[T], *, undo: Callable[[T], Awaitable[object]] | None = None) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then re-raise the
    cancellation — after ``undo(result)`` has removed what the work made, when given. For
    clean-up that must not be cut short, and for steps that create something only they know.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled, not only the caller
                raise
            cancelled = True
            continue
        except BaseException:
            if cancelled:
                raise asyncio.CancelledError from None
            raise
        if cancelled:
            if undo is not None:
                with contextlib.suppress(Exception):
                    await settle(undo(result))
            raise asyncio.CancelledError
        return result


@dataclass(frozen=True)
class ContainerInfo:
    """What harombe needs to know about a container it finds by label."""

    id: str
    name: str
    status: str
    labels: dict[str, str]


class AttachedStdio:
    """The stdin/stdout/stderr of one container, demultiplexed from Docker's stream frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self) -> tuple[int, bytes] | None:
        """Next ``(stream, payload)`` — stream 1 is stdout, 2 stderr; ``None`` at end of stream."""
        try:
            header = await self._reader.readexactly(_MUX.size)
            stream, size = _MUX.unpack(header)
            return stream, await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the container's stdin, waiting while the socket is full."""
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise SandboxLostError(f"the sandbox's stdin is closed: {exc}") from exc

    def close(self) -> None:
        self._writer.close()


class DockerManager:
    """Owns the Docker client. ``await start()`` before use, ``await stop()`` after."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_s: float = 120,
        max_workers: int = 32,
    ) -> None:
        self._base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._timeout_s = timeout_s
        self._max_workers = max_workers
        self._client: docker.DockerClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._cgroup_template: tuple[int, str] | None = None  # see limit_cpu

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
        """Connect to the daemon and check that it answers (within ``PING_TIMEOUT_S``).

        The health check is a raw ``GET /_ping`` on the socket with a short limit, so a missing
        socket, a refused one and one that accepts but never answers each fail in seconds
        with an error naming the socket and the fix, rather than after the SDK's long timeout.
        """
        if self._client is not None:
            return
        path = self.socket_path
        await ping(path, timeout_s=PING_TIMEOUT_S)
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
            with _translated(what, path):
                return fn()

        job = pool.submit(guarded)
        future = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not always and job.cancel():
                raise  # never began: nothing to wait for or undo
            done = await _outlast(future)
            if undo is not None and done is not None:
                with contextlib.suppress(Exception):
                    await settle(undo(done[0]))
            raise

    async def _call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        what: str,
        undo: Callable[[T], Awaitable[None]] | None = None,
        always: bool = False,
    ) -> T:
        client = self._client
        if client is None:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        return await self._in_thread(
            functools.partial(fn, client), what=what, undo=undo, always=always
        )

    async def runtimes(self) -> dict[str, Any]:
        """The OCI runtimes registered with the daemon, by name."""
        info = await self._call(lambda c: c.info(), what="reading daemon info")
        return dict(info.get("Runtimes") or {})

    async def image_id(self, name: str) -> str:
        """The local id of image ``name``; :class:`ImageNotFoundError` if it is not present."""
        image = await self._call(lambda c: c.images.get(name), what=f"looking up image {name}")
        return str(image.id)

    async def create_container(self, **spec: Any) -> str:
        """Create (not start) a container from keyword ``spec`` (Docker SDK names); its id."""
        return await self._call(
            lambda c: str(c.containers.create(**spec).id),
            what=f"creating container {spec.get('name')}",
            undo=self.remove_container,
        )

    async def create_network(self, name: str, *, labels: dict[str, str]) -> tuple[str, str]:
        """Create an ``--internal`` bridge network (no route out); its id and gateway address."""

        def create(c: docker.DockerClient) -> tuple[str, str]:
            network = c.networks.create(name, driver="bridge", internal=True, labels=labels)
            network.reload()
            config = (network.attrs.get("IPAM") or {}).get("Config") or [{}]
            return str(network.id), str(config[0].get("Gateway") or "")

        return await self._call(
            create, what=f"creating network {name}", undo=lambda made: self.remove_network(made[0])
        )

    async def network_bridge(self, network_id: str) -> str:
        """The host interface name of a bridge network (``br-<id12>`` unless named)."""
        data = await self._call(
            lambda c: c.api.inspect_network(network_id),
            what=f"inspecting network {network_id[:12]}",
        )
        options = data.get("Options") or {}
        return str(options.get("com.docker.network.bridge.name") or f"br-{network_id[:12]}")

    async def list_networks(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        """(id, labels) of every network carrying all of ``labels``."""
        filters = {"label": [f"{k}={v}" if v else k for k, v in labels.items()]}
        found = await self._call(lambda c: c.api.networks(filters=filters), what="listing networks")
        return [(str(n["Id"]), dict(n.get("Labels") or {})) for n in found]

    async def remove_network(self, network_id: str) -> None:
        """Remove a network; one that is already gone is not an error."""

        def remove(c: docker.DockerClient) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                c.api.remove_network(network_id)

        await self._call(remove, what=f"removing network {network_id[:12]}", always=True)

    async def start_container(self, container_id: str) -> None:
        await self._call(
            lambda c: c.api.start(container_id), what=f"starting container {container_id[:12]}"
        )

    async def remove_container(self, container_id: str) -> None:
        """Kill and remove; a container that is already gone is not an error.

        A paused container is unpaused first: runsc cannot kill a paused sandbox, and Docker
        would report it removed while its sandbox lived on. Runs to its end even if the
        caller is cancelled."""

        def remove(c: docker.DockerClient) -> None:
            try:
                with contextlib.suppress(docker.errors.NotFound):
                    if (c.api.inspect_container(container_id).get("State") or {}).get("Paused"):
                        c.api.unpause(container_id)
                c.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise

        await self._call(remove, what=f"removing container {container_id[:12]}", always=True)

    async def container_state(self, container_id: str) -> dict[str, Any]:
        """Docker's ``State`` for the container (``OOMKilled``, ``ExitCode``, ``Status``…)."""
        data = await self._call(
            lambda c: c.api.inspect_container(container_id),
            what=f"inspecting container {container_id[:12]}",
        )
        return dict(data.get("State") or {})

    async def container_address(self, container_id: str, network: str) -> str:
        """The IPv4 address a started container has on ``network`` ('' if none)."""
        data = await self._call(
            lambda c: c.api.inspect_container(container_id),
            what=f"inspecting container {container_id[:12]}",
        )
        networks = (data.get("NetworkSettings") or {}).get("Networks") or {}
        return str((networks.get(network) or {}).get("IPAddress") or "")

    async def limit_cpu(self, container_id: str, *, cpu_cores: float) -> None:
        """Set a running container's CPU quota through its host cgroup (see ``cgroups``).

        The cgroup path of the first container is found through its process; later ones
        reuse its pattern (the container id in it swapped), which saves an inspect call on
        every cold start, and fall back to the process when that path does not exist.
        """
        loop = asyncio.get_running_loop()
        template = self._cgroup_template
        try:
            if template is not None:
                version, pattern = template
                try:
                    path = pattern.replace("{id}", container_id)
                    await loop.run_in_executor(
                        self._pool, cgroups.set_cpu_quota, version, path, cpu_cores
                    )
                    return
                except OSError:
                    pass  # another cgroup layout for this one: ask its process
            pid = int((await self.container_state(container_id)).get("Pid") or 0)
            version, path = await loop.run_in_executor(self._pool, cgroups.cgroup_of, pid)
            await loop.run_in_executor(self._pool, cgroups.set_cpu_quota, version, path, cpu_cores)
            if container_id in path:
                self._cgroup_template = (version, path.replace(container_id, "{id}"))
        except (OSError, ValueError) as exc:
            raise LimitNotAppliedError(
                f"could not set the CPU quota of container {container_id[:12]} through its "
                f"cgroup ({exc}); run harombe as root on the Docker host, or it falls back to "
                "Docker's create-time quota"
            ) from exc

    async def cpu_limit(self, container_id: str) -> float | None:
        """The CPU limit of a running container in cores, read from its cgroup."""
        pid = int((await self.container_state(container_id)).get("Pid") or 0)
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, cgroups.read_cpu_quota, pid
        )

    async def cpu_usage_s(self, container_id: str) -> float:
        """CPU seconds a running container has used, from its cgroup (sentry included)."""
        pid = int((await self.container_state(container_id)).get("Pid") or 0)
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, cgroups.read_cpu_usage_s, pid
        )

    async def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Every container (running or not) carrying all of ``labels``."""
        filters = {"label": [f"{k}={v}" if v else k for k, v in labels.items()]}
        found = await self._call(
            lambda c: c.api.containers(all=True, filters=filters), what="listing containers"
        )
        return [
            ContainerInfo(
                id=item["Id"],
                name=(item.get("Names") or ["?"])[0].lstrip("/"),
                status=item.get("State", ""),
                labels=dict(item.get("Labels") or {}),
            )
            for item in found
        ]

    async def attach(self, container_id: str) -> AttachedStdio:
        """Attach to stdin/stdout/stderr; call before start so no output is missed."""
        if self._client is None:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        version = self._client.api.api_version
        path = (
            f"/v{version}/containers/{quote(container_id)}/attach"
            "?stream=1&stdin=1&stdout=1&stderr=1"
        )
        with _translated(f"attaching to {container_id[:12]}", self.socket_path):
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=1 << 22)
            try:
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\n"
                    "Upgrade: tcp\r\nContent-Length: 0\r\n\r\n".encode()
                )
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
            except BaseException:
                writer.close()  # a cancelled or failed attach keeps no socket open
                raise
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status and " 200 " not in status:
            writer.close()
            raise DockerUnavailableError(
                f"Docker refused to attach to {container_id[:12]}: {status}"
            )
        return AttachedStdio(reader, writer)


async def _outlast(future: asyncio.Future[T]) -> tuple[T] | None:
    """Wait for ``future`` through any cancellation; ``(result,)``, or None if it failed."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future})
    if future.cancelled() or future.exception() is not None:  # retrieved: never logged
        return None
    return (future.result(),)


async def ping(path: str, *, timeout_s: float) -> None:
    """``GET /_ping`` on the daemon's socket at ``path``, all of it within ``timeout_s``."""
    fix = (
        "start dockerd (scripts/setup.sh does, or `sudo systemctl start docker`), or set "
        "DOCKER_HOST=unix:///path/to/docker.sock if the daemon listens elsewhere"
    )
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            await writer.drain()
            status = (await reader.readline()).decode("latin-1").strip()
    except FileNotFoundError:
        raise DockerUnavailableError(
            f"no Docker socket at {path}: the daemon is not running there; {fix}"
        ) from None
    except PermissionError:
        raise DockerUnavailableError(
            f"permission denied on the Docker socket {path}; run harombe as root or as a "
            "member of the docker group"
        ) from None
    except TimeoutError:
        raise DockerUnavailableError(
            f"the Docker socket {path} did not answer a ping within {timeout_s:g}s (it accepts "
            f"connections but nothing serves them: dockerd is hung, or another program owns "
            f"the socket); restart dockerd, {fix}"
        ) from None
    except OSError as exc:
        raise DockerUnavailableError(
            f"cannot connect to the Docker socket {path} ({exc.strerror or exc!r}); {fix}"
        ) from None
    finally:
        if writer is not None:
            writer.close()
    if " 200 " not in f"{status} ":
        raise DockerUnavailableError(
            f"the Docker socket {path} answered {status or 'nothing'!r} to a ping, not "
            f"'200 OK'; {fix}"
        )

"""The Docker calls made on the daemon's unix socket directly, without the SDK.

* :func:`ping` — ``GET /_ping`` within a short limit, so a missing, refused or hung socket fails
  in seconds with an error naming the socket and the fix;
* :func:`attach` — the HTTP upgrade that gives a container's stdio, read with asyncio, so a
  sandbox's channel costs one socket and no thread;
* :func:`upgrade` — the HTTP upgrade behind :func:`attach` and :mod:`.docker_exec`'s terminals.
"""

from __future__ import annotations

import asyncio
import struct
from urllib.parse import quote

from harombe.errors import DockerUnavailableError, SandboxLostError

_MUX = struct.Struct(">BxxxI")
FIX_DAEMON = (
    "start dockerd (scripts/setup.sh does, or `sudo systemctl start docker`), or set "
    "DOCKER_HOST=unix:///path/to/docker.sock if the daemon's socket is elsewhere"
)


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


async def upgrade(
    path: str, url: str, *, what: str, body: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``url`` (with JSON ``body``) asking for an upgrade to a raw stream; the open socket
    once Docker switched. A 404 is :class:`SandboxLostError` (``what`` is gone), any other
    refusal, or an answer cut short or without an end to its header (4 MiB),
    :class:`DockerUnavailableError`; socket errors are raised as they are."""
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 22)
    kind = "Content-Type: application/json\r\n" if body else ""
    try:
        writer.write(
            f"POST {url} HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\n"
            f"Upgrade: tcp\r\n{kind}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()  # the daemon hung up mid-answer, or its header never ended
        raise DockerUnavailableError(
            f"Docker gave no readable answer to the upgrade of {what} ({exc!r}); {FIX_DAEMON}"
        ) from None
    except BaseException:
        writer.close()  # a cancelled or failed upgrade keeps no socket open
        raise
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    code = status.split(" ", 2)[1] if status.count(" ") >= 1 else ""
    if code == "404":
        writer.close()
        raise SandboxLostError(f"{what} is gone: {status}")
    if code not in ("101", "200"):
        writer.close()
        raise DockerUnavailableError(f"Docker refused to attach to {what}: {status}")
    return reader, writer


async def attach(path: str, *, api_version: str, container_id: str) -> AttachedStdio:
    """Attach to a container's stdio over the daemon socket at ``path``.

    Raises :class:`OSError` subclasses for the socket (the caller maps them) and
    :class:`DockerUnavailableError` when the daemon refuses the upgrade."""
    url = (
        f"/v{api_version}/containers/{quote(container_id)}/attach"
        "?stream=1&stdin=1&stdout=1&stderr=1"
    )
    return AttachedStdio(*await upgrade(path, url, what=f"the container {container_id[:12]}"))


async def ping(path: str, *, timeout_s: float) -> None:
    """``GET /_ping`` on the daemon's socket at ``path``, all of it within ``timeout_s``."""
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            await writer.drain()
            status = (await reader.readline()).decode("latin-1").strip()
    except FileNotFoundError:
        raise DockerUnavailableError(
            f"no Docker socket at {path}: the daemon is not running there; {FIX_DAEMON}"
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
            f"the socket); restart dockerd, {FIX_DAEMON}"
        ) from None
    except OSError as exc:
        raise DockerUnavailableError(
            f"cannot connect to the Docker socket {path} ({exc.strerror or exc!r}); {FIX_DAEMON}"
        ) from None
    finally:
        if writer is not None:
            writer.close()
    if " 200 " not in f"{status} ":
        raise DockerUnavailableError(
            f"the Docker socket {path} answered {status or 'nothing'!r} to a ping, not "
            f"'200 OK'; {FIX_DAEMON}"
        )

"""An HTTP/HTTPS egress proxy that lets each sandbox reach exactly its allowed domains.

Standard library only (it can run on the host or in a container). Clients are told apart by
their source address, which the caller maps to an :class:`~harombe.security.netpolicy.Allowlist`
through ``policy_for``; the mapping is read on every connection, so a changed allowlist takes
effect on the next one. Two request forms are served:

* ``CONNECT host:port`` (HTTPS and any TLS): checked, resolved, then a byte tunnel. TLS stays
  end to end; the proxy sees the name the client asked for, never the traffic.
* ``GET http://host/path`` (plain HTTP through a proxy): checked, resolved, forwarded in origin
  form with ``Connection: close``.

Names are resolved here, not in the sandbox, and an allowed name that resolves to a loopback,
private or otherwise special address is refused unless ``allow_private`` is set. Every
decision is one audit event: ``egress.allowed`` or ``egress.refused`` with the client, domain,
port and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import structlog

from harombe.security.netpolicy import Allowlist, address_is_public

log = structlog.get_logger(__name__)

MAX_HEADER_BYTES = 65536
Resolver = Callable[[str, int], Awaitable[list[str]]]
PolicyFor = Callable[[str], "tuple[str, Allowlist] | None"]


async def system_resolver(host: str, port: int) -> list[str]:
    """Addresses of ``host`` from this machine's resolver."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class EgressProxy:
    """See the module docstring. ``policy_for(client_ip)`` returns ``(sandbox_id, allowlist)``
    or None for a client that is no sandbox (refused)."""

    def __init__(
        self,
        policy_for: PolicyFor,
        *,
        resolver: Resolver = system_resolver,
        allow_private: bool = False,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.policy_for = policy_for
        self.resolver = resolver
        self.allow_private = allow_private
        self.connect_timeout_s = connect_timeout_s
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; returns the bound address."""
        self._server = await asyncio.start_server(self._handle, host, port)
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = str((writer.get_extra_info("peername") or ("?",))[0])
        sandbox, host, port = None, "?", 0
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_HEADER_BYTES:
                raise Refused(431, "request headers too large")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = [*lines[0].split(" "), "", "", ""][:3]
            if method.upper() == "CONNECT":
                host, _, port_text = target.rpartition(":")
                port = int(port_text) if port_text.isdigit() else 0
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    raise Refused(400, "only absolute http:// URLs and CONNECT are proxied")
                host, port = url.hostname, url.port or 80
            policy = self.policy_for(client)
            if policy is None:
                raise Refused(403, "this address belongs to no network-enabled sandbox")
            sandbox, allowlist = policy
            allowed, why = allowlist.allows(host, port)
            if not allowed:
                raise Refused(403, why)
            upstream_r, upstream_w = await self._open(host.strip("[]"), port)
            log.info("egress.allowed", sandbox_id=sandbox, client=client, domain=host,
                     port=port, reason=why)  # fmt: skip
            if method.upper() == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream_w.write(_origin_form(lines, url))
                await upstream_w.drain()
            await _pipe_both(reader, writer, upstream_r, upstream_w)
        except Refused as exc:
            log.info("egress.refused", sandbox_id=sandbox, client=client, domain=host,
                     port=port, reason=str(exc))  # fmt: skip
            body = f"harombe egress proxy: {exc}\n".encode()
            with contextlib.suppress(ConnectionError):
                writer.write(
                    f"HTTP/1.1 {exc.status} Refused\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            addresses = await asyncio.wait_for(self.resolver(host, port), self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise Refused(502, f"{host} does not resolve ({exc})") from None
        usable = [a for a in addresses if self.allow_private or address_is_public(a)]
        if not usable:
            raise Refused(403, f"{host} resolves only to local or private addresses {addresses}")
        last: Exception | None = None
        for address in usable:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port), self.connect_timeout_s
                )
            except (OSError, TimeoutError) as exc:
                last = exc
        raise Refused(502, f"could not connect to {host}:{port} ({last})")


def _origin_form(lines: list[str], url: object) -> bytes:
    """The request rewritten for the origin server: path-only target, no proxy headers."""
    parts = urlsplit(lines[0].split(" ")[1])
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    method, _, version = lines[0].partition(" ")
    version = version.rsplit(" ", 1)[-1]
    headers = [
        line for line in lines[1:]
        if line and not line.lower().startswith(("proxy-", "connection:"))
    ]  # fmt: skip
    out = [f"{method} {path} {version}", *headers, "Connection: close", "", ""]
    return "\r\n".join(out).encode("latin-1")


async def _pipe_both(
    a_r: asyncio.StreamReader,
    a_w: asyncio.StreamWriter,
    b_r: asyncio.StreamReader,
    b_w: asyncio.StreamWriter,
) -> None:
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.write_eof()

    await asyncio.gather(pump(a_r, b_w), pump(b_r, a_w))
    b_w.close()

"""An HTTP/HTTPS egress proxy that lets one sandbox reach exactly its allowed domains.

Standard library only (it can run on the host or in a container). ``policy_for(client_ip)``
maps the peer address of a connection to ``(sandbox_id, allowlist)``, or None for any address
but the one sandbox the proxy serves: such a client gets 403 before a byte of its request is
read. The mapping is read on every connection, so a changed allowlist takes effect on the next
one. Two request forms are served, one request per connection:

* ``CONNECT host:port`` (HTTPS and any TLS): checked, resolved, then a byte tunnel. TLS stays
  end to end; the proxy sees the name the client asked for, never the traffic (nor the TLS
  SNI, which is therefore not checked against that name).
* ``GET http://host/path`` (plain HTTP through a proxy): parsed strictly
  (:mod:`.egress_http`), checked, resolved, forwarded in origin form with the
  ``Host`` header set to the checked authority and ``Connection: close``; exactly the request's
  body follows, nothing after it (a pipelined second request never reaches the origin).

Names are resolved here, once per connection, and the connection goes to an address that was
checked: an allowed name that resolves to a loopback, private or otherwise special address is
refused unless ``allow_private`` is set. Refusals name the requested host and the reason, never
an address. Every decision is one audit event, ``egress.allowed`` or ``egress.refused``, with
the true client (peer address and port, and the sandbox that address belongs to).

One sandbox cannot starve another: each proxy holds at most ``max_connections`` client
connections and ``max_lookups_in_flight`` name lookups, a request head must
arrive within ``header_timeout_s``, a connection that carries nothing for ``idle_timeout_s``
is closed, and all proxies together stay within a :class:`ConnectionBudget` derived from the
process's file-descriptor limit (:mod:`.egress_resources`, which also holds the resolver
threads every proxy shares).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable

import structlog

from harombe.security.policy.netpolicy import Allowlist, address_is_public, normalize_host
from harombe.security.runtime.egress_http import (
    MAX_HEAD_BYTES,
    BadRequest,
    RequestHead,
    close_writer,
    copy_body,
    parse_head,
    pipe,
)
from harombe.security.runtime.egress_resources import ConnectionBudget, Resolver, system_resolver

log = structlog.get_logger(__name__)

#: Connections one sandbox may hold open through its proxy at once; more are answered 503.
#: Browsers use about 6 per host and package managers up to 16; 64 leaves room for both.
MAX_CONNECTIONS_PER_SANDBOX = 64
#: Name lookups one sandbox may have in flight at once; more wait their turn. A lookup holds
#: its slot until its resolver thread is done, not merely until the proxy stops waiting for
#: it, so one sandbox's slow names hold at most this many of the shared resolver threads.
MAX_LOOKUPS_IN_FLIGHT = 4
#: Seconds a client has to send a whole request head (slow-header attacks).
HEADER_TIMEOUT_S = 10.0
#: Seconds a tunnel or a forwarded request may carry no byte either way before it is closed.
IDLE_TIMEOUT_S = 120.0
#: Seconds to resolve a name, and to connect to one of its addresses.
CONNECT_TIMEOUT_S = 10.0
#: Addresses of one name tried in turn before giving up.
MAX_ADDRESSES_TRIED = 4
#: Refused connections per proxy that may linger (up to :data:`LINGER_S`) to read what the
#: client already sent, so it gets the refusal rather than a reset; past this, they just close.
MAX_LINGERING = 16
LINGER_S = 0.5
#: Refusals one proxy logs one by one per second; past that they are counted and logged as
#: one ``egress.refusals_suppressed`` event, so a flood of refused requests cannot flood the log.
REFUSALS_LOGGED_PER_S = 20

#: ``policy_for(client_ip)`` → ``(sandbox_id, allowlist)`` for the proxy's own sandbox, else None.
PolicyFor = Callable[[str], "tuple[str, Allowlist] | None"]
#: ``identify(client_ip)`` → the sandbox that address belongs to, if any (for the audit only).
Identify = Callable[[str], "str | None"]

_UNSAFE = re.compile(r"[^\x20-\x7e]")


def printable(text: str, limit: int = 253) -> str:
    """``text`` cut to ``limit`` characters of printable ASCII (others become ``?``): what a
    client wrote may go into a log event or a refusal, but never a line break or an escape."""
    return _UNSAFE.sub("?", text[:limit])


async def _dial(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a checked address (a seam for tests that cannot reach public addresses)."""
    return await asyncio.open_connection(address, port)


class Refused(Exception):
    """A decision to refuse: ``str()`` goes to the client (host and reason only), ``detail``
    only to the audit log."""

    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.detail = detail


class EgressProxy:
    """See the module docstring. ``identify(client_ip)`` names the sandbox an address belongs
    to, for the audit of clients that are refused as not this proxy's own."""

    def __init__(
        self,
        policy_for: PolicyFor,
        *,
        identify: Identify | None = None,
        resolver: Resolver = system_resolver,
        allow_private: bool = False,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS_PER_SANDBOX,
        max_lookups_in_flight: int = MAX_LOOKUPS_IN_FLIGHT,
        budget: ConnectionBudget | None = None,
    ) -> None:
        self.policy_for = policy_for
        self.identify = identify or (lambda client: None)
        self.resolver = resolver
        self.allow_private = allow_private
        self.connect_timeout_s = connect_timeout_s
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.budget = budget or ConnectionBudget(1 << 30)
        self.connections = 0
        self._lookup_slots = asyncio.Semaphore(max_lookups_in_flight)
        self._lookups: set[asyncio.Future[list[str]]] = set()
        self._server: asyncio.Server | None = None
        self._over_cap = 0  # refusals for the connection cap not yet logged
        self._over_cap_logged_at = 0.0
        self._refusal_window = 0.0  # start of the current second of refusal logging
        self._refusals_in_window = 0
        self._refusals_suppressed = 0
        self._sandbox_id: str | None = None
        self._lingering = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; returns the bound address."""
        self._server = await asyncio.start_server(
            self._handle, host, port, limit=MAX_HEAD_BYTES, backlog=self.max_connections
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        """Stop listening and end every connection still open (tunnels included)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for lookup in list(self._lookups):
            lookup.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CONNECT_TIMEOUT_S)
        self._flush_suppressed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        peer = writer.get_extra_info("peername") or ("?", 0)
        client_ip = str(peer[0])
        client: dict[str, object] = {"client": client_ip, "client_port": int(peer[1])}
        try:
            policy = self.policy_for(client_ip)
            if policy is None:
                # Not this proxy's sandbox: refused before a byte is read.
                self._refused(client, Refused(403, "this proxy serves another sandbox"),
                              sandbox_id=self.identify(client_ip))  # fmt: skip
                await _reply(writer, 403, "this proxy serves another sandbox")
                await self._linger(reader, writer)
                return
            if self.connections >= self.max_connections or not self.budget.acquire():
                self._refused_over_cap(client, policy[0])
                await _reply(writer, 503, "too many connections from this sandbox; close some")
                await self._linger(reader, writer)
                return
            self.connections += 1
            try:
                await self._serve(reader, writer, client, *policy)
            finally:
                self.connections -= 1
                self.budget.release()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass  # stop() ends the connection; the handler task itself must end cleanly
        finally:
            close_writer(writer)
            with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: dict[str, object],
        sandbox: str,
        allowlist: Allowlist,
    ) -> None:
        host, port = "?", 0
        try:
            try:
                async with asyncio.timeout(self.header_timeout_s):
                    data = await reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise Refused(408, "request head not received in time") from None
            except asyncio.LimitOverrunError:
                raise Refused(431, "request head too large") from None
            except asyncio.IncompleteReadError:
                return  # the client went away
            try:
                head = parse_head(data)
            except BadRequest as exc:
                raise Refused(exc.status, str(exc)) from None
            host, port = head.host, head.port
            allowed, why = allowlist.allows(host, port)
            if not allowed:
                raise Refused(403, why)
            host = normalize_host(host)
            upstream_r, upstream_w = await self._open(host, port)
            log.info("egress.allowed", sandbox_id=sandbox, **client, domain=host, port=port,
                     reason=why)  # fmt: skip
            try:
                if head.connect:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await pipe([(reader, upstream_w), (upstream_r, writer)], self.idle_timeout_s)
                else:
                    upstream_w.write(head.origin_request(host))
                    await upstream_w.drain()
                    await self._forward(head, reader, upstream_r, upstream_w, writer)
            finally:
                close_writer(upstream_w)
        except Refused as exc:
            self._refused(client, exc, sandbox_id=sandbox, domain=printable(host), port=port)
            await _reply(writer, exc.status, str(exc))
            await self._linger(reader, writer)

    async def _forward(
        self,
        head: RequestHead,
        reader: asyncio.StreamReader,
        upstream_r: asyncio.StreamReader,
        upstream_w: asyncio.StreamWriter,
        writer: asyncio.StreamWriter,
    ) -> None:
        """The request's body to the origin while its response comes back (an origin may answer
        ``100 Continue`` or early); nothing the client sends after the body is read."""

        async def send_body() -> None:
            try:
                await copy_body(head, reader, upstream_w, self.idle_timeout_s)
            except (BadRequest, TimeoutError, ConnectionError, OSError):
                # The origin must not act on a truncated body; this also ends the response.
                close_writer(upstream_w)

        body = asyncio.create_task(send_body())
        try:
            await pipe([(upstream_r, writer)], self.idle_timeout_s, busy=lambda: not body.done())
            await body  # an origin that half-closed early may still read the rest
        finally:
            if not body.done():
                body.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await body

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read and drop what the client sent, briefly, before closing: closing a socket with
        unread input resets it, and the client would lose the refusal it was just sent."""
        if self._lingering >= MAX_LINGERING:
            return
        self._lingering += 1
        try:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                while await reader.read(65536):
                    pass
        except (TimeoutError, ConnectionError, OSError, asyncio.LimitOverrunError):
            pass
        finally:
            self._lingering -= 1

    def _refused(self, client: dict[str, object], exc: Refused, **fields: object) -> None:
        """One ``egress.refused`` event, or, past :data:`REFUSALS_LOGGED_PER_S` in a second,
        a count that :meth:`_flush_suppressed` logs as one event."""
        now = time.monotonic()
        if now - self._refusal_window >= 1.0:
            self._flush_suppressed()
            self._refusal_window, self._refusals_in_window = now, 0
        self._sandbox_id = str(fields.get("sandbox_id") or self._sandbox_id or "")
        self._refusals_in_window += 1
        if self._refusals_in_window > REFUSALS_LOGGED_PER_S:
            self._refusals_suppressed += 1
            return
        log.info("egress.refused", **client, **fields, reason=printable(str(exc), 400),
                 **({"detail": printable(exc.detail, 400)} if exc.detail else {}))  # fmt: skip

    def _flush_suppressed(self) -> None:
        if self._refusals_suppressed:
            log.info("egress.refusals_suppressed", sandbox_id=self._sandbox_id,
                     count=self._refusals_suppressed,
                     limit_per_s=REFUSALS_LOGGED_PER_S)  # fmt: skip
            self._refusals_suppressed = 0

    def _refused_over_cap(self, client: dict[str, object], sandbox: str) -> None:
        """Audited at most once a second, with the count since, so a flood of refused
        connections cannot flood the log too."""
        self._over_cap += 1
        now = time.monotonic()
        if now - self._over_cap_logged_at >= 1.0:
            log.info("egress.refused", sandbox_id=sandbox, **client,
                     reason="connection limit reached", limit=self.max_connections,
                     count=self._over_cap)  # fmt: skip
            self._over_cap, self._over_cap_logged_at = 0, now

    async def _resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host``, within ``connect_timeout_s`` (waiting for a slot
        included). A lookup that outlives the wait keeps its slot until it really ends, so a
        sandbox's slow names occupy at most ``max_lookups_in_flight`` resolver threads."""
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._lookup_slots.acquire()
                lookup = asyncio.ensure_future(self.resolver(host, port))
                self._lookups.add(lookup)

                def done(_: object) -> None:
                    self._lookups.discard(lookup)
                    self._lookup_slots.release()

                lookup.add_done_callback(done)
                return await asyncio.shield(lookup)
        except TimeoutError:
            raise Refused(504, f"{host} did not resolve in time",
                          detail=f"timeout_s={self.connect_timeout_s}") from None  # fmt: skip
        except (OSError, ValueError) as exc:  # ValueError: e.g. UnicodeError from the codec
            raise Refused(502, f"{host} does not resolve", detail=str(exc)) from None

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve once and connect to one of the addresses just checked (DNS rebinding
        between check and connect is impossible: there is no second lookup)."""
        addresses = await self._resolve(host, port)
        usable = [a for a in addresses if self.allow_private or address_is_public(a)]
        if not usable:
            raise Refused(403, f"{host} resolves only to local or private addresses",
                          detail=f"addresses={addresses}")  # fmt: skip
        last: Exception | None = None
        for address in usable[:MAX_ADDRESSES_TRIED]:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    return await _dial(address, port)
            except (OSError, TimeoutError) as exc:
                last = exc
        reason = "timed out" if isinstance(last, TimeoutError) else "connection failed"
        raise Refused(502, f"could not connect to {host}:{port} ({reason})", detail=str(last))


async def _reply(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    """A refusal: fixed head, the reason (printable ASCII only) as a plain-text body."""
    body = f"harombe egress proxy: {printable(reason, 400)}\n".encode("ascii")
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(
            f"HTTP/1.1 {status} Refused\r\nContent-Type: text/plain; charset=us-ascii\r\n"
            f"X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()

"""uvicorn's server, with the service told first when a graceful shutdown begins, and HTTP/1.1
connections guarded where uvicorn's h11 protocol is not.

uvicorn stops accepting connections, then waits for the open ones to end before the app's
shutdown runs. An approvals feed (server-sent events) and a call held for approval do not end
by themselves, so :meth:`Server.shutdown` first calls ``on_shutdown`` (the service's
:meth:`~harombe.service.state.Service.begin_shutdown`: feeds closed, held approvals denied).

Every connection is served by :class:`GuardedH11Protocol`: a request head (each one, on a
kept-alive connection too) must be complete within ``header_timeout_s`` (``service.
header_timeout_s``) or the connection is answered 408 and closed, so connections that never
finish a head (slow loris) cannot pile up; and a request with both ``Content-Length`` and
``Transfer-Encoding`` is answered 400 and its connection closed (h11 would let the second win,
and a proxy in front might have read the first: request smuggling).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import h11
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger(__name__)

#: What a connection that did not finish its request head in time is sent before it is closed.
TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 33\r\n\r\nthe request head took too long.\r\n"
)
#: The seconds a request head may take when the server is not told (``service.header_timeout_s``).
DEFAULT_HEADER_TIMEOUT_S = 10.0


class _CheckedConnection(h11.Connection):
    """h11's server side, refusing a request head with both Content-Length and
    Transfer-Encoding, and telling ``on_head`` when a head is complete."""

    on_head: Callable[[], None] = staticmethod(lambda: None)

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name.lower() for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                # uvicorn answers a RemoteProtocolError 400 with "connection: close".
                raise h11.RemoteProtocolError(
                    "a request may not carry both Content-Length and Transfer-Encoding", 400
                )
            self.on_head()
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head timeout and the Content-Length /
    Transfer-Encoding check (see the module docstring). :func:`guarded_protocol` makes one with
    its timeout."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = getattr(self.conn, "_max_incomplete_event_size", 16 * 1024)
        self.conn = _CheckedConnection(h11.SERVER, size)
        self.conn.on_head = self._disarm
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # Armed first: a pipelined head that the call below reads disarms it again.
        self._arm()
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.info("service.request_head_timed_out", timeout_s=self.header_timeout_s)
        self.transport.write(TIMED_OUT)
        self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[GuardedH11Protocol]:
    """:class:`GuardedH11Protocol` with a head timeout of ``header_timeout_s`` seconds."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})


class Server(uvicorn.Server):
    """See the module docstring; ``signals=False`` leaves the process's signal handlers alone
    (a server inside a test). Its connections are served by :class:`GuardedH11Protocol`."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_shutdown: Callable[[], None] | None = None,
        signals: bool = True,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> None:
        config.http = guarded_protocol(header_timeout_s)
        super().__init__(config)
        self._on_shutdown, self._signals = on_shutdown, signals

    async def shutdown(self, sockets: Any = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if not self._signals:
            yield
            return
        with super().capture_signals():
            yield

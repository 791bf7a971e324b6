"""uvicorn's server, with the service told first when a graceful shutdown begins.

uvicorn stops accepting connections, then waits for the open ones to end before the app's
shutdown runs. An approvals feed (server-sent events) and a call held for approval do not end
by themselves, so :meth:`Server.shutdown` first calls ``on_shutdown`` (the service's
:meth:`~harombe.service.state.Service.begin_shutdown`: feeds closed, held approvals denied).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


class Server(uvicorn.Server):
    """See the module docstring; ``signals=False`` leaves the process's signal handlers alone
    (a server inside a test)."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_shutdown: Callable[[], None] | None = None,
        signals: bool = True,
    ) -> None:
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

"""Run a harombe service inside your test's event loop, on a free loopback port.

Example::

    from harombe.service.app import create_app
    from harombe.testing.http import serving

    async def test_my_agent_against_the_service() -> None:
        async with serving(create_app(config)) as base_url:
            ...  # point the agent's SANDBOX_URL at base_url

Leaving the block shuts the service down as SIGTERM would (its sandboxes are removed).

:func:`clients` calls an app in process, without a socket (httpx's ASGI transport): fast
tests of routes, auth and errors, e.g. over :class:`~harombe.testing.FakeDocker`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any


def clients(
    app: Any, *, peer: str = "127.0.0.1", raise_app_exceptions: bool = True
) -> Callable[[str | None], Any]:
    """A factory of ``httpx.AsyncClient`` s that call ``app`` in process, as ``peer`` at
    ``http://127.0.0.1``, each with ``Authorization: Bearer <token>`` when given a token.
    ``raise_app_exceptions=False`` turns an app's crash into the 500 a server would send."""
    import httpx

    transport = httpx.ASGITransport(
        app=app, client=(peer, 50000), raise_app_exceptions=raise_app_exceptions
    )

    def client(token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers)

    return client


@contextlib.asynccontextmanager
async def serving(app: Any, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` (an ASGI app, e.g. :func:`harombe.service.create_app`'s) with uvicorn
    until the block ends; yields its base URL. Raises ``RuntimeError`` when it cannot start."""
    import uvicorn

    from harombe.service.server import Server

    service = getattr(getattr(app, "state", None), "service", None)
    config = getattr(service, "config", None)
    server = Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning"),
        on_shutdown=getattr(service, "begin_shutdown", None),
        signals=False,  # the test runner keeps its own signal handlers
        header_timeout_s=config.service.header_timeout_s if config else 10.0,
    )

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits the process when the app cannot start
            raise RuntimeError(
                f"the service stopped before it started (exit {exc.code}); see its log"
            ) from None

    task = asyncio.ensure_future(serve())
    while not server.started:
        if task.done():
            task.result()  # the start failed: raise its error
            raise RuntimeError("the service stopped before it started; see its log")
        await asyncio.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        await task


async def approved_once(judge: Any, call: Any) -> Any:
    """The answer to the awaitable ``call``, approving it once through the ``/v1`` approvals API
    of ``judge`` (an approver's client, e.g. from :func:`clients`) whenever it is held."""
    task = asyncio.ensure_future(call)
    for _ in range(500):
        if task.done():
            break
        for approval in (await judge.get("/v1/approvals")).json()["approvals"]:
            await judge.post(f"/v1/approvals/{approval['id']}", json={"decision": "approve"})
        await asyncio.sleep(0.01)
    return await task

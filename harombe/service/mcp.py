"""harombe's six tools as an MCP server (the official ``mcp`` SDK's low-level server).

:func:`build_server` makes the server over a :class:`ToolHost` — what runs a call:

* ``tools/list`` offers ``code_execute``, ``code_install_package``, ``code_write_file``,
  ``code_read_file``, ``code_list_files`` and ``code_destroy_sandbox``, each with the JSON
  schema generated from its pydantic model and its description
  (:mod:`harombe.tools.schemas`), exactly as the function-calling formats show them;
* ``tools/call`` goes through :func:`harombe.tools.schemas.dispatch`, so validation, the HITL
  gate and the audit events are those of a library call. The result comes back as JSON text
  plus ``structuredContent``, images as image blocks (:mod:`.mcp_content`); anything a model
  can get wrong is a tool error (``isError``), never a protocol error;
* sandboxes live on between calls: pass the ``sandbox_id`` of a result to keep working in it.
  They end when destroyed or when the server stops (every sandbox is removed then);
* output streams: when the call carries a ``progressToken``, each piece of ``code_execute``'s
  stdout or stderr is sent as it is printed, as ``notifications/progress`` whose ``message``
  is the text (``progress`` counts the notifications: 1, 2, 3, ...);
* approvals: the gate's approver is an :class:`~.mcp_approval.ElicitingApprover`, which asks
  the person at the client through elicitation when the client supports it.

:func:`run_stdio` serves it on stdin/stdout (``harombe mcp``) with its own Docker client and
sandbox manager; :mod:`.mcp_http` mounts it in ``harombe serve`` at ``/mcp``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any, Protocol

import mcp_types as types
import structlog
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from harombe.config import HarombeConfig
from harombe.errors import HarombeError
from harombe.security.approval.gate import gate_from_config
from harombe.security.approval.policy_line import policy_line
from harombe.service.mcp_approval import Asker, ElicitingApprover, can_elicit, current_asker
from harombe.service.mcp_content import error_result, to_call_result
from harombe.service.version import VERSION
from harombe.tools import schemas
from harombe.tools.code_execution import CodeExecutionTools

log = structlog.get_logger(__name__)

NAME = "harombe"
INSTRUCTIONS = (
    "Run Python, JavaScript or shell code in isolated gVisor sandboxes. code_execute without "
    "sandbox_id starts a sandbox; pass the sandbox_id of a result to keep working in it "
    "(files in /workspace, and Python/JavaScript variables, persist). Destroy a sandbox with "
    "code_destroy_sandbox when done. Some calls wait for a person's approval."
)
#: Seconds the output still queued at the end of a call may take to reach the client.
FLUSH_WAIT_S = 5.0


class ToolHost(Protocol):
    """What runs a tool call for the server: ``harombe mcp``'s own tools, or the service's
    (which also checks who is calling)."""

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        on_output: Any,
        request: Any,
    ) -> dict[str, Any]:
        """The tool's result dict; ``request`` is the transport's request (HTTP) or None."""
        ...


class LocalHost:
    """Calls on one :class:`CodeExecutionTools`, for one trusted client (stdio)."""

    def __init__(self, tools: CodeExecutionTools) -> None:
        self.tools = tools

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, *, on_output: Any, request: Any
    ) -> dict[str, Any]:
        return await schemas.dispatch(self.tools, name, arguments, on_output=on_output)


class ProgressRelay:
    """Sends a call's output to the client as progress notifications, in order, from its own
    task: the sandbox's channel never waits on a slow client. Pieces queued together are
    joined (per stream) into one notification."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.sent = 0
        self._queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self._task: asyncio.Task[None] | None = None

    def on_output(self, stream: str, data: bytes | str) -> None:
        """The tools' ``on_output`` callback."""
        decoder = self._decoders.get(stream)
        text = data if isinstance(data, str) or decoder is None else decoder.decode(data)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if text:
            self._queue.put_nowait((stream, text))

    async def __aenter__(self) -> ProgressRelay:
        self._task = asyncio.ensure_future(self._send_all())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._queue.put_nowait(None)
        assert self._task is not None
        try:
            await asyncio.wait_for(self._task, FLUSH_WAIT_S)
        except TimeoutError:
            log.warning("mcp.progress_dropped", queued=self._queue.qsize())

    async def _send_all(self) -> None:
        finished = False
        while not finished:
            item = await self._queue.get()
            pieces: list[tuple[str, str]] = []
            while item is not None:
                pieces.append(item)
                if self._queue.empty():
                    break
                item = self._queue.get_nowait()
            finished = item is None
            for stream, text in _joined(pieces):
                await self._send(stream, text)

    async def _send(self, stream: str, text: str) -> None:
        self.sent += 1
        try:
            await self.session.report_progress(self.sent, None, text)
        except Exception as exc:  # noqa: BLE001 - a client gone mid-call must not fail the run
            log.info("mcp.progress_failed", stream=stream, error=repr(exc))


def _joined(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive pieces of one stream as one."""
    out: list[tuple[str, str]] = []
    for stream, text in pieces:
        if out and out[-1][0] == stream:
            out[-1] = (stream, out[-1][1] + text)
        else:
            out.append((stream, text))
    return out


def tool_list() -> list[types.Tool]:
    """The six tools as MCP ``Tool`` entries."""
    return [
        types.Tool(
            name=name,
            description=schemas.description(name),
            input_schema=schemas.input_schema(name),
            annotations=types.ToolAnnotations(
                read_only_hint=name in ("code_read_file", "code_list_files"),
                destructive_hint=name == "code_destroy_sandbox",
                open_world_hint=name in ("code_execute", "code_install_package"),
            ),
        )
        for name in schemas.TOOL_NAMES
    ]


def _wants_progress(ctx: ServerRequestContext[Any]) -> bool:
    meta = ctx.meta or {}
    return meta.get("progress_token", meta.get("progressToken")) is not None


async def call_tool(
    host: ToolHost, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """One ``tools/call``: approvals asked of this client when it can be asked, output relayed
    as progress when asked for, the result mapped to MCP content."""
    asker = Asker(ctx.session, ctx.request_id) if can_elicit(ctx.session) else None
    token = current_asker.set(asker)
    try:
        if _wants_progress(ctx):
            async with ProgressRelay(ctx.session) as relay:
                result = await host.call(
                    params.name, params.arguments, on_output=relay.on_output, request=ctx.request
                )
        else:
            result = await host.call(params.name, params.arguments, on_output=None,
                                     request=ctx.request)  # fmt: skip
    except HarombeError as err:
        return error_result(err.kind, str(err), params.name)
    except Exception as exc:
        log.exception("mcp.call_failed", tool=params.name)
        return error_result(
            "InternalError",
            f"the call failed unexpectedly ({exc!r}); see the server's log",
            params.name,
        )
    finally:
        current_asker.reset(token)
    return to_call_result(result)


def build_server(host: ToolHost) -> Server[Any]:
    """The MCP server over ``host``; see the module docstring."""

    async def on_list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await call_tool(host, ctx, params)

    server: Server[Any] = Server(
        NAME,
        version=VERSION,
        instructions=INSTRUCTIONS,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
    return server


async def serve_stdio(config: HarombeConfig) -> None:
    """Serve the tools over this process's stdin/stdout until the client closes them, or
    SIGTERM/SIGINT; every sandbox made is removed at the end. After a signal the process
    exits once the sandboxes are gone (a thread blocked reading stdin cannot be woken)."""
    from harombe.security.runtime.docker import DockerManager
    from harombe.security.runtime.manager import SandboxManager

    gate = gate_from_config(config, surface_approver=ElicitingApprover())
    # stdout carries the protocol: the policy line goes to stderr, as the logs do.
    print(policy_line(gate, "mcp"), file=sys.stderr, flush=True)
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager=docker_manager, config=config)
    signalled = asyncio.Event()
    try:
        await manager.start()
        server = build_server(LocalHost(CodeExecutionTools(manager, gate)))
        log.info("mcp.started", transport="stdio", hitl=gate is not None)
        with _on_signals(signalled.set):
            serving = asyncio.ensure_future(_serve(server))
            waiting = asyncio.ensure_future(signalled.wait())
            await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
    finally:
        await manager.stop()
        await docker_manager.stop()
        log.info("mcp.stopped", transport="stdio", signalled=signalled.is_set())
    if signalled.is_set():
        sys.stderr.flush()
        os._exit(0)
    serving.result()


async def _serve(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


@contextlib.contextmanager
def _on_signals(handler: Any) -> Any:
    """Call ``handler`` on SIGTERM and SIGINT while the block runs."""
    loop = asyncio.get_running_loop()
    handled = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, handler)
            handled.append(signum)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def run_stdio(config_path: str | None = None) -> int:
    """``harombe mcp``: load the config (a :class:`~harombe.errors.ConfigError` is raised),
    serve on stdio, and return the exit code: 0, or 1 with the reason on stderr when it
    cannot start. Log events go to stderr only: stdout carries the protocol."""
    from harombe.config import load_config

    config = load_config(config_path)
    try:
        asyncio.run(serve_stdio(config))
    except HarombeError as err:
        print(f"harombe mcp: {err.kind}: {err}", file=sys.stderr)
        return 1
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    return 0

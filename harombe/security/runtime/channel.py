"""Host side of the supervisor protocol: framed requests over a container's attached stdio.

One :class:`Channel` per sandbox. A background task reads the stream, routes replies to the
request that is waiting for them (by ``id``) and streaming chunks to their callback. When the
stream ends — the container died, was removed, or the supervisor crashed — every waiting
request fails with :class:`~harombe.errors.SandboxLostError`, and so does every later one.

The stream comes from inside a sandbox, so nothing in it is trusted: every frame's lengths are
checked against caps before its body is buffered (``max_json_bytes``, ``max_blob_bytes``, and
the same cap on the streamed output of one request), and a frame out of bounds or not a JSON
object ends the channel like a crash: the sandbox is lost and replaced, never trusted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from harombe.errors import SandboxLostError, SandboxStartError
from harombe.security.guest.wire import (
    MAX_ARTIFACT_BYTES,
    MAX_BLOB_BYTES,
    MAX_JSON_BYTES,
    FrameDecoder,
    ProtocolError,
    encode,
)
from harombe.security.runtime.backend import Stdio

log = structlog.get_logger(__name__)

STDERR_TAIL_BYTES = 4096
#: Room past the largest legitimate blob (file contents, or both output streams of a run).
BLOB_SLACK_BYTES = 1024 * 1024
DEFAULT_MAX_BLOB_BYTES = MAX_BLOB_BYTES  # the codec's default: 64 MiB and the slack
# How long a cancelled run may take to stop (SIGTERM or SIGINT, then SIGKILL after the grace).
CANCEL_WAIT_S = 10.0
OutputCallback = Callable[[str, bytes], Awaitable[None] | None]
Reply = tuple[dict[str, Any], bytes]


def blob_cap_bytes(max_file_bytes: int, max_output_bytes: int) -> int:
    """The largest blob a sandbox with these limits can legitimately send in one frame: a
    file, or both output streams of a run and the images it displayed."""
    return max(max_file_bytes, 2 * max_output_bytes + MAX_ARTIFACT_BYTES) + BLOB_SLACK_BYTES


class Channel:
    """Request/response over one sandbox's stdio. Not safe for two concurrent runs."""

    def __init__(
        self,
        stdio: Stdio,
        *,
        sandbox_id: str,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        max_json_bytes: int = MAX_JSON_BYTES,
    ) -> None:
        self._stdio = stdio
        self._sandbox_id = sandbox_id
        self._max_blob_bytes = max_blob_bytes
        self._max_json_bytes = max_json_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._streams: dict[int, OutputCallback] = {}
        self._streamed: dict[int, int] = {}  # bytes of output streamed so far, per request
        self._hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._stderr_tail = b""
        self._lost: str | None = None
        self._reader = asyncio.create_task(self._read_loop(), name=f"channel-{sandbox_id}")

    @property
    def lost(self) -> str | None:
        """Why the channel ended, or ``None`` while it is alive."""
        return self._lost

    @property
    def stderr_tail(self) -> str:
        """The last bytes the supervisor wrote to stderr (crash diagnostics)."""
        return self._stderr_tail.decode("utf-8", "replace")

    async def hello(self, *, timeout_s: float) -> dict[str, Any]:
        """Wait for the supervisor's greeting: its versions and interpreters."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._hello), timeout_s)
        except TimeoutError:
            raise SandboxStartError(
                f"sandbox {self._sandbox_id} did not answer within {timeout_s:.0f}s; "
                f"supervisor stderr: {self.stderr_tail or '(empty)'}"
            ) from None
        except SandboxLostError as exc:
            raise SandboxStartError(
                f"sandbox {self._sandbox_id} exited while starting ({exc}); does its image have "
                "python3 (>= 3.8) on PATH? harombe's supervisor needs it"
            ) from None

    async def request(
        self,
        msg: dict[str, Any],
        blob: bytes = b"",
        *,
        timeout_s: float,
        on_output: OutputCallback | None = None,
    ) -> Reply:
        """Send ``msg`` and wait for the reply with the same id (``done`` or ``result``)."""
        if self._lost:
            raise SandboxLostError(self._lost)
        rid = next(self._ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        if on_output is not None:
            self._streams[rid] = on_output
        try:
            await self._stdio.write(encode({**msg, "id": rid}, blob))
            # shield: if the caller is cancelled, the reply must still be awaitable below.
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self._fail(
                f"sandbox {self._sandbox_id} stopped answering (no reply in {timeout_s:.0f}s)"
            )
            raise SandboxLostError(self._lost or "sandbox stopped answering") from None
        except asyncio.CancelledError:
            # The caller gave up: stop the run too, and wait (briefly) until it has stopped, so
            # the sandbox is idle again when the caller's lock is released.
            if msg.get("op") == "run" and not self._lost:
                with contextlib.suppress(Exception):
                    await self._stdio.write(encode({"op": "cancel", "target": rid, "id": 0}))
                    await asyncio.wait_for(asyncio.shield(future), CANCEL_WAIT_S)
            raise
        finally:
            self._pending.pop(rid, None)
            self._streams.pop(rid, None)
            self._streamed.pop(rid, None)

    async def _read_loop(self) -> None:
        decoder = FrameDecoder(
            max_json_bytes=self._max_json_bytes, max_blob_bytes=self._max_blob_bytes
        )
        reason = f"sandbox {self._sandbox_id} ended: the container stopped"
        try:
            while (item := await self._stdio.read()) is not None:
                stream, data = item
                if stream == 2:
                    self._stderr_tail = (self._stderr_tail + data)[-STDERR_TAIL_BYTES:]
                    continue
                for msg, blob in decoder.feed(data):
                    await self._dispatch(msg, blob)
        except ProtocolError as exc:
            reason = f"sandbox {self._sandbox_id} broke the protocol: it sent {exc}"
            log.warning("channel.protocol_violated", sandbox_id=self._sandbox_id, reason=str(exc))
        except Exception as exc:  # noqa: BLE001 - any failure here means the channel is gone
            reason = f"sandbox {self._sandbox_id} channel failed: {exc!r}"
        self._fail(reason)

    async def _dispatch(self, msg: dict[str, Any], blob: bytes) -> None:
        op, rid = msg.get("op"), msg.get("id")
        if op == "hello":
            if not self._hello.done():
                self._hello.set_result(msg)
            return
        if op == "out":
            callback = self._streams.get(rid) if isinstance(rid, int) else None
            if callback is not None and isinstance(rid, int):
                total = self._streamed.get(rid, 0) + len(blob)
                if total > self._max_blob_bytes:
                    raise ProtocolError(f"{total} bytes of streamed output for one run")
                self._streamed[rid] = total
                maybe = callback(str(msg.get("stream")), blob)
                if maybe is not None:
                    await maybe
            return
        future = self._pending.get(rid) if isinstance(rid, int) else None
        if future is not None and not future.done():
            future.set_result((msg, blob))

    def _fail(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = reason
        if self.stderr_tail:
            reason = f"{reason}; supervisor stderr: {self.stderr_tail.strip()[-500:]}"
            self._lost = reason
        log.debug("channel.closed", sandbox_id=self._sandbox_id, reason=reason)
        error = SandboxLostError(reason)
        if not self._hello.done():
            self._hello.set_exception(error)
            self._hello.exception()  # mark retrieved: nobody may be waiting
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
                # Marked retrieved: a request that timed out has stopped waiting for it (its
                # shield was cancelled), and asyncio would log the exception as never retrieved.
                future.exception()
        self._stdio.close()

    async def close(self) -> None:
        self._fail(f"sandbox {self._sandbox_id} was closed")
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader

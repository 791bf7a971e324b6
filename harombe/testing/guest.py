"""FakeGuest: the sandbox supervisor's side of the wire protocol, in memory.

It reads the host's frames with the shared codec (:mod:`harombe.security.guest.wire`) and
answers them as the supervisor does, with the same ``op``, the request's ``id`` and the same
fields: ``hello`` once it starts, ``result`` for ``ping``, ``warm``, ``cancel`` and the file
operations (``write``, ``read``, ``list``, ``untar``, on a :class:`FakeWorkspace`), and
``done`` for ``run``, whose outcome a handler computes (:mod:`harombe.testing.echo`).
Output is capped at the request's ``max_output_bytes`` per stream and streamed as ``out``
frames when the request asks for it. A run that outlasts its ``timeout_s`` ends as
``timeout``; ``cancel`` ends it as ``cancelled``; a second run while one is active is refused
as ``Busy``, like the supervisor's.

Tests steer it from outside: :meth:`FakeGuest.pause` holds every frame both ways (a paused
container answers nothing), :meth:`FakeGuest.stop` ends its output (the container exited),
:meth:`FakeGuest.send_raw` writes any bytes (a broken or oversized frame, stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from typing import Any

from harombe.security.guest.wire import FrameDecoder, encode
from harombe.testing.echo import RunHandler, RunOutcome, echo_handler
from harombe.testing.workspace import FakeWorkspace, Refused

__all__ = ["FakeGuest", "Output"]

#: One item of a container's attached output: ``(stream, bytes)``, 1 stdout, 2 stderr;
#: ``None`` when the output has ended.
Output = tuple[int, bytes] | None
#: Exit code of a run the supervisor ended with SIGTERM (timeout, cancel).
TERMINATED = 128 + 15
FILE_OPS = ("write", "read", "list", "untar")


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)


class FakeGuest:
    """One sandbox's supervisor, in memory; see the module docstring.

    ``handler`` computes every run's outcome (replace it at any time); ``greet=False`` keeps
    the greeting back until :meth:`greet` (a supervisor that never answers); ``interpreters``
    names the programs the image has. ``requests`` records every request received, ``files``
    and ``dirs`` are the workspace, ``warmed`` the languages whose session interpreter was
    started."""

    def __init__(
        self,
        handler: RunHandler = echo_handler,
        *,
        greet: bool = True,
        interpreters: tuple[str, ...] = ("python3", "node", "bash"),
        python: str = "3.11.2",
        machine: str = "x86_64",
        libc: tuple[str, str] = ("glibc", "2.36"),
    ) -> None:
        self.handler = handler
        self.auto_greet = greet
        self.info: dict[str, Any] = {
            "op": "hello", "protocol": 1, "pid": 1, "uid": 0, "run_as": [1000, 1000],
            "python": python, "machine": machine, "libc": list(libc),
            "interpreters": {name: f"/usr/bin/{name}" if name in interpreters else None
                             for name in ("python3", "node", "bash")},
        }  # fmt: skip
        self.workspace = FakeWorkspace()
        self.requests: list[dict[str, Any]] = []
        self.warmed: set[str] = set()
        self.running = False
        self.ended = False
        self.paused = False
        self._decoder = FrameDecoder(max_json_bytes=None, max_blob_bytes=None)  # the host
        self._pending_in = bytearray()  # sent before start, or while paused
        self._held: list[tuple[int, bytes]] = []  # output held while paused
        self._outputs: list[asyncio.Queue[Output]] = []
        self._run: tuple[int, asyncio.Task[None]] | None = None
        self._cancelled: set[int] = set()

    @property
    def files(self) -> dict[str, bytes]:
        """The workspace's files by absolute path (``/workspace/a.txt``); writable."""
        return self.workspace.files

    @property
    def dirs(self) -> set[str]:
        return self.workspace.dirs

    # The container's side: attach, start, stop, pause.
    def connect(self) -> asyncio.Queue[Output]:
        """A new queue that gets everything this guest writes from now on (one per attach)."""
        queue: asyncio.Queue[Output] = asyncio.Queue()
        if self.ended:
            queue.put_nowait(None)
        else:
            self._outputs.append(queue)
        return queue

    def disconnect(self, queue: asyncio.Queue[Output]) -> None:
        with contextlib.suppress(ValueError):
            self._outputs.remove(queue)
        queue.put_nowait(None)

    def start(self) -> None:
        """The container started: greet (unless told not to) and serve what was sent."""
        if self.running or self.ended:
            return
        self.running = True
        if self.auto_greet:
            self.greet()
        self._serve_pending()

    def greet(self) -> None:
        """Send the ``hello`` the supervisor sends when it starts."""
        self.send(dict(self.info))

    def stop(self) -> None:
        """The container stopped: a run in progress is abandoned and the output ends."""
        self.running, self.ended = False, True
        if self._run is not None:
            self._run[1].cancel()
            self._run = None
        self._held.clear()
        for queue in self._outputs:
            queue.put_nowait(None)
        self._outputs.clear()

    def pause(self) -> None:
        """Answer nothing until :meth:`unpause`: requests and replies are held."""
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        held, self._held = self._held, []
        for item in held:
            self._emit(item)
        self._serve_pending()

    # The wire.
    def receive(self, data: bytes) -> None:
        """Bytes the host wrote to the container's stdin."""
        self._pending_in += data
        self._serve_pending()

    def send(self, msg: dict[str, Any], blob: bytes = b"") -> None:
        """Write one frame to the host (held while paused, dropped once stopped)."""
        self._emit((1, encode(msg, blob)))

    def send_raw(self, data: bytes, *, stream: int = 1) -> None:
        """Write any bytes to the host's stdout (1) or stderr (2) stream."""
        self._emit((stream, bytes(data)))

    def _emit(self, item: tuple[int, bytes]) -> None:
        if self.ended:
            return
        if self.paused:
            self._held.append(item)
            return
        for queue in self._outputs:
            queue.put_nowait(item)

    def _serve_pending(self) -> None:
        if not self.running or self.paused or not self._pending_in:
            return
        data, self._pending_in = bytes(self._pending_in), bytearray()
        for msg, blob in self._decoder.feed(data):
            self.requests.append(msg)
            self._handle(msg, blob)

    def _reply(self, rid: object, **fields: Any) -> None:
        self.send({"op": "result", "id": rid, "ok": True, **fields})

    def _fail(self, rid: object, kind: str, message: str) -> None:
        self.send({"op": "result", "id": rid, "ok": False, "error": kind, "message": message})

    def _handle(self, msg: dict[str, Any], blob: bytes) -> None:
        op, rid = msg.get("op"), msg.get("id")
        if op == "run":
            if self._run is not None:
                self._fail(rid, "Busy", "a run is active")
                return
            run_id = int(str(rid))
            task = asyncio.get_running_loop().create_task(
                self._serve_run(run_id, msg, blob), name=f"fake-guest-run-{rid}"
            )
            task.add_done_callback(lambda t: self._cancelled_early(t, run_id, msg))
            self._run = (run_id, task)
        elif op == "cancel":
            if self._run is not None and self._run[0] == msg.get("target"):
                self._cancelled.add(self._run[0])
                self._run[1].cancel()
            self._reply(rid)
        elif op in ("ping", "warm"):
            if op == "warm":
                self.warmed.add(str(msg.get("language")))
            self._reply(rid)
        elif op in FILE_OPS:
            try:
                fields, data = self.workspace.handle(str(op), msg, blob)
            except Refused as exc:
                self._fail(rid, exc.kind, str(exc))
            else:
                self.send({**fields, "op": "result", "id": rid, "ok": True}, data)
        else:
            self._fail(rid, "UnknownOp", repr(op))

    # Runs.
    async def _serve_run(self, rid: int, msg: dict[str, Any], stdin: bytes) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(float(msg.get("timeout_s", 30))):
                outcome = await self._outcome(msg, stdin)
        except TimeoutError:
            outcome = RunOutcome(exit_code=TERMINATED, status="timeout")
        except asyncio.CancelledError:
            if rid not in self._cancelled:
                raise  # the container stopped: nobody is left to answer
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            outcome = RunOutcome(exit_code=TERMINATED, status="cancelled")
        except Exception as exc:  # noqa: BLE001 - a broken handler shows in the run's stderr
            outcome = RunOutcome(stderr=f"FakeGuest handler raised {exc!r}\n", exit_code=1)
        self._cancelled.discard(rid)
        if self._run is not None and self._run[0] == rid:
            self._run = None
        self._report(rid, msg, outcome, time.monotonic() - started)

    def _cancelled_early(self, task: asyncio.Task[None], rid: int, msg: dict[str, Any]) -> None:
        """A run cancelled before its task began never ran its body: report it here, as the
        supervisor would."""
        if task.cancelled() and rid in self._cancelled:
            self._cancelled.discard(rid)
            if self._run is not None and self._run[0] == rid:
                self._run = None
            self._report(rid, msg, RunOutcome(exit_code=TERMINATED, status="cancelled"), 0.0)

    async def _outcome(self, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        outcome = self.handler(msg, stdin)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        assert isinstance(outcome, RunOutcome), f"a run handler returned {outcome!r}"
        return outcome

    def _report(self, rid: int, msg: dict[str, Any], outcome: RunOutcome, took_s: float) -> None:
        """Stream the output if asked, then send ``done`` as the supervisor's ``send_done``."""
        cap = int(msg.get("max_output_bytes", 1 << 20))
        out, err = _bytes(outcome.stdout), _bytes(outcome.stderr)
        kept_out, kept_err = out[:cap], err[:cap]
        if msg.get("stream"):
            for name, data in (("stdout", kept_out), ("stderr", kept_err)):
                for chunk in data.splitlines(keepends=True):
                    self.send({"op": "out", "id": rid, "stream": name}, chunk)
        exit_code = outcome.exit_code
        reply: dict[str, Any] = {
            "op": "done", "id": rid,
            "status": outcome.status or ("ok" if exit_code == 0 else "error"),
            "exit_code": exit_code, "signal": exit_code - 128 if exit_code > 128 else None,
            "stdout_len": len(kept_out), "stderr_len": len(kept_err),
            "stdout_total": len(out), "stderr_total": len(err),
            "duration_s": round(took_s, 6), "cpu_s": outcome.cpu_s,
            "peak_memory_mb": outcome.peak_memory_mb,
        }  # fmt: skip
        if msg.get("session"):
            reply.update(result=outcome.result, state_lost=outcome.state_lost, session=True)
        if outcome.warnings:
            reply["warnings"] = list(outcome.warnings)
        self.send(reply, kept_out + kept_err)

"""Running code in a sandbox: the run request, its result, and what happens when a sandbox dies.

A mixin of :class:`~harombe.security.runtime.manager.SandboxManager`, kept apart so each file
stays readable; it uses the manager's ``get``, ``limits``, ``sandbox_config``, ``docker``,
``create_sandbox`` and ``_session_fields``.
"""

from __future__ import annotations

import asyncio
import codecs
import math
import time
from typing import TYPE_CHECKING, Any

import structlog

from harombe.config import LANGUAGES, Language
from harombe.errors import HarombeError, SandboxLostError, UsageError
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.docker import settle
from harombe.security.runtime.output_guard import GuardedOutput
from harombe.security.runtime.sandbox import RUN_ENV, SESSION_LANGUAGES, ExecutionResult, argv_for

if TYPE_CHECKING:
    from harombe.security.runtime.docker import DockerManager
    from harombe.security.runtime.network import SandboxNetworks
    from harombe.security.runtime.sandbox import Sandbox

log = structlog.get_logger(__name__)

GVISOR_RUNTIMES = ("runsc", "runsc-net")
REPLY_SLACK_S = 15.0
#: While a reply is awaited longer than this, the container's state is checked this often, so
#: a sandbox paused or stopped from outside is found in seconds, not at the reply timeout.
LIVENESS_POLL_S = 2.0
TRUNCATION_MARK = "\n[OUTPUT TRUNCATED]"


def _decode(data: bytes, total: int) -> tuple[str, bool]:
    truncated = total > len(data)
    # An incremental decoder drops a multi-byte character cut in half by the byte cap.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not truncated)
    return (text + TRUNCATION_MARK if truncated else text), truncated


class LivenessWatch:
    """Watches the container of a run that has not answered within ``LIVENESS_POLL_S``.

    Its supervisor enforces the run's timeout itself, so silence alone proves nothing; but a
    container paused or stopped from outside never answers, and would otherwise hold the call
    until the reply timeout. When the watch finds one, it closes the channel, which ends the
    run as lost with :attr:`reason` as the cause. Costs one timer per call; a Docker inspect
    every ``LIVENESS_POLL_S`` only while a run is longer than that."""

    def __init__(self, docker: DockerManager, box: Sandbox) -> None:
        self.reason = ""
        self._docker = docker
        self._box = box
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(LIVENESS_POLL_S, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name=f"watch-{self._box.sandbox_id}")
        self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    async def _poll(self) -> None:
        box = self._box
        while True:
            try:
                state = await self._docker.container_state(box.container_id)
            except SandboxLostError:
                self.reason = f"the container of sandbox {box.sandbox_id} was removed from outside"
            except HarombeError:
                pass  # Docker unreachable: the channel itself tells if the sandbox is gone
            else:
                if state.get("Paused"):
                    self.reason = (
                        f"sandbox {box.sandbox_id} was paused from outside (docker pause) during "
                        "the call"
                    )
                elif state.get("Running") is False:
                    self.reason = f"sandbox {box.sandbox_id} stopped ({state.get('Status')})"
            if self.reason:
                await box.channel.close()
                return
            await asyncio.sleep(LIVENESS_POLL_S)


class Execution:
    """Mixin: ``execute`` and what it needs."""

    docker: DockerManager
    networks: SandboxNetworks
    _sandboxes: dict[str, Sandbox]
    _replaced: dict[str, str]
    limits: Any
    sandbox_config: Any

    if TYPE_CHECKING:

        def get(self, sandbox_id: str) -> Sandbox: ...

        def _session_fields(self, box: Sandbox, language: str) -> dict[str, Any]: ...

        async def _scrap(self, channel: Any, container_id: str) -> None: ...

        async def _detach(self, sandbox_id: str) -> None: ...

        async def create_sandbox(
            self,
            language: Language = "python",
            *,
            network_enabled: bool = False,
            allowed_domains: Any = (),
        ) -> Sandbox: ...

    def effective_timeout(self, timeout_s: float | None) -> tuple[float, list[str]]:
        """The timeout a call gets, in seconds, and any warnings about it.

        ``None`` gets ``max_execution_time`` (the default). A call's own timeout may be longer
        than the default, up to the hard ceiling ``max_timeout_s``; a longer one is capped to
        the ceiling and a warning says so. Anything but a finite number above zero (``nan``,
        ``inf``, ``"10"``, ``True``) raises :class:`UsageError`. Pure: no I/O, so the tools
        call it before the HITL gate, which then sees the timeout the run will get."""
        limits = self.limits
        if timeout_s is None:
            return float(limits.max_execution_time), []
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not 0 < float(timeout_s) < float("inf")  # also refuses NaN
        ):
            raise UsageError(
                f"timeout must be a finite number of seconds above 0, got {str(timeout_s)[:40]!r}; "
                "pass e.g. timeout=30, or leave it out for the default"
            )
        ceiling = float(limits.max_timeout_s)
        if timeout_s > ceiling:
            return ceiling, [
                f"timeout {float(timeout_s):g}s capped to max_timeout_s {ceiling:g}s (the hard "
                "ceiling; raise security.sandbox.limits.max_timeout_s to allow longer calls)"
            ]
        return float(timeout_s), []

    async def execute(
        self,
        sandbox_id: str,
        code: str,
        *,
        language: Language | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        fresh: bool | None = None,
    ) -> ExecutionResult:
        """Run ``code`` in the sandbox. Failures of the code are in the result, not raised.

        Python and JavaScript run in the sandbox's session interpreter (state kept between
        calls, ``result`` holds the final expression's repr) unless ``fresh`` is true or the
        config says ``stateful: false``; shell always runs a fresh ``bash``.
        """
        box = self.get(sandbox_id)
        lang: Language = language or box.language
        if lang not in LANGUAGES:
            raise UsageError(
                f"unknown language {str(lang)[:40]!r}; use one of {', '.join(LANGUAGES)}"
            )
        check_timeout(timeout_s)
        if not isinstance(code, str):
            raise UsageError(f"code must be a string, got {type(code).__name__}")
        interpreter = {"python": "python3", "javascript": "node", "shell": "bash"}[lang]
        if not box.has(interpreter):
            raise UsageError(
                f"{lang} is not available in sandbox {sandbox_id}: its image {box.image} has no "
                f"{interpreter}; create a sandbox for {lang} instead"
            )
        timeout, warnings = self.effective_timeout(timeout_s)
        stateful = self.sandbox_config.stateful if fresh is None else not fresh
        session = stateful and lang in SESSION_LANGUAGES
        try:
            argv, stdin = argv_for(lang, code)
            payload = code.encode("utf-8", "surrogateescape") if session else stdin
        except UnicodeEncodeError as exc:
            raise UsageError(
                f"code is not valid Unicode text: {exc.reason} at character {exc.start}; "
                "send the code as text without lone surrogate characters"
            ) from None
        guard = GuardedOutput(on_output) if on_output is not None else None
        async with box.lock:
            result = await self._run(
                box,
                argv,
                payload,
                language=lang,
                timeout_s=timeout,
                on_output=guard,
                warnings=warnings,
                session=session,
            )
        if guard is not None and guard.failure:
            result.warnings.append(guard.failure)
        return result

    async def _run(
        self,
        box: Sandbox,
        argv: list[str],
        stdin: bytes,
        *,
        language: str,
        timeout_s: float,
        on_output: OutputCallback | None = None,
        warnings: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        session: bool = False,
    ) -> ExecutionResult:
        limits = self.limits
        msg: dict[str, Any] = {
            "op": "run",
            "argv": argv,
            "env": {**RUN_ENV, **box.env, **(extra_env or {})},
            "cwd": "/workspace",
            "timeout_s": timeout_s,
            "grace_s": limits.kill_grace_s,
            "max_output_bytes": limits.max_output_bytes,
            "max_memory_mb": limits.max_memory_mb,
            "max_pids": limits.max_pids,
            # gVisor's /proc/meminfo is per sandbox; other runtimes show the host's there.
            "memory_probe": "meminfo" if box.runtime in GVISOR_RUNTIMES else "rss",
            "stream": on_output is not None,
        }
        if session:
            msg.update(self._session_fields(box, language), env=msg["env"])
        started = time.perf_counter()
        box.runs += 1
        watch = LivenessWatch(self.docker, box)
        lost: SandboxLostError | None = None
        try:
            reply, blob = await box.channel.request(
                msg,
                stdin,
                timeout_s=timeout_s + limits.kill_grace_s + REPLY_SLACK_S,
                on_output=on_output,
            )
        except SandboxLostError as exc:
            lost = SandboxLostError(watch.reason) if watch.reason else exc
        finally:
            watch.stop()
        if lost is not None:
            return await self._lost(box, lost, language=language, started=started)
        elapsed = time.perf_counter() - started
        if reply.get("op") != "done":
            raise UsageError(f"sandbox refused the run: {reply.get('message')}")
        out_len = int(reply["stdout_len"])
        stdout, out_cut = _decode(blob[:out_len], int(reply["stdout_total"]))
        stderr, err_cut = _decode(blob[out_len:], int(reply["stderr_total"]))
        status = str(reply["status"])
        exit_code = int(reply["exit_code"])
        error = None
        if status == "timeout":
            exit_code = -1
            error = "TimeoutError"
            stderr += f"\n[harombe] execution timed out after {timeout_s:g}s"
        elif status == "oom":
            error = (
                f"MemoryError: the run used more than max_memory_mb={limits.max_memory_mb} "
                "and was killed"
            )
        elif status == "cancelled":
            error = "CancelledError: the run was cancelled"
        elif exit_code != 0:
            error = f"process exited with code {exit_code}"
        return ExecutionResult(
            success=status == "ok",
            sandbox_id=box.sandbox_id,
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code,
            execution_time=round(elapsed, 6),
            error=error,
            status=status,
            language=language,
            runtime=box.runtime,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            stdout_bytes=int(reply["stdout_total"]),
            stderr_bytes=int(reply["stderr_total"]),
            cpu_s=float(reply.get("cpu_s", 0.0)),
            peak_memory_mb=float(reply.get("peak_memory_mb", 0.0)),
            timeout_s=timeout_s,
            warnings=list(warnings or []) + [str(w) for w in reply.get("warnings") or []],
            result=reply.get("result"),
            state_lost=bool(reply.get("state_lost")),
            stateful=bool(reply.get("session")),
        )

    async def _lost(
        self, box: Sandbox, exc: SandboxLostError, *, language: str, started: float
    ) -> ExecutionResult:
        """The sandbox died under a run: say why, and hand back a fresh replacement."""
        reason = str(exc)
        try:
            state = await self.docker.container_state(box.container_id)
            if state.get("OOMKilled"):
                reason = (
                    "the sandbox was killed for exceeding its memory limit "
                    f"(max_memory_mb={self.limits.max_memory_mb} plus workspace)"
                )
            elif state.get("Status") == "exited":
                reason = (
                    f"the sandbox's supervisor exited with code {state.get('ExitCode')} "
                    "(killed from inside the sandbox, or crashed)"
                )
        except Exception:  # noqa: BLE001 - the container may already be gone; keep the reason
            pass
        if box.channel.stderr_tail and box.channel.stderr_tail not in reason:
            reason += f"; supervisor stderr: {box.channel.stderr_tail.strip()[-500:]}"
        self._sandboxes.pop(box.sandbox_id, None)
        await settle(self._scrap(box.channel, box.container_id))
        await settle(self._detach(box.sandbox_id))
        try:
            # A pooled replacement must answer a ping first, so it is never another dead one.
            replacement = await self.create_sandbox(
                box.language,
                network_enabled=box.network_enabled,
                allowed_domains=box.allowed_domains,
            )
        except HarombeError as err:
            raise type(err)(
                f"sandbox {box.sandbox_id} was lost ({reason}) and no replacement could be "
                f"started: {err}"
            ) from err
        self._replaced[box.sandbox_id] = replacement.sandbox_id
        log.warning(
            "sandbox.lost",
            sandbox_id=box.sandbox_id,
            replacement=replacement.sandbox_id,
            reason=reason,
        )
        return ExecutionResult(
            success=False,
            sandbox_id=replacement.sandbox_id,
            stdout="",
            stderr="",
            exit_code=-1,
            execution_time=round(time.perf_counter() - started, 6),
            error=(
                f"SandboxLostError: {reason}; its files and state are gone, and sandbox "
                f"{replacement.sandbox_id} replaces it"
            ),
            status="lost",
            language=language,
            runtime=box.runtime,
            replaced_sandbox_id=box.sandbox_id,
        )


def check_timeout(timeout_s: object) -> None:
    """Refuse a timeout that is not a finite number of seconds above zero (None: the default).

    NaN compares false with everything, so it would slip past every cap; ``"5"`` or ``True``
    would mean one thing here and another to whoever checked the call."""
    if timeout_s is None:
        return
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise UsageError(
            f"timeout must be a finite number of seconds above 0, got {str(timeout_s)[:40]!r}; "
            "pass e.g. timeout=30, or leave it out for the default"
        )

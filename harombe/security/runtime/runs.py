"""Running code in a sandbox: the run request, the mapping of its reply to a result, and the
diagnosis when a sandbox dies under a run.

:class:`Runs` takes a :class:`~harombe.security.runtime.sandbox.Sandbox` and returns an
:class:`~harombe.security.runtime.sandbox.ExecutionResult`. A sandbox that dies under a run is
reported by raising :class:`~harombe.errors.SandboxLostError` with the reason found; replacing
it is the manager's business, not this module's.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from harombe.config import (
    INTERPRETERS,
    LANGUAGES,
    OUTPUT_MODES,
    Language,
    Limits,
    OutputMode,
    SandboxConfig,
)
from harombe.errors import HarombeError, SandboxLostError, UsageError
from harombe.security.guest import JS_WORKER_SOURCE
from harombe.security.policy.paths import WORKSPACE
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.llm_output import llm_request
from harombe.security.runtime.output_guard import GuardedOutput
from harombe.security.runtime.preflight import GVISOR_RUNTIMES
from harombe.security.runtime.profiled import cap_timeout, check_call
from harombe.security.runtime.results import result_from_reply
from harombe.security.runtime.sandbox import (
    RUN_ENV,
    SESSION_LANGUAGES,
    ExecutionResult,
    Sandbox,
    argv_for,
)

REPLY_SLACK_S = 15.0
#: While a reply is awaited longer than this, the container's state is checked this often, so
#: a sandbox paused or stopped from outside is found in seconds, not at the reply timeout.
LIVENESS_POLL_S = 2.0


class LivenessWatch:
    """Watches the container of a run that has not answered within ``LIVENESS_POLL_S``.

    Its supervisor enforces the run's timeout itself, so silence alone proves nothing; but a
    container paused or stopped from outside never answers, and would otherwise hold the call
    until the reply timeout. When the watch finds one, it closes the channel, which ends the
    run as lost with :attr:`reason` as the cause. Costs one timer per call; a Docker inspect
    every ``LIVENESS_POLL_S`` only while a run is longer than that."""

    def __init__(self, docker: DockerBackend, box: Sandbox) -> None:
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


def effective_timeout(limits: Limits, timeout_s: float | None) -> tuple[float, list[str]]:
    """The timeout a call gets, in seconds, and any warnings about it.

    ``None`` gets ``max_execution_time`` (the default). A call's own timeout may be longer
    than the default, up to the hard ceiling ``max_timeout_s``; a longer one is capped to the
    ceiling and a warning says so. Anything but a finite number above zero raises
    :class:`UsageError`. Pure, so the tools call it before the HITL gate, which then sees the
    timeout the run will get."""
    if timeout_s is None:
        return float(limits.max_execution_time), []
    check_timeout(timeout_s)
    ceiling = float(limits.max_timeout_s)
    if timeout_s > ceiling:
        return ceiling, [
            f"timeout {float(timeout_s):g}s capped to max_timeout_s {ceiling:g}s (the hard "
            "ceiling; raise security.sandbox.limits.max_timeout_s to allow longer calls)"
        ]
    return float(timeout_s), []


def check_output_mode(output_mode: object) -> OutputMode:
    """``output_mode`` if it is one of ``OUTPUT_MODES``, else :class:`UsageError`."""
    for mode in OUTPUT_MODES:
        if output_mode == mode and type(output_mode) is str:
            return mode
    raise UsageError(
        f"output_mode must be 'full' or 'llm', got {str(output_mode)[:40]!r}; leave it out for "
        "the configured default (security.sandbox.output_mode)"
    )


def run_request(
    box: Sandbox,
    argv: list[str],
    limits: Limits,
    *,
    timeout_s: float,
    stream: bool,
    extra_env: dict[str, str] | None,
    output_mode: OutputMode,
) -> dict[str, Any]:
    """The supervisor's ``run`` request for ``argv`` in ``box`` under ``limits``."""
    msg: dict[str, Any] = {
        "op": "run",
        "argv": argv,
        "env": {**RUN_ENV, **box.env, **(extra_env or {})},
        "cwd": WORKSPACE,
        "timeout_s": timeout_s,
        "grace_s": limits.kill_grace_s,
        "max_output_bytes": limits.max_output_bytes,
        "max_memory_mb": limits.max_memory_mb,
        "max_pids": limits.max_pids,
        # gVisor's /proc/meminfo is per sandbox; other runtimes show the host's there.
        "memory_probe": "meminfo" if box.runtime in GVISOR_RUNTIMES else "rss",
        "stream": stream,
    }
    if output_mode == "llm":  # head, tail and a saved copy of a long stream (llm_output.py)
        msg["output"] = llm_request(limits)
    return msg


class Runs:
    """Runs code and programs in sandboxes, under the limits of ``config``."""

    def __init__(self, docker: DockerBackend, config: SandboxConfig) -> None:
        self._docker = docker
        self._config = config
        self.limits = config.limits

    def session_fields(self, box: Sandbox, language: str) -> dict[str, Any]:
        """What the supervisor needs to start the session interpreter for ``language``.

        The JavaScript worker's source goes to a sandbox once; its supervisor keeps it, so
        calls do not carry it each time."""
        fields: dict[str, Any] = {
            "session": True,
            "language": language,
            "env": {**RUN_ENV, **box.env},
            "cwd": WORKSPACE,
            "max_pids": self.limits.max_pids,
        }
        if language == "javascript" and not box.js_worker_sent:
            fields["worker_source"] = JS_WORKER_SOURCE
            box.js_worker_sent = True
        return fields

    async def execute(
        self,
        box: Sandbox,
        code: str,
        *,
        language: Language | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        fresh: bool | None = None,
        output_mode: str | None = None,
    ) -> ExecutionResult:
        """Run ``code`` in ``box``; failures of the code are in the result, not raised.

        Python and JavaScript run in the sandbox's session interpreter unless ``fresh`` is
        true or the config says ``stateful: false``; shell always runs a fresh ``bash``. On a
        sandbox with a profile, only Python in its session interpreter, and the profile's
        ``timeout_max_s`` caps the timeout (see :mod:`.profiled`). ``output_mode`` ``None``
        is the config's ``output_mode`` (see :mod:`.llm_output` for ``llm``).
        Raises :class:`SandboxLostError` (with the cause found) when the sandbox dies."""
        lang: Language = language or box.language
        if lang not in LANGUAGES:
            raise UsageError(
                f"unknown language {str(lang)[:40]!r}; use one of {', '.join(LANGUAGES)}"
            )
        timeout, warnings = effective_timeout(self.limits, timeout_s)  # checks it, too
        mode = check_output_mode(self._config.output_mode if output_mode is None else output_mode)
        check_call(box, language=lang, fresh=fresh)
        timeout, warnings = cap_timeout(box.profile, timeout, warnings)
        if not isinstance(code, str):
            raise UsageError(f"code must be a string, got {type(code).__name__}")
        if not box.has(INTERPRETERS[lang]):
            raise UsageError(
                f"{lang} is not available in sandbox {box.sandbox_id}: its image {box.image} "
                f"has no {INTERPRETERS[lang]}; create a sandbox for {lang} instead"
            )
        stateful = self._config.stateful if fresh is None else not fresh
        stateful = stateful or box.profile is not None  # its layer is in the session only
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
            result = await self.run(
                box, argv, payload, language=lang, timeout_s=timeout, on_output=guard,
                warnings=warnings, session=session, output_mode=mode,
            )  # fmt: skip
        if guard is not None and guard.failure:
            result.warnings.append(guard.failure)
        return result

    async def run(
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
        output_mode: OutputMode = "full",
    ) -> ExecutionResult:
        """Run ``argv`` (or, with ``session``, code in the session interpreter); the caller
        holds ``box.lock``. Raises :class:`SandboxLostError` when the sandbox dies."""
        limits = box.limits or self.limits
        msg = run_request(box, argv, limits, timeout_s=timeout_s, stream=on_output is not None,
                          extra_env=extra_env, output_mode=output_mode)  # fmt: skip
        if session:
            msg.update(self.session_fields(box, language), env=msg["env"])
        started = time.perf_counter()
        box.runs += 1
        watch = LivenessWatch(self._docker, box)
        try:
            reply, blob = await box.channel.request(
                msg,
                stdin,
                timeout_s=timeout_s + limits.kill_grace_s + REPLY_SLACK_S,
                on_output=on_output,
            )
        except SandboxLostError as exc:
            lost = SandboxLostError(watch.reason) if watch.reason else exc
            raise SandboxLostError(await self.diagnose(box, lost)) from None
        finally:
            watch.stop()
        try:
            return result_from_reply(
                box, reply, blob, language=language, timeout_s=timeout_s,
                elapsed_s=time.perf_counter() - started, limits=limits, warnings=warnings,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            # Like a frame out of bounds: the sandbox broke the protocol, so it is never
            # trusted again (lost, and replaced by the manager).
            await box.channel.close()
            why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise SandboxLostError(
                f"sandbox {box.sandbox_id} broke the protocol: a malformed reply ({why})"
            ) from None

    async def diagnose(self, box: Sandbox, exc: SandboxLostError) -> str:
        """Why ``box`` died: its container's state (out of memory, exit code) and the
        supervisor's last words, on top of what the channel saw."""
        reason = str(exc)
        try:
            state = await self._docker.container_state(box.container_id)
            if state.get("OOMKilled"):
                reason = (
                    "the sandbox was killed for exceeding its memory limit "
                    f"(max_memory_mb={(box.limits or self.limits).max_memory_mb} plus workspace)"
                )
            elif state.get("Status") == "exited":
                reason = (
                    f"the sandbox's supervisor exited with code {state.get('ExitCode')} "
                    "(killed from inside the sandbox, or crashed)"
                )
        except HarombeError:
            pass  # the container may already be gone; keep the reason
        if box.channel.stderr_tail and box.channel.stderr_tail not in reason:
            reason += f"; supervisor stderr: {box.channel.stderr_tail.strip()[-500:]}"
        return reason

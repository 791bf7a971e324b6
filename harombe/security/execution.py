"""Running code in a sandbox: the run request, its result, and what happens when a sandbox dies.

A mixin of :class:`~harombe.security.sandbox_manager.SandboxManager`, kept apart so each file
stays readable; it uses the manager's ``get``, ``limits``, ``sandbox_config``, ``docker``,
``create_sandbox`` and ``_session_fields``.
"""

from __future__ import annotations

import codecs
import time
from typing import TYPE_CHECKING, Any

import structlog

from harombe.config import LANGUAGES, Language
from harombe.errors import SandboxLostError, UsageError
from harombe.security.channel import OutputCallback
from harombe.security.sandbox import RUN_ENV, SESSION_LANGUAGES, ExecutionResult, argv_for

if TYPE_CHECKING:
    from harombe.security.docker_manager import DockerManager
    from harombe.security.network import SandboxNetworks
    from harombe.security.sandbox import Sandbox

log = structlog.get_logger(__name__)

GVISOR_RUNTIMES = ("runsc", "runsc-net")
REPLY_SLACK_S = 15.0
TRUNCATION_MARK = "\n[OUTPUT TRUNCATED]"


def _decode(data: bytes, total: int) -> tuple[str, bool]:
    truncated = total > len(data)
    # An incremental decoder drops a multi-byte character cut in half by the byte cap.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not truncated)
    return (text + TRUNCATION_MARK if truncated else text), truncated


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

        async def create_sandbox(
            self,
            language: Language = "python",
            *,
            network_enabled: bool = False,
            allowed_domains: Any = (),
        ) -> Sandbox: ...

    def effective_timeout(self, timeout_s: float | None) -> tuple[float, list[str]]:
        """The timeout a call gets: its own, capped by ``max_execution_time``."""
        cap = float(self.limits.max_execution_time)
        if timeout_s is None:
            return cap, []
        if timeout_s <= 0:
            raise UsageError(f"timeout must be positive, got {timeout_s}")
        if timeout_s > cap:
            return cap, [f"timeout {timeout_s}s capped to max_execution_time {cap:g}s"]
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
            raise UsageError(f"unknown language {lang!r}; use one of {', '.join(LANGUAGES)}")
        interpreter = {"python": "python3", "javascript": "node", "shell": "bash"}[lang]
        if not box.has(interpreter):
            raise UsageError(
                f"{lang} is not available in sandbox {sandbox_id}: its image {box.image} has no "
                f"{interpreter}; create a sandbox for {lang} instead"
            )
        timeout, warnings = self.effective_timeout(timeout_s)
        stateful = self.sandbox_config.stateful if fresh is None else not fresh
        session = stateful and lang in SESSION_LANGUAGES
        argv, stdin = argv_for(lang, code)
        async with box.lock:
            return await self._run(
                box,
                argv,
                code.encode("utf-8", "surrogateescape") if session else stdin,
                language=lang,
                timeout_s=timeout,
                on_output=on_output,
                warnings=warnings,
                session=session,
            )

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
        try:
            reply, blob = await box.channel.request(
                msg,
                stdin,
                timeout_s=timeout_s + limits.kill_grace_s + REPLY_SLACK_S,
                on_output=on_output,
            )
        except SandboxLostError as exc:
            return await self._lost(box, exc, language=language, started=started)
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
            warnings=list(warnings or []),
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
        await box.channel.close()
        await self.docker.remove_container(box.container_id)
        await self.networks.detach(box.sandbox_id)
        replacement = await self.create_sandbox(
            box.language, network_enabled=box.network_enabled, allowed_domains=box.allowed_domains
        )
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

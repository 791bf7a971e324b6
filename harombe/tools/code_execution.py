"""The agent-facing code-execution tools of the usage guide.

Every method returns a result dict and never raises for anything an agent can cause: policy
refusals, unknown sandboxes, bad paths, failing code and lost sandboxes all come back as
``success: False`` with an ``error`` that starts with the error's kind. Each call emits exactly
one ``tool.called`` audit event (sizes and outcome, never code or file contents above debug).

With a :class:`~harombe.security.hitl.HITLGate`, every call is classified and decided *before*
anything touches Docker; a call that is not approved returns ``success: False`` with an
``ApprovalDeniedError`` naming the denial, the risk and the reasons, and every result carries the
decision under ``approval``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import structlog

from harombe.errors import HarombeError, UsageError
from harombe.security.channel import OutputCallback
from harombe.security.hitl import ApprovalDecision, HITLGate, Operation
from harombe.security.sandbox_manager import SandboxManager
from harombe.security.streaming import OutputChunk, iterate

log = structlog.get_logger(__name__)


def _failure(err: HarombeError, **fields: Any) -> dict[str, Any]:
    return {"success": False, **fields, "error": f"{err.kind}: {err}"}


class CodeExecutionTools:
    """``code_execute``, ``code_install_package``, ``code_write_file``, ``code_read_file``,
    ``code_list_files`` and ``code_destroy_sandbox`` over one :class:`SandboxManager`."""

    def __init__(self, sandbox_manager: SandboxManager, hitl_gate: HITLGate | None = None) -> None:
        if hitl_gate is not None and not callable(getattr(hitl_gate, "check_approval", None)):
            # A gate that cannot be consulted would let every call through: fail closed.
            got = type(hitl_gate).__name__
            raise UsageError(f"hitl_gate must be a harombe.security.hitl.HITLGate (got {got})")
        self.sandbox_manager = sandbox_manager
        self.hitl_gate = hitl_gate

    async def _call(
        self,
        tool: str,
        params: dict[str, Any],
        body: Callable[[ApprovalDecision | None], Awaitable[dict[str, Any]]],
        *,
        fields: dict[str, Any],
        log_params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        decision = None
        if self.hitl_gate is not None:
            decision = await self.hitl_gate.check_approval(Operation(tool, params))
        try:
            if decision is not None and not decision.approved:
                raise decision.error()
            result = await body(decision)
        except HarombeError as err:
            result = _failure(err, **fields)
        if decision is not None:
            result["approval"] = decision.summary()
        duration = time.perf_counter() - started
        log.info(
            "tool.called",
            tool=tool,
            sandbox_id=result.get("sandbox_id"),
            language=params.get("language"),
            success=result.get("success"),
            status=result.get("status"),
            approval=decision.status.value if decision is not None else None,
            exit_code=result.get("exit_code"),
            error_kind=(result.get("error") or "").split(":", 1)[0] or None,
            duration_s=round(duration, 4),
            **{k: v for k, v in result.items() if k.endswith("_bytes")},
        )
        log.debug("tool.params", tool=tool, params=params if log_params is None else log_params)
        return result

    async def code_execute(
        self,
        language: str,
        code: str,
        sandbox_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the usage guide's parameter name
        network_enabled: bool = False,
        allowed_domains: Sequence[str] | None = None,
        *,
        fresh: bool = False,
        on_output: OutputCallback | None = None,
    ) -> dict[str, Any]:
        """Run ``code`` in ``sandbox_id`` (or a new sandbox); see the usage guide's result.

        Python and JavaScript keep state between calls on one sandbox (``result`` is the repr
        of a final bare expression); ``fresh=True`` runs this call in a new process instead.
        """
        params = {
            "language": language,
            "code": code,
            "sandbox_id": sandbox_id,
            "timeout": timeout,
            "network_enabled": network_enabled,
            "allowed_domains": list(allowed_domains or []),
            "fresh": fresh,
        }

        async def body(decision: ApprovalDecision | None) -> dict[str, Any]:
            manager = self.sandbox_manager
            warnings: list[str] = []
            sid = sandbox_id
            if sid is None:
                box = await manager.create_sandbox(
                    language,  # type: ignore[arg-type]
                    network_enabled=network_enabled,
                    allowed_domains=allowed_domains or (),
                )
                sid = box.sandbox_id
                if decision is not None and self.hitl_gate is not None:
                    # "Approve for this sandbox" given before the sandbox existed applies to it.
                    self.hitl_gate.remember(decision, sid)
            result = await manager.execute(
                sid,
                code,
                language=language,  # type: ignore[arg-type]
                timeout_s=timeout,
                on_output=on_output,
                fresh=True if fresh else None,
            )
            out = result.to_dict()
            out["warnings"] = warnings + out["warnings"]
            return out

        return await self._call("code_execute", params, body, fields={"sandbox_id": sandbox_id})

    async def code_execute_stream(
        self,
        language: str,
        code: str,
        sandbox_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the usage guide's parameter name
        *,
        fresh: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """``code_execute`` as a stream: ``{"type": "stdout"|"stderr", "text": ...}`` items as
        the code prints, then ``{"type": "result", **result}``. Breaking out cancels the run."""

        def start(on_output: OutputCallback) -> Awaitable[dict[str, Any]]:
            return self.code_execute(
                language, code, sandbox_id, timeout, fresh=fresh, on_output=on_output
            )

        # aclosing: leaving this generator must cancel the run now, not when the inner
        # generator is garbage-collected.
        async with contextlib.aclosing(iterate(start)) as items:
            async for item in items:
                if isinstance(item, OutputChunk):
                    yield {"type": item.stream, "text": item.text}
                else:
                    yield {"type": "result", **item}

    async def code_install_package(
        self, sandbox_id: str, package: str, registry: str = "pypi"
    ) -> dict[str, Any]:
        """Install ``package`` from ``registry`` (pypi or npm) into the sandbox."""
        params = {"sandbox_id": sandbox_id, "package": package, "registry": registry}
        fields = {"sandbox_id": sandbox_id, "package": package, "registry": registry}

        async def body(_: ApprovalDecision | None) -> dict[str, Any]:
            result = await self.sandbox_manager.install_package(sandbox_id, package, registry)
            return {
                "success": result.success,
                **fields,
                "sandbox_id": result.sandbox_id,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "error": result.error,
                "warnings": result.warnings,
            }

        return await self._call("code_install_package", params, body, fields=fields)

    async def code_write_file(
        self, sandbox_id: str, file_path: str, content: str
    ) -> dict[str, Any]:
        """Write ``content`` to ``/workspace/<file_path>``, creating parent directories."""
        params = {"sandbox_id": sandbox_id, "file_path": file_path, "content": content}
        fields = {"sandbox_id": sandbox_id, "file_path": file_path}

        async def body(_: ApprovalDecision | None) -> dict[str, Any]:
            written = await self.sandbox_manager.write_file(sandbox_id, file_path, content)
            return {"success": True, **fields, "written_bytes": written, "error": None}

        return await self._call(
            "code_write_file",
            params,
            body,
            fields=fields,
            log_params={**fields, "content_chars": len(content)},
        )

    async def code_read_file(self, sandbox_id: str, file_path: str) -> dict[str, Any]:
        """The UTF-8 text of ``/workspace/<file_path>``."""
        fields = {"sandbox_id": sandbox_id, "file_path": file_path}

        async def body(_: ApprovalDecision | None) -> dict[str, Any]:
            data = await self.sandbox_manager.read_file(sandbox_id, file_path)
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                return {
                    "success": False,
                    **fields,
                    "content": None,
                    "read_bytes": len(data),
                    "error": f"UnicodeDecodeError: {file_path} is not UTF-8 text ({exc.reason} "
                    f"at byte {exc.start}); read binary data by encoding it in code_execute",
                }
            return {
                "success": True,
                **fields,
                "content": content,
                "read_bytes": len(data),
                "error": None,
            }

        return await self._call("code_read_file", dict(fields), body, fields=fields)

    async def code_list_files(self, sandbox_id: str, path: str = ".") -> dict[str, Any]:
        """Names in a workspace directory (``files``) and their details (``entries``)."""
        fields = {"sandbox_id": sandbox_id, "path": path}

        async def body(_: ApprovalDecision | None) -> dict[str, Any]:
            entries = await self.sandbox_manager.list_files(sandbox_id, path)
            return {
                "success": True,
                **fields,
                "files": [e["name"] for e in entries],
                "entries": entries,
                "error": None,
            }

        return await self._call("code_list_files", dict(fields), body, fields=fields)

    async def code_destroy_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy the sandbox and everything in it."""
        fields = {"sandbox_id": sandbox_id}

        async def body(_: ApprovalDecision | None) -> dict[str, Any]:
            await self.sandbox_manager.destroy_sandbox(sandbox_id)
            if self.hitl_gate is not None:
                self.hitl_gate.forget_sandbox(sandbox_id)
            return {"success": True, **fields, "error": None}

        return await self._call("code_destroy_sandbox", dict(fields), body, fields=fields)

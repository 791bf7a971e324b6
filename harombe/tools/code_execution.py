"""The agent-facing code-execution tools of the usage guide.

Every method returns a result dict and never raises for anything an agent can cause: invalid
arguments, policy refusals, unknown sandboxes, bad paths, failing code and lost sandboxes all
come back as ``success: False`` with an ``error`` that starts with the error's kind. Each call
emits exactly one ``tool.called`` audit event (sizes and outcome; code and file contents only
at debug level).

Every call goes through the same three steps, in this order:

1. its arguments are validated and normalised once, by the tool's model in
   :mod:`harombe.tools.params`, and the sandbox it names is looked up; an argument that cannot
   be read unambiguously, or an unknown sandbox, ends the call here, before anyone is asked and
   before any sandbox is created;
2. with a :class:`~harombe.security.hitl.HITLGate`, the call is classified and decided on those
   normalised values (plus what the call will really do: the network of the sandbox it runs in,
   the timeout it will get); a call that is not approved returns ``success: False`` with an
   ``ApprovalDeniedError`` naming the denial, the risk and the reasons;
3. the manager acts on exactly the values the gate saw. Every result carries the decision
   under ``approval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from harombe.errors import HarombeError, InvalidArgumentError, UsageError
from harombe.security.approval.gate import ApprovalDecision, HITLGate, Operation
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.policy.paths import exact_str, is_a, preview
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.streaming import OutputChunk, iterate
from harombe.tools.params import (
    TOOL_ARGS,
    CodeExecuteArgs,
    DestroySandboxArgs,
    InstallPackageArgs,
    ListFilesArgs,
    ReadFileArgs,
    WriteFileArgs,
    parse_args,
)

log = structlog.get_logger(__name__)

#: Raw argument values longer than this are not echoed into a failed call's result.
ECHO_MAX_CHARS = 256


def _failure(err: HarombeError, **fields: Any) -> dict[str, Any]:
    return {"success": False, **fields, "error": f"{err.kind}: {err}"}


def _echo(value: object) -> object:
    """A raw argument as it may appear in a failed call's result: short text, else ``None``."""
    if is_a(value, str) and str.__len__(value) <= ECHO_MAX_CHARS:
        return exact_str(value)
    return None


@dataclass
class Plan:
    """A validated call: what the gate is shown, what the result echoes, and the action."""

    params: dict[str, Any]
    fields: dict[str, Any]
    run: Callable[[ApprovalDecision | None], Awaitable[dict[str, Any]]]
    log_params: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


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
        # Sandboxes talk to harombe over streams bound to one event loop: the loop these tools
        # were made on, or else the one of their first call.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    async def _call(
        self, tool: str, raw: dict[str, Any], plan: Callable[[Any], Plan]
    ) -> dict[str, Any]:
        started = time.perf_counter()
        decision = None
        language: object = None
        try:
            self._check_loop()
            args = parse_args(
                TOOL_ARGS[tool], raw, max_bytes=self.sandbox_manager.limits.max_file_bytes
            )
            language = getattr(args, "language", None)
            planned = plan(args)
        except HarombeError as err:
            # Nothing was asked, created or touched: the arguments are refused as given.
            result = _failure(err, **{k: _echo(v) for k, v in raw.items() if k in _ECHOED})
            self._audit(tool, result, None, started, language=_echo(raw.get("language")))
            return result
        if self.hitl_gate is not None:
            # The approver (and anything logging the operation) gets its own copy: changing
            # it cannot change what runs, which the plan fixed from the validated arguments.
            shown = copy.deepcopy(planned.params)
            decision = await self.hitl_gate.check_approval(Operation(tool, shown))
        try:
            if decision is not None and not decision.approved:
                raise decision.error()
            result = await planned.run(decision)
        except HarombeError as err:
            result = _failure(err, **planned.fields)
        if planned.warnings and "warnings" in result:
            result["warnings"] = planned.warnings + list(result["warnings"])
        lost = result.get("replaced_sandbox_id")
        if lost and self.hitl_gate is not None:
            # A lost sandbox's "approve for this sandbox" grants die with it; the replacement
            # starts with none.
            self.hitl_gate.forget_sandbox(str(lost))
        if decision is not None:
            result["approval"] = decision.summary()
        self._audit(tool, result, decision, started, language=language)
        log.debug(
            "tool.params",
            tool=tool,
            params=planned.params if planned.log_params is None else planned.log_params,
        )
        return result

    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        stale = self._loop is not None and self._loop.is_closed()
        if self._loop is None or (stale and not self.sandbox_manager.sandboxes):
            self._loop = loop
        if loop is not self._loop:
            raise UsageError(
                "these tools were called from another event loop (another thread or "
                "asyncio.run) than the one their sandboxes belong to; call them from the loop "
                "the SandboxManager was started on, e.g. with "
                "asyncio.run_coroutine_threadsafe(tools.code_execute(...), loop)"
            )

    def _audit(
        self,
        tool: str,
        result: dict[str, Any],
        decision: ApprovalDecision | None,
        started: float,
        *,
        language: object,
    ) -> None:
        log.info(
            "tool.called",
            tool=tool,
            sandbox_id=result.get("sandbox_id"),
            language=language,
            success=result.get("success"),
            status=result.get("status"),
            approval=decision.status.value if decision is not None else None,
            exit_code=result.get("exit_code"),
            error_kind=(result.get("error") or "").split(":", 1)[0] or None,
            duration_s=round(time.perf_counter() - started, 4),
            **{k: v for k, v in result.items() if k.endswith("_bytes")},
        )

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

        Parameters are :class:`~harombe.tools.params.CodeExecuteArgs`. Python and JavaScript
        keep state between calls on one sandbox (``result`` is the repr of a final bare
        expression); ``fresh=True`` runs this call in a new process instead. ``timeout`` may
        exceed ``max_execution_time`` up to ``max_timeout_s``. On an existing sandbox, the
        gate is shown the network that sandbox really has.
        """
        raw = {
            "language": language,
            "code": code,
            "sandbox_id": sandbox_id,
            "timeout": timeout,
            "network_enabled": network_enabled,
            "allowed_domains": allowed_domains,
            "fresh": fresh,
        }
        return await self._call("code_execute", raw, lambda a: self._plan_execute(a, on_output))

    def _plan_execute(self, args: CodeExecuteArgs, on_output: OutputCallback | None) -> Plan:
        if on_output is not None and not callable(on_output):
            raise InvalidArgumentError("on_output must be a callable taking an output chunk")
        manager = self.sandbox_manager
        timeout_s, warnings = manager.effective_timeout(args.timeout)
        network, domains = args.network_enabled, tuple(args.allowed_domains)
        if args.sandbox_id is not None:
            box = manager.get(args.sandbox_id)
            _require(box, INTERPRETERS[args.language], args.language)
            _check_network_matches(args, box.sandbox_id, box.network_enabled, box.allowed_domains)
            # The sandbox's own network decides the risk, whatever this call repeats.
            network, domains = box.network_enabled, tuple(box.allowed_domains)
        params = {
            "language": args.language,
            "code": args.code,
            "sandbox_id": args.sandbox_id,
            "timeout": timeout_s,
            "timeout_default_s": float(manager.limits.max_execution_time),
            "network_enabled": network,
            "allowed_domains": list(domains),
            "fresh": args.fresh,
        }

        async def run(decision: ApprovalDecision | None) -> dict[str, Any]:
            sid = args.sandbox_id
            if sid is None:
                box = await manager.create_sandbox(
                    args.language, network_enabled=network, allowed_domains=list(domains)
                )
                sid = box.sandbox_id
                if decision is not None and self.hitl_gate is not None:
                    # "Approve for this sandbox" given before the sandbox existed applies to it.
                    self.hitl_gate.remember(decision, sid)
            try:
                result = await manager.execute(
                    sid,
                    args.code,
                    language=args.language,
                    timeout_s=timeout_s,
                    on_output=on_output,
                    fresh=True if args.fresh else None,
                )
            except BaseException:
                if args.sandbox_id is None:
                    # A sandbox this call created and cannot return (the error result has no
                    # id) would live on unseen until stop(): remove it now.
                    await _discard(manager, sid)
                raise
            return result.to_dict()

        return Plan(params, {"sandbox_id": args.sandbox_id}, run, warnings=warnings)

    async def code_execute_stream(
        self,
        language: str,
        code: str,
        sandbox_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the usage guide's parameter name
        network_enabled: bool = False,
        allowed_domains: Sequence[str] | None = None,
        *,
        fresh: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """``code_execute`` as a stream, with the same parameters: ``{"type": "stdout"|
        "stderr", "text": ...}`` items as the code prints, then ``{"type": "result",
        **result}``. Breaking out cancels the run."""

        def start(on_output: OutputCallback) -> Awaitable[dict[str, Any]]:
            return self.code_execute(
                language,
                code,
                sandbox_id,
                timeout,
                network_enabled,
                allowed_domains,
                fresh=fresh,
                on_output=on_output,
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
        """Install ``package`` from ``registry`` (pypi or npm) into the sandbox.

        Parameters are :class:`~harombe.tools.params.InstallPackageArgs`."""

        def plan(args: InstallPackageArgs) -> Plan:
            box = self.sandbox_manager.get(args.sandbox_id)
            _require(box, "python3" if args.registry == "pypi" else "node", args.registry)
            fields = {"sandbox_id": args.sandbox_id, "package": args.package,
                      "registry": args.registry}  # fmt: skip

            async def run(_: ApprovalDecision | None) -> dict[str, Any]:
                result = await self.sandbox_manager.install_package(
                    args.sandbox_id, args.package, args.registry
                )
                out = {
                    "success": result.success,
                    **fields,
                    "sandbox_id": result.sandbox_id,
                    "stdout": result.stdout,
                    "stderr": result.stderr,
                    "error": result.error,
                    "warnings": result.warnings,
                }
                if result.replaced_sandbox_id:
                    out["replaced_sandbox_id"] = result.replaced_sandbox_id
                return out

            return Plan(dict(fields), fields, run)

        raw = {"sandbox_id": sandbox_id, "package": package, "registry": registry}
        return await self._call("code_install_package", raw, plan)

    async def code_write_file(
        self, sandbox_id: str, file_path: str, content: str
    ) -> dict[str, Any]:
        """Write ``content`` to ``/workspace/<file_path>``, creating parent directories.

        Parameters are :class:`~harombe.tools.params.WriteFileArgs`; ``file_path`` in the
        result is the normalised path that was written."""

        def plan(args: WriteFileArgs) -> Plan:
            self.sandbox_manager.get(args.sandbox_id)
            fields = {"sandbox_id": args.sandbox_id, "file_path": args.file_path}

            async def run(_: ApprovalDecision | None) -> dict[str, Any]:
                written = await self.sandbox_manager.write_file(
                    args.sandbox_id, args.file_path, args.content
                )
                return {"success": True, **fields, "written_bytes": written, "error": None}

            params = {**fields, "content": args.content}
            return Plan(params, fields, run, {**fields, "content_chars": len(args.content)})

        raw = {"sandbox_id": sandbox_id, "file_path": file_path, "content": content}
        return await self._call("code_write_file", raw, plan)

    async def code_read_file(self, sandbox_id: str, file_path: str) -> dict[str, Any]:
        """The UTF-8 text of ``/workspace/<file_path>``.

        Parameters are :class:`~harombe.tools.params.ReadFileArgs`."""

        def plan(args: ReadFileArgs) -> Plan:
            self.sandbox_manager.get(args.sandbox_id)
            fields = {"sandbox_id": args.sandbox_id, "file_path": args.file_path}

            async def run(_: ApprovalDecision | None) -> dict[str, Any]:
                data = await self.sandbox_manager.read_file(args.sandbox_id, args.file_path)
                try:
                    content = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return {
                        "success": False,
                        **fields,
                        "content": None,
                        "read_bytes": len(data),
                        "error": f"UnicodeDecodeError: {args.file_path} is not UTF-8 text "
                        f"({exc.reason} at byte {exc.start}); read binary data by encoding it "
                        "in code_execute",
                    }
                return {
                    "success": True,
                    **fields,
                    "content": content,
                    "read_bytes": len(data),
                    "error": None,
                }

            return Plan(dict(fields), fields, run)

        raw = {"sandbox_id": sandbox_id, "file_path": file_path}
        return await self._call("code_read_file", raw, plan)

    async def code_list_files(self, sandbox_id: str, path: str = ".") -> dict[str, Any]:
        """Names in a workspace directory (``files``) and their details (``entries``).

        Parameters are :class:`~harombe.tools.params.ListFilesArgs`."""

        def plan(args: ListFilesArgs) -> Plan:
            self.sandbox_manager.get(args.sandbox_id)
            fields = {"sandbox_id": args.sandbox_id, "path": args.path}

            async def run(_: ApprovalDecision | None) -> dict[str, Any]:
                listing = await self.sandbox_manager.list_directory(args.sandbox_id, args.path)
                entries = listing.entries
                warnings = []
                if listing.truncated:
                    warnings.append(
                        f"the directory holds {listing.total} entries; only the first "
                        f"{len(entries)} by name are listed"
                    )
                return {
                    "success": True,
                    **fields,
                    "files": [e["name"] for e in entries],
                    "entries": entries,
                    "total": listing.total,
                    "truncated": listing.truncated,
                    "warnings": warnings,
                    "error": None,
                }

            return Plan(dict(fields), fields, run)

        return await self._call("code_list_files", {"sandbox_id": sandbox_id, "path": path}, plan)

    async def code_destroy_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy the sandbox and everything in it.

        Parameters are :class:`~harombe.tools.params.DestroySandboxArgs`."""

        def plan(args: DestroySandboxArgs) -> Plan:
            self.sandbox_manager.get(args.sandbox_id)
            fields = {"sandbox_id": args.sandbox_id}

            async def run(_: ApprovalDecision | None) -> dict[str, Any]:
                await self.sandbox_manager.destroy_sandbox(args.sandbox_id)
                if self.hitl_gate is not None:
                    self.hitl_gate.forget_sandbox(args.sandbox_id)
                return {"success": True, **fields, "error": None}

            return Plan(dict(fields), fields, run)

        return await self._call("code_destroy_sandbox", {"sandbox_id": sandbox_id}, plan)


async def _discard(manager: SandboxManager, sandbox_id: str) -> None:
    """Destroy ``sandbox_id``, even while the calling task is being cancelled; never raises."""
    task = asyncio.ensure_future(manager.destroy_sandbox(sandbox_id))
    try:
        await asyncio.shield(task)
    except BaseException as exc:  # noqa: BLE001 - cleanup of an already failing call
        error = f"{type(exc).__name__}: {preview(str(exc))}"
        log.warning("tool.discard_failed", sandbox_id=sandbox_id, error=error)


#: The program each language needs in the sandbox's image.
INTERPRETERS = {"python": "python3", "javascript": "node", "shell": "bash"}


def _require(box: Any, interpreter: str, what: str) -> None:
    """Refuse, before anyone is asked, a call the sandbox's image cannot run."""
    if not box.has(interpreter):
        raise UsageError(
            f"{what} needs {interpreter}, which sandbox {box.sandbox_id}'s image {box.image} "
            f"lacks; leave out sandbox_id to create a sandbox with an image for it"
        )


#: Arguments a failed call's result repeats (when they are short text).
_ECHOED = ("sandbox_id", "file_path", "path", "package", "registry")


def _check_network_matches(
    args: CodeExecuteArgs, sandbox_id: str, has_network: bool, domains: Sequence[str]
) -> None:
    """A call on an existing sandbox may repeat its network settings, never change them."""
    if args.network_enabled and not has_network:
        raise InvalidArgumentError(
            f"network_enabled=True, but sandbox {sandbox_id} was created without network and "
            "a sandbox keeps the network it was created with; leave out sandbox_id to create "
            "a sandbox with network, or drop network_enabled"
        )
    if args.allowed_domains and Allowlist.parse(args.allowed_domains) != Allowlist.parse(domains):
        raise InvalidArgumentError(
            f"allowed_domains {preview(args.allowed_domains)} differ from sandbox {sandbox_id}'s "
            f"{preview(list(domains))}; allowed_domains are set when a sandbox is created, so "
            "repeat the same list or leave it out"
        )

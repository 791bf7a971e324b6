"""The agent-facing code-execution tools of the usage guide.

Every method returns a result dict and never raises for anything an agent can cause: invalid
arguments, policy refusals, unknown sandboxes, bad paths, failing code and lost sandboxes all
come back as ``success: False`` with an ``error`` that starts with the error's kind, and with
every key of the tool's successful result (``stdout: ""``, ``exit_code: None``, …: the
templates of :mod:`harombe.tools.shapes`). Each call emits exactly one ``tool.called`` audit
event (sizes and outcome; code and file contents only at debug level).

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
   under ``approval`` (``None`` when no gate decided).

What each tool does between those steps is its plan, in :mod:`harombe.tools.plans`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import structlog

from harombe.errors import GuardrailError, HarombeError, UsageError
from harombe.host_paths import scrub_host_paths
from harombe.security.approval.gate import (
    FROM_CONFIG,
    ApprovalDecision,
    HITLGate,
    Operation,
    gate_from_config,
)
from harombe.security.approval.policy_line import announce
from harombe.security.policy.paths import exact_str, is_a
from harombe.security.policy.profile_set import ProfileSet
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.streaming import OutputChunk, iterate
from harombe.tools import plans
from harombe.tools.params import TOOL_ARGS, parse_args
from harombe.tools.plans import Plan
from harombe.tools.profiles import ProfileTable
from harombe.tools.shapes import shaped

log = structlog.get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
#: Makes a tool's :class:`Plan` from the manager, the gate and the validated arguments
#: (``code_execute``'s is awaited: it scans the code in a worker thread).
Planner = Callable[[SandboxManager, HITLGate | None, Any], Plan | Awaitable[Plan]]

#: Raw argument values longer than this are not echoed into a failed call's result.
ECHO_MAX_CHARS = 256
#: Arguments a failed call's result repeats (when they are short text).
_ECHOED = ("sandbox_id", "file_path", "path", "package", "registry")


def _failure(err: HarombeError, **fields: Any) -> dict[str, Any]:
    if isinstance(err, GuardrailError):  # the scan's findings, as data
        fields["violations"] = list(err.violations)
    return {"success": False, **fields, "error": f"{err.kind}: {err}"}


def _without_host_paths(tool: str, result: dict[str, Any]) -> None:
    """Replace this host's paths in ``result``'s ``error`` (the caller's copy; the log keeps
    the original)."""
    error = result.get("error")
    if isinstance(error, str) and (shown := scrub_host_paths(error)) != error:
        log.info("tool.error_paths_hidden", tool=tool, error=error)
        result["error"] = shown


def _echo(value: object) -> object:
    """A raw argument as it may appear in a failed call's result: short text, else ``None``."""
    if is_a(value, str) and str.__len__(value) <= ECHO_MAX_CHARS:
        return exact_str(value)
    return None


def _parameters_of(
    source: Callable[Concatenate[Any, P], object], *, without: str
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """Give the decorated method ``source``'s parameters, less ``without``: one definition
    for callers, ``inspect.signature`` (and so tool schemas) and type checkers. (Type checkers
    see ``without`` too; at run time passing it is a ``TypeError``.)"""
    signature = inspect.signature(source)
    kept = [p for p in signature.parameters.values() if p.name != without]

    def give(method: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        returns = inspect.signature(method).return_annotation
        shared = signature.replace(parameters=kept, return_annotation=returns)
        method.__signature__ = shared  # type: ignore[attr-defined]
        return method

    return give


class CodeExecutionTools:
    """``code_execute``, ``code_install_package``, ``code_write_file``, ``code_read_file``,
    ``code_list_files`` and ``code_destroy_sandbox`` over one :class:`SandboxManager`.

    ``hitl_gate`` left out: the gate the manager's config describes
    (:func:`~harombe.security.approval.gate.gate_from_config`, with the approver
    ``security.hitl.approver`` names), or none when ``security.hitl.enabled`` is false; its
    policy is logged once as ``hitl.policy_announced``. ``hitl_gate=None``: no gate.

    ``profiles`` are the policy profiles ``code_execute(profile=...)`` may name; left out,
    they are those the manager checked when it started (:mod:`harombe.tools.profiles`)."""

    def __init__(
        self,
        sandbox_manager: SandboxManager,
        hitl_gate: HITLGate | None = FROM_CONFIG,
        *,
        profiles: Mapping[str, Profile] | ProfileSet | None = None,
    ) -> None:
        if hitl_gate is FROM_CONFIG:
            hitl_gate = gate_from_config(sandbox_manager.config)
            announce(hitl_gate, "library")
        if hitl_gate is not None and not callable(getattr(hitl_gate, "check_approval", None)):
            # A gate that cannot be consulted would let every call through: fail closed.
            got = type(hitl_gate).__name__
            raise UsageError(f"hitl_gate must be a harombe.security.hitl.HITLGate (got {got})")
        self.sandbox_manager = sandbox_manager
        self.hitl_gate = hitl_gate
        self.profiles = ProfileTable(
            sandbox_manager.config,
            profiles,
            loaded=lambda: getattr(sandbox_manager, "profile_set", None),
        )
        # Sandboxes talk to harombe over streams bound to one event loop: the loop these tools
        # were made on, or else the one of their first call.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    async def _call(self, tool: str, raw: dict[str, Any], plan: Planner) -> dict[str, Any]:
        """Validate ``raw``, plan, ask the gate, run: the three steps of the module docstring."""
        started = time.perf_counter()
        decision = None
        language: object = None
        try:
            self._check_loop()
            manager = self.sandbox_manager
            args = parse_args(
                TOOL_ARGS[tool],
                raw,
                max_bytes=manager.limits.max_file_bytes,
                network_default=manager.config.security.sandbox.network.enabled_by_default,
            )
            language = getattr(args, "language", None)
            made = plan(manager, self.hitl_gate, args)
            planned = made if isinstance(made, Plan) else await made
        except HarombeError as err:
            # Nothing was asked, created or touched: the arguments are refused as given.
            echoed = {k: _echo(v) for k, v in raw.items() if k in _ECHOED}
            result = shaped(tool, _failure(err, **echoed))
            _without_host_paths(tool, result)
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
        # Every result, a failure before the run too, has the keys of the tool's success.
        result = shaped(tool, result)
        lost = result.get("replaced_sandbox_id")
        if lost and self.hitl_gate is not None:
            # A lost sandbox's "approve for this sandbox" grants die with it; the replacement
            # starts with none.
            self.hitl_gate.forget_sandbox(str(lost))
        if decision is not None:
            result["approval"] = decision.summary()
        _without_host_paths(tool, result)
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
        network_enabled: bool | None = None,
        allowed_domains: Sequence[str] | None = None,
        *,
        fresh: bool = False,
        profile: str | None = None,
        output_mode: str | None = None,
        environment: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> dict[str, Any]:
        """Run ``code`` in ``sandbox_id`` (or a new sandbox); see the usage guide's result.

        Parameters are :class:`~harombe.tools.params.CodeExecuteArgs`. Python and JavaScript
        keep state between calls on one sandbox (``result`` is the repr of a final bare
        expression); ``fresh=True`` runs this call in a new process instead. ``timeout`` may
        exceed ``max_execution_time`` up to ``max_timeout_s``. ``network_enabled`` left out
        (``None``) is the config's ``network.enabled_by_default`` for a new sandbox. On an
        existing sandbox, the gate is shown the network that sandbox really has.
        ``on_output(stream, data)`` receives output as it is printed. ``profile`` names a
        policy profile (Python only): the code is scanned before anyone is asked, refused
        code comes back with ``violations``, and the sandbox runs under the profile's runtime
        layer for life. ``output_mode="llm"`` returns a long stream as head, marker and tail,
        the full text saved in the sandbox (``output_files``); left out, the config's default.
        ``environment`` names a configured dependency environment for a new Python sandbox.
        """
        raw = {
            "language": language,
            "code": code,
            "sandbox_id": sandbox_id,
            "timeout": timeout,
            "network_enabled": network_enabled,
            "allowed_domains": allowed_domains,
            "fresh": fresh,
            "profile": profile,
            "output_mode": output_mode,
            "environment": environment,
        }

        def plan(manager: SandboxManager, gate: HITLGate | None, args: Any) -> Awaitable[Plan]:
            return plans.execute(manager, gate, args, on_output, self.profiles)

        return await self._call("code_execute", raw, plan)

    @_parameters_of(code_execute, without="on_output")
    def code_execute_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        """``code_execute`` as a stream, with its parameters but ``on_output``: ``{"type":
        "stdout"|"stderr", "text": ...}`` items as the code prints, then ``{"type": "result",
        **result}``. Breaking out cancels the run. A wrong call raises ``TypeError`` when it is
        made, as ``code_execute``'s does."""
        # The parameters are code_execute's (one definition); checked now, not at iteration.
        _STREAM_SIGNATURE.bind(self, *args, **kwargs)
        return self._stream(args, kwargs)

    async def _stream(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        def start(on_output: OutputCallback) -> Awaitable[dict[str, Any]]:
            return self.code_execute(*args, **kwargs, on_output=on_output)

        # aclosing: leaving this generator must cancel the run now, not when the inner
        # generator is garbage-collected.
        async with contextlib.aclosing(iterate(start)) as items:
            async for item in items:
                if isinstance(item, OutputChunk):
                    yield {"type": item.stream, "text": item.text}
                else:
                    yield {"type": "result", **item}

    async def code_install_package(
        self,
        sandbox_id: str,
        package: str,
        registry: str = "pypi",
        *,
        on_progress: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None,
    ) -> dict[str, Any]:
        """Install ``package`` from ``registry`` (pypi or npm) into the sandbox.

        Parameters are :class:`~harombe.tools.params.InstallPackageArgs`. ``on_progress``
        (sync or async) is called with each step as ``{"stage", "package", "bytes",
        "message"}`` (stages: resolving, downloading, unpacking, compiling, installing,
        linking, checking, done); the build's own output never reaches this process's stderr."""
        raw = {"sandbox_id": sandbox_id, "package": package, "registry": registry}

        def plan(manager: SandboxManager, gate: HITLGate | None, args: Any) -> Plan:
            return plans.install_package(manager, gate, args, on_progress)

        return await self._call("code_install_package", raw, plan)

    async def code_write_file(
        self, sandbox_id: str, file_path: str, content: str
    ) -> dict[str, Any]:
        """Write ``content`` to ``/workspace/<file_path>``, creating parent directories.

        Parameters are :class:`~harombe.tools.params.WriteFileArgs`; ``file_path`` in the
        result is the normalised path that was written."""
        raw = {"sandbox_id": sandbox_id, "file_path": file_path, "content": content}
        return await self._call("code_write_file", raw, plans.write_file)

    async def code_read_file(
        self, sandbox_id: str, file_path: str, encoding: str = "utf-8"
    ) -> dict[str, Any]:
        """The UTF-8 text of ``/workspace/<file_path>``, or with ``encoding="base64"`` its
        bytes as base64 (with ``size_bytes`` and ``mime_type``).

        Parameters are :class:`~harombe.tools.params.ReadFileArgs`."""
        raw = {"sandbox_id": sandbox_id, "file_path": file_path, "encoding": encoding}
        return await self._call("code_read_file", raw, plans.read_file)

    async def code_list_files(self, sandbox_id: str, path: str = ".") -> dict[str, Any]:
        """Names in a workspace directory (``files``) and their details (``entries``).

        Parameters are :class:`~harombe.tools.params.ListFilesArgs`."""
        raw = {"sandbox_id": sandbox_id, "path": path}
        return await self._call("code_list_files", raw, plans.list_files)

    async def code_destroy_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy the sandbox and everything in it.

        Parameters are :class:`~harombe.tools.params.DestroySandboxArgs`."""
        raw = {"sandbox_id": sandbox_id}
        return await self._call("code_destroy_sandbox", raw, plans.destroy_sandbox)


#: code_execute_stream's parameters: code_execute's but on_output.
_STREAM_SIGNATURE = inspect.signature(CodeExecutionTools.code_execute_stream)

"""What each tool does once its arguments are valid: a :class:`Plan` per call.

A plan is made before the HITL gate is asked, from the validated arguments alone, and fixes
three things: the parameters the gate is shown (the values the call will really use: the
sandbox's own network, the capped timeout), the fields a failed result repeats, and the action
that runs once the call is approved. Making a plan may refuse the call (an unknown sandbox, an
image without the interpreter, a network change on an existing sandbox) but changes nothing;
only :attr:`Plan.run` acts. :mod:`harombe.tools.code_execution` runs every call through this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from harombe.config import INTERPRETERS, REGISTRY_LANGUAGES
from harombe.errors import InvalidArgumentError, UsageError
from harombe.security.approval.gate import ApprovalDecision, HITLGate
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.policy.paths import preview
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.artifacts import binary_content, mime_type
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.manager import SandboxManager
from harombe.tools.params import (
    CodeExecuteArgs,
    DestroySandboxArgs,
    InstallPackageArgs,
    ListFilesArgs,
    ReadFileArgs,
    WriteFileArgs,
)
from harombe.tools.profiles import ProfileTable, profile_for_call, scan

log = structlog.get_logger(__name__)

Run = Callable[[ApprovalDecision | None], Awaitable[dict[str, Any]]]


@dataclass
class Plan:
    """A validated call: what the gate is shown (``params``), what a failed result repeats
    (``fields``), the action, and what the debug log shows instead of ``params`` (if set)."""

    params: dict[str, Any]
    fields: dict[str, Any]
    run: Run
    log_params: dict[str, Any] | None = None


async def execute(
    manager: SandboxManager,
    gate: HITLGate | None,
    args: CodeExecuteArgs,
    on_output: OutputCallback | None = None,
    profiles: ProfileTable | None = None,
) -> Plan:
    """``code_execute``: run in ``args.sandbox_id``, or in a new sandbox made on approval.
    Under a profile, the code is scanned here, before the gate (see :func:`_profiled`)."""
    if on_output is not None and not callable(on_output):
        raise InvalidArgumentError("on_output must be a callable taking an output chunk")
    network, domains = bool(args.network_enabled), list(args.allowed_domains)
    box = manager.get(args.sandbox_id) if args.sandbox_id is not None else None
    if box is not None:
        _require(box, INTERPRETERS[args.language], args.language)
        _check_network_matches(args, box.sandbox_id, box.network_enabled, box.allowed_domains)
        # The sandbox's own network decides the risk, whatever this call repeats.
        network, domains = box.network_enabled, list(box.allowed_domains)
    _check_environment(manager, args)
    profile, timeout_s, warnings = await _profiled(manager, args, box, profiles)
    params = {
        "language": args.language,
        "code": args.code,
        "sandbox_id": args.sandbox_id,
        "timeout": timeout_s,
        "timeout_default_s": float(manager.limits.max_execution_time),
        "network_enabled": network,
        "allowed_domains": list(domains),
        "fresh": args.fresh,
        "profile": profile.name if profile is not None else None,
        **({"environment": args.environment} if args.environment is not None else {}),
    }

    async def run(decision: ApprovalDecision | None) -> dict[str, Any]:
        sid = args.sandbox_id
        if sid is None:
            created = await manager.create_sandbox(
                args.language, network_enabled=network, allowed_domains=list(domains),
                profile=profile, environment=args.environment,
            )  # fmt: skip
            sid = created.sandbox_id
            if decision is not None and gate is not None:
                # "Approve for this sandbox" given before the sandbox existed applies to it.
                gate.remember(decision, sid)
        try:
            result = await manager.execute(
                sid, args.code, language=args.language, timeout_s=timeout_s,
                on_output=on_output, fresh=True if args.fresh else None,
                output_mode=args.output_mode,
            )  # fmt: skip
        except BaseException:
            if args.sandbox_id is None:
                # A sandbox this call created and cannot return (the error result has no id)
                # would live on unseen until stop(): remove it now.
                await _discard(manager, sid)
            raise
        result.warnings[:0] = warnings
        return result.to_dict()

    return Plan(params, {"sandbox_id": args.sandbox_id}, run)


def _check_environment(manager: SandboxManager, args: CodeExecuteArgs) -> None:
    """An environment is for a new Python sandbox, and must be one the manager knows."""
    if args.environment is None:
        return
    if args.sandbox_id is not None:
        raise InvalidArgumentError(
            "environment applies to a new sandbox; leave it out when giving sandbox_id (the "
            "sandbox keeps the packages it was created with)"
        )
    if args.language != "python":
        raise InvalidArgumentError(
            f"environment holds Python packages; use language 'python', not {args.language!r}"
        )
    manager.environments.requirements_of(str(args.environment))  # UsageError naming the known


def install_package(
    manager: SandboxManager,
    gate: HITLGate | None,
    args: InstallPackageArgs,
    on_progress: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None,
) -> Plan:
    """``code_install_package``: the registry's interpreter must be in the sandbox's image;
    ``on_progress`` gets each step as a dict (``InstallProgress.as_dict``)."""
    if on_progress is not None and not callable(on_progress):
        raise InvalidArgumentError("on_progress must be a callable taking a progress dict")
    relay = None if on_progress is None else (lambda event: on_progress(event.as_dict()))
    box = manager.get(args.sandbox_id)
    _require(box, INTERPRETERS[REGISTRY_LANGUAGES[args.registry]], args.registry)
    fields = {"sandbox_id": args.sandbox_id, "package": args.package, "registry": args.registry}

    async def run(_: ApprovalDecision | None) -> dict[str, Any]:
        result = await manager.install_package(
            args.sandbox_id, args.package, args.registry, on_progress=relay
        )
        return {
            "success": result.success,
            **fields,
            "sandbox_id": result.sandbox_id,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "error": result.error,
            "warnings": result.warnings,
            "replaced_sandbox_id": result.replaced_sandbox_id or None,
        }

    return Plan(dict(fields), fields, run)


def write_file(manager: SandboxManager, gate: HITLGate | None, args: WriteFileArgs) -> Plan:
    """``code_write_file``: the debug log gets the content's size, not the content."""
    manager.get(args.sandbox_id)
    fields = {"sandbox_id": args.sandbox_id, "file_path": args.file_path}

    async def run(_: ApprovalDecision | None) -> dict[str, Any]:
        written = await manager.write_file(args.sandbox_id, args.file_path, args.content)
        return {"success": True, **fields, "written_bytes": written, "error": None}

    params = {**fields, "content": args.content}
    return Plan(params, fields, run, {**fields, "content_chars": len(args.content)})


def read_file(manager: SandboxManager, gate: HITLGate | None, args: ReadFileArgs) -> Plan:
    """``code_read_file``: a file that is not UTF-8 text is a failed result, not an error;
    ``encoding="base64"`` returns any file's bytes. The gate sees the path, not the encoding:
    a binary read is the same read."""
    manager.get(args.sandbox_id)
    fields = {"sandbox_id": args.sandbox_id, "file_path": args.file_path}

    async def run(_: ApprovalDecision | None) -> dict[str, Any]:
        data = await manager.read_file(args.sandbox_id, args.file_path)
        out = {**fields, "content": None, "read_bytes": len(data), "error": None}
        if args.encoding == "base64":
            return {"success": True, **out, **binary_content(args.file_path, data)}
        # A text read has the binary read's keys too: one shape per tool.
        out.update(encoding="utf-8", size_bytes=len(data), mime_type=mime_type(args.file_path))
        try:
            out["content"] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            out["error"] = (
                f"UnicodeDecodeError: {args.file_path} is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); read its bytes with encoding='base64'"
            )
        return {"success": out["error"] is None, **out}

    return Plan(dict(fields), fields, run)


def list_files(manager: SandboxManager, gate: HITLGate | None, args: ListFilesArgs) -> Plan:
    """``code_list_files``: a listing cut at the entry cap says so in ``warnings``."""
    manager.get(args.sandbox_id)
    fields = {"sandbox_id": args.sandbox_id, "path": args.path}

    async def run(_: ApprovalDecision | None) -> dict[str, Any]:
        listing = await manager.list_directory(args.sandbox_id, args.path)
        entries = listing.entries
        cut = (
            f"the directory holds {listing.total} entries; only the first {len(entries)} by "
            "name are listed"
        )
        return {
            "success": True,
            **fields,
            "files": [e["name"] for e in entries],
            "entries": entries,
            "total": listing.total,
            "truncated": listing.truncated,
            "warnings": [cut] if listing.truncated else [],
            "error": None,
        }

    return Plan(dict(fields), fields, run)


def destroy_sandbox(
    manager: SandboxManager, gate: HITLGate | None, args: DestroySandboxArgs
) -> Plan:
    """``code_destroy_sandbox``: the sandbox's "approve for this sandbox" grants go with it."""
    manager.get(args.sandbox_id)
    fields = {"sandbox_id": args.sandbox_id}

    async def run(_: ApprovalDecision | None) -> dict[str, Any]:
        await manager.destroy_sandbox(args.sandbox_id)
        if gate is not None:
            gate.forget_sandbox(args.sandbox_id)
        return {"success": True, **fields, "error": None}

    return Plan(dict(fields), fields, run)


async def _profiled(
    manager: SandboxManager, args: CodeExecuteArgs, box: Any, profiles: ProfileTable | None
) -> tuple[Profile | None, float, list[str]]:
    """The call's profile (the sandbox's, or ``args.profile`` from ``profiles`` for a new
    one), its timeout and warnings. The code is scanned now: refused code reaches neither a
    human nor a sandbox, and an observe-mode finding becomes a warning of the result."""
    table = profiles if profiles is not None else ProfileTable(manager.config, {})
    profile = profile_for_call(
        table, args.profile, box=box, language=args.language, fresh=args.fresh
    )
    # Capped here so the gate sees the timeout the run gets; the cap's warning (if any) goes
    # into the result, since the manager is handed the capped value.
    timeout_s, warnings = manager.effective_timeout(args.timeout, profile)
    if profile is not None:
        warnings += await scan(args.code, profile, sandbox_id=args.sandbox_id)
    return profile, timeout_s, warnings


async def _discard(manager: SandboxManager, sandbox_id: str) -> None:
    """Destroy ``sandbox_id``, even while the calling task is being cancelled; never raises."""
    task = asyncio.ensure_future(manager.destroy_sandbox(sandbox_id))
    try:
        await asyncio.shield(task)
    except BaseException as exc:  # noqa: BLE001 - cleanup of an already failing call
        error = f"{type(exc).__name__}: {preview(str(exc))}"
        log.warning("tool.discard_failed", sandbox_id=sandbox_id, error=error)


def _require(box: Any, interpreter: str, what: str) -> None:
    """Refuse, before anyone is asked, a call the sandbox's image cannot run."""
    if not box.has(interpreter):
        raise UsageError(
            f"{what} needs {interpreter}, which sandbox {box.sandbox_id}'s image {box.image} "
            f"lacks; leave out sandbox_id to create a sandbox with an image for it"
        )


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

"""Run code with a host directory: ``run_sandboxed(code=… | script_path=…, mnt_dir=…)``.

The directory's regular files and directories are copied into a fresh gVisor sandbox at
``/mnt`` (an empty tmpfs every sandbox has; never a bind mount of the host directory, so
nothing the code does there can reach the host), the code runs with ``/mnt`` as its working
directory, and afterwards the sandbox's ``/mnt`` is scanned and what changed is copied back
into the directory: created and modified files, new directories, deletions. Symbolic links,
hard links, FIFOs, sockets and devices the code left in ``/mnt`` are refused and reported, the
rest still applies; size limits apply both ways (:class:`MountLimits`). The sandbox is
destroyed afterwards, also on an error, a timeout or Ctrl-C. See :mod:`harombe.mounts_host`
for how the host directory is read and written.

What changed is found by a scan inside the sandbox, so code that tampers with it can at most
make the report wrong: the host checks every field of it, fetches each file's bytes through
the supervisor (which never follows a link out of ``/mnt`` and never blocks on a FIFO) and
checks them against the scan's hash, and writes nothing but regular files and directories,
inside ``mnt_dir``, within the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import secrets
import shlex
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog

from harombe.config import LANGUAGES, HarombeConfig, load_config
from harombe.errors import (
    DependencyInstallError,
    HarombeError,
    MountError,
    PackageFetchError,
    PackageSpecError,
    UsageError,
)
from harombe.mounts_compat import RunResult, SandboxConfig, get_default_sandbox_config, read_call
from harombe.mounts_gate import decide_run
from harombe.mounts_host import (
    MountLimits,
    Plan,
    Snapshot,
    apply_changes,
    snapshot,
)
from harombe.mounts_scan import SCAN_SOURCE, checked_scan, plan_changes, refuse_writes
from harombe.security.approval.gate import FROM_CONFIG, HITLGate
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.sandbox import MNT, ExecutionResult, Sandbox
from harombe.security.runtime.tasks import settle

__all__ = [
    "MountLimits",
    "RunResult",
    "SandboxConfig",
    "get_default_sandbox_config",
    "run_sandboxed",
    "run_sandboxed_async",
]

log = structlog.get_logger(__name__)

#: How each language's program is started in ``/mnt``: a script by its path, ``code`` on stdin
#: (so that Python's ``sys.path[0]`` is ``/mnt`` and ``import helper`` finds ``/mnt/helper.py``).
INTERPRETERS = {"python": "python3", "javascript": "node", "shell": "bash"}
EXTENSIONS = {".py": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
              ".sh": "shell", ".bash": "shell"}  # fmt: skip
SCAN_TIMEOUT_S = 120.0
#: Moves the session interpreter to ``/mnt`` before Python ``code`` runs there.
SESSION_PRELUDE = (
    f"import os as _o, sys as _s\n_o.chdir({MNT!r})\n_s.path.insert(0, {MNT!r})\ndel _o, _s\n"
)
MAX_SCAN_BYTES = 64 << 20
OutputCallback = Callable[[str, bytes], Any]


def run_sandboxed(
    conf: SandboxConfig | HarombeConfig | str | None = None,
    /,
    code: str | None = None,
    *,
    script_path: str | None = None,
    mnt_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    network: bool = False,
    allowed_domains: Sequence[str] = (),
    language: str | None = None,
    limits: MountLimits | None = None,
    config: HarombeConfig | None = None,
    gate: HITLGate | None = FROM_CONFIG,
) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run ``code`` (or the script at ``script_path`` under ``/mnt``) in a fresh sandbox with
    ``mnt_dir`` copied in at ``/mnt``; apply what the run changed there back to ``mnt_dir``.

    ``conf``, first and positional only, is sandbubble's: a :class:`SandboxConfig` (e.g.
    :func:`get_default_sandbox_config`; see :mod:`harombe.mounts_compat` for how its fields
    map), a harombe config, or left out; given a string there, it is the code, as before.

    Returns ``(result, changed_files)``. ``result`` is a :class:`RunResult`: harombe's result
    dict (``status``, ``exit_code``, ``stdout``, ``stderr``, …) plus ``refused`` (changes not
    applied, each with its ``reason``) and ``mount_error`` (why nothing came back, or None),
    whose keys also read as attributes, with sandbubble's ``res.returncode`` (the exit code).
    ``changed_files``
    lists each applied change as ``{"path", "change": created|modified|deleted,
    "type": file|directory, "size_bytes"}``, paths relative to ``mnt_dir``. Plain sync code:
    it starts and stops its own sandbox manager (from inside a running event loop it does so
    on a thread of its own); :func:`run_sandboxed_async` can reuse a started one. Raises
    :class:`MountError` for a directory that cannot be copied in, :class:`UsageError` for bad
    arguments, :class:`~harombe.errors.ApprovalDeniedError` when the gate refuses the run
    (``gate`` left out: the one ``security.hitl`` describes; ``None``: no gate); user-code
    failures are data in ``result``."""
    call = run_sandboxed_async(
        conf,
        code,
        script_path=script_path,
        mnt_dir=mnt_dir,
        timeout=timeout,
        network=network,
        allowed_domains=allowed_domains,
        language=language,
        limits=limits,
        config=config,
        gate=gate,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    done: dict[str, Any] = {}

    def in_thread() -> None:
        try:
            done["value"] = asyncio.run(call)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            done["error"] = exc

    worker = threading.Thread(target=in_thread, name="harombe-run-sandboxed")
    worker.start()
    worker.join()
    if "error" in done:
        raise done["error"]
    value: tuple[RunResult, list[dict[str, Any]]] = done["value"]
    return value


async def run_sandboxed_async(
    conf: SandboxConfig | HarombeConfig | str | None = None,
    /,
    code: str | None = None,
    *,
    script_path: str | None = None,
    mnt_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 (seconds; the program's own limit)
    network: bool = False,
    allowed_domains: Sequence[str] = (),
    language: str | None = None,
    limits: MountLimits | None = None,
    config: HarombeConfig | None = None,
    manager: SandboxManager | None = None,
    on_output: OutputCallback | None = None,
    gate: HITLGate | None = FROM_CONFIG,
) -> tuple[RunResult, list[dict[str, Any]]]:
    """:func:`run_sandboxed` for async code. With ``manager`` (started), the sandbox comes
    from it (its warm pool when offline); else one is started and stopped for this call.
    ``on_output(stream, data)`` gets the program's output as it is printed."""
    asked = read_call(conf, code, config=config, network=network, allowed_domains=allowed_domains)
    if manager is not None and asked.limited:
        raise UsageError(
            "SandboxConfig's memory_mb and cpus apply to the manager run_sandboxed "
            "starts; with manager=, set them in that manager's config"
        )
    job = await _job(
        asked,
        script_path,
        mnt_dir,
        timeout_s=timeout,
        language=language,
        limits=limits,
        on_output=on_output,
    )
    config = manager.config if manager is not None else (asked.config or load_config())
    await decide_run(
        gate,
        config,
        job.code,
        job.script_path,
        job.snap,
        lang=job.lang,
        timeout_s=job.timeout_s,
        network=job.network,
        allowed_domains=job.allowed_domains,
    )
    if manager is not None:
        out, changed = await _run(manager, job)
    else:
        async with _own_manager(config) as own:
            out, changed = await _run(own, job)
    out["warnings"] = [*asked.warnings, *out.get("warnings", [])]
    return RunResult(out), changed


@dataclasses.dataclass(frozen=True)
class _Job:
    """One run, its arguments checked: the program, the copied-in directory and the sandbox's
    language, network and dependencies."""

    code: str | None
    script_path: str | None
    snap: Snapshot | None
    lang: str
    timeout_s: float | None
    network: bool
    allowed_domains: Sequence[str]
    limits: MountLimits
    on_output: OutputCallback | None
    dependencies: Sequence[str]


async def _job(
    asked: Any,
    script_path: str | None,
    mnt_dir: str | os.PathLike[str] | None,
    *,
    timeout_s: float | None,
    language: str | None,
    limits: MountLimits | None,
    on_output: OutputCallback | None,
) -> _Job:
    """The run ``asked`` (:func:`~harombe.mounts_compat.read_call`) describes, checked, with
    ``mnt_dir`` read; :class:`UsageError` or :class:`MountError` for what cannot run."""
    lang = _language(asked.code, script_path, language)
    limits = limits or MountLimits()
    _check_script(script_path, has_mnt=mnt_dir is not None)
    snap = None if mnt_dir is None else await asyncio.to_thread(snapshot, mnt_dir, limits)
    if isinstance(script_path, str) and snap is not None:
        rel = posixpath.normpath(script_path)[len(MNT) + 1 :]  # below /mnt: checked above
        if rel not in snap.files:
            raise UsageError(
                f"script_path {script_path!r} is not a file in mnt_dir {snap.root!r}; "
                "put it there first"
            )
    if asked.dependencies and lang != "python":
        raise UsageError(
            f"venv_path's packages are for Python code, not {lang}; leave "
            "venv_path out of the SandboxConfig"
        )
    return _Job(
        code=asked.code,
        script_path=script_path,
        snap=snap,
        lang=lang,
        timeout_s=timeout_s,
        network=asked.network or bool(asked.allowed_domains),
        allowed_domains=asked.allowed_domains,
        limits=limits,
        on_output=on_output,
        dependencies=asked.dependencies,
    )


def _language(code: object, script_path: object, language: str | None) -> str:
    if (code is None) == (script_path is None):
        raise UsageError("give exactly one of code= (the program's text) and script_path= "
                         "(a file under /mnt, e.g. '/mnt/code.py')")  # fmt: skip
    if code is not None and not isinstance(code, str):
        raise UsageError(f"code must be a string, got {type(code).__name__}")
    if language is None:
        ext = os.path.splitext(script_path)[1].lower() if isinstance(script_path, str) else ""
        language = EXTENSIONS.get(ext, "python")
    if language not in LANGUAGES:
        raise UsageError(f"unknown language {str(language)[:40]!r}; use one of "
                         f"{', '.join(LANGUAGES)}")  # fmt: skip
    return language


def _check_script(script_path: object, *, has_mnt: bool) -> None:
    if script_path is None:
        return
    normal = posixpath.normpath(script_path) if isinstance(script_path, str) else ""
    if not normal.startswith(f"{MNT}/"):  # also '/mnt/../etc/passwd': it climbs out of /mnt
        raise UsageError(f"script_path must be a file under {MNT}, e.g. '{MNT}/code.py'; "
                         f"got {str(script_path)[:80]!r}: give a path under {MNT}")  # fmt: skip
    if not has_mnt:
        raise UsageError("script_path names a file under /mnt: pass mnt_dir= (the host "
                         "directory that holds it) too")  # fmt: skip


@contextlib.asynccontextmanager
async def _own_manager(config: HarombeConfig | None) -> AsyncIterator[SandboxManager]:
    """A manager for one call, with no warm pool (a pooled sandbox would only be removed)."""
    from harombe.cli.common import started_manager, with_limits
    from harombe.config import load_config

    async with started_manager(with_limits(config or load_config())) as manager:
        yield manager


async def _run(manager: SandboxManager, job: _Job) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    code, script_path, snap, lang = job.code, job.script_path, job.snap, job.lang
    try:  # dependencies (a venv's packages): a dependency environment, from the install cache
        box = await manager.create_sandbox(
            lang,  # type: ignore[arg-type]  # checked by _language
            network_enabled=job.network,
            allowed_domains=tuple(job.allowed_domains),
            environment=list(job.dependencies) or None,
        )
    except (PackageSpecError, PackageFetchError) as err:
        raise DependencyInstallError(f"the packages of venv_path did not install: {err}") from err
    made = [box.sandbox_id]
    try:
        for archive in snap.archives if snap is not None else ():
            async with box.lock:
                await manager.files.untar(box, archive, root=MNT)
        result = await _program(
            manager, box, lang, code, script_path, timeout_s=job.timeout_s, on_output=job.on_output
        )
        made.append(result.sandbox_id)
        out = result.to_dict()
        for key in ("changed_files", "changed_files_truncated"):  # those describe /workspace
            out.pop(key, None)
        out.update(language=lang, refused=[], mount_error=None,
                   mnt_dir=snap.root if snap else None)  # fmt: skip
        changed: list[dict[str, Any]] = []
        if snap is not None and result.sandbox_id != box.sandbox_id:
            out["mount_error"] = "the sandbox was lost during the run; nothing came back"
        elif snap is not None:
            # Nothing larger than the channel carries in one frame (the config's limit).
            cap = min(job.limits.max_file_bytes, manager.limits.max_file_bytes)
            limits = dataclasses.replace(job.limits, max_file_bytes=cap)
            changed = await _bring_back(manager, box, snap, limits, out, made=made)
        log.info("mounts.ran", sandbox_id=box.sandbox_id, status=out["status"],
                 changed=len(changed), refused=len(out["refused"]))  # fmt: skip
        return out, changed
    finally:
        for sandbox_id in dict.fromkeys(made):
            with contextlib.suppress(HarombeError):
                await settle(manager.destroy_sandbox(sandbox_id))


async def _program(
    manager: SandboxManager, box: Sandbox, lang: str, code: str | None,
    script_path: str | None, *, timeout_s: float | None, on_output: OutputCallback | None,
) -> ExecutionResult:  # fmt: skip
    """Run the program in ``/mnt``. Python ``code`` runs in the sandbox's session
    interpreter (warm in a pooled sandbox: no interpreter start-up), moved to ``/mnt``
    first; a script, and other languages, run as a new process that bash starts there."""
    if code is not None and lang == "python":
        moved = await manager.execute(box.sandbox_id, SESSION_PRELUDE, language="python",
                                      fresh=False, output_mode="full")  # fmt: skip
        if not moved.success:
            return moved
        return await manager.execute(box.sandbox_id, code, language="python", fresh=False,
                                     timeout_s=timeout_s, on_output=on_output,
                                     output_mode="full")  # fmt: skip
    command = await _command(manager, box, lang, code, script_path)
    return await manager.execute(box.sandbox_id, command, language="shell",
                                 timeout_s=timeout_s, on_output=on_output, fresh=True,
                                 output_mode="full")  # fmt: skip


async def _command(
    manager: SandboxManager, box: Sandbox, lang: str, code: str | None, script_path: str | None
) -> str:
    """The shell command that runs the program in ``/mnt``; ``code`` goes to a file in
    ``/tmp`` first (outside ``/mnt``: it is not among the changes)."""
    interpreter = INTERPRETERS[lang]
    if script_path is not None:
        return f"cd {MNT} && exec {interpreter} {shlex.quote(posixpath.normpath(script_path))}"
    assert code is not None
    name = f"harombe-main-{secrets.token_hex(6)}"
    async with box.lock:
        await manager.files.request(box, {"op": "write", "root": "/tmp", "path": name},
                                    code.encode("utf-8", "surrogateescape"))  # fmt: skip
    if lang == "shell":
        return f"cd {MNT} && exec bash /tmp/{name}"
    return f"cd {MNT} && exec {interpreter} - < /tmp/{name}"


async def _bring_back(
    manager: SandboxManager, box: Sandbox, snap: Snapshot, limits: MountLimits,
    out: dict[str, Any], *, made: list[str],
) -> list[dict[str, Any]]:  # fmt: skip
    """Scan ``/mnt``, fetch what changed, apply it to the host directory; ``out`` gets the
    refusals (or ``mount_error``: nothing was applied). Returns the applied changes. A
    sandbox the manager started in place of a lost one is added to ``made``."""
    try:
        entries = await _scan(manager, box, limits, made=made)
        plan = plan_changes(snap, entries, limits)
        contents = await _fetch(manager, box, snap, plan)
        changed, refused = await asyncio.to_thread(apply_changes, snap, plan, contents)
    except MountError as exc:
        out["mount_error"] = str(exc)
        return []
    out["refused"] = refused
    return changed


async def _scan(
    manager: SandboxManager, box: Sandbox, limits: MountLimits, *, made: list[str]
) -> list[dict[str, Any]]:
    name = f".harombe-scan-{secrets.token_hex(6)}.json"
    code = f"{SCAN_SOURCE}\n_harombe_scan_mnt('/tmp/{name}', {limits.max_entries})\n"
    # The session interpreter: warm in a pooled Python sandbox, so no interpreter start-up.
    result = await manager.execute(box.sandbox_id, code, language="python", fresh=False,
                                   timeout_s=SCAN_TIMEOUT_S, output_mode="full")  # fmt: skip
    made.append(result.sandbox_id)  # a replacement for a lost sandbox is removed too
    if result.sandbox_id != box.sandbox_id or not result.success:
        why = (result.stderr.strip() or result.error or result.status)[-300:]
        raise MountError(f"the scan of /mnt after the run failed ({why}); nothing was applied")
    try:
        async with box.lock:
            _, data = await manager.files.request(
                box, {"op": "read", "root": "/tmp", "path": name,
                      "max_bytes": min(MAX_SCAN_BYTES, manager.limits.max_file_bytes)},
            )  # fmt: skip
    except HarombeError as exc:  # the code subverted the scan: no answer, or one too large
        raise MountError(f"the scan of /mnt after the run left no readable answer ({exc}); "
                         "nothing was applied") from None  # fmt: skip
    try:
        raw = json.loads(data)
    except ValueError:
        raw = None
    return checked_scan(raw, limits)


async def _fetch(
    manager: SandboxManager, box: Sandbox, snap: Snapshot, plan: Plan
) -> dict[str, bytes]:
    """The bytes of every file ``plan`` writes, read through the supervisor (which never
    blocks on a FIFO); one that changed since the scan is refused instead, and the host's
    entries it would have replaced are kept."""
    contents: dict[str, bytes] = {}
    refused: dict[str, str] = {}
    for path, entry in list(plan.writes.items()):
        async with box.lock:
            msg = {"op": "read", "root": MNT, "path": path, "max_bytes": entry["size"]}
            try:
                _, data = await manager.files.request(box, msg)
            except HarombeError as exc:
                data, reason = None, f"could not be read back: {exc}"
        if data is not None and hashlib.sha256(data).hexdigest() == entry["sha256"]:
            contents[path] = data
            continue
        if data is not None:
            reason = "changed while it was being copied back"
        refused[path] = reason
    refuse_writes(plan, snap, refused)
    return contents

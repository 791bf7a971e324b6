"""One ``@sandbox`` call, on the private loop: gate, claim, install, write, run, read, discard.

1. With a HITL gate, the call is decided before anything is made: each dependency as a
   ``code_install_package`` operation, then the function as a ``code_execute`` operation whose
   ``code`` is the function's source (``inspect.getsource``; a comment naming the function when
   there is none, e.g. a lambda typed at a prompt), so the gate's code analysis judges the
   function's own text (not what it calls). A denial raises
   :class:`~harombe.errors.ApprovalDeniedError`.
2. A prepared sandbox is claimed (see :mod:`harombe.decorator_runner`: from the manager's
   warm pool, cloudpickle imported, nothing else run; one with network is started new); it
   runs this call only and is removed afterwards, in the background.
3. With the install cache (the default), the dependencies are a dependency environment: the
   sandbox of step 2 is claimed from that environment's own pool, with the set on its path
   (built on the first call). Without it (``disable_cache=True``), each dependency is
   installed with ``SandboxManager.install_package``. A failure raises
   :class:`~harombe.errors.DependencyInstallError` naming the package.
4. The pickled call (see :mod:`harombe.decorator_wire`) is written, the runner executed under
   ``timeout_sec`` (capped to ``max_timeout_s``), and the answer read back and decoded without
   trusting it (see :mod:`harombe.decorator_decode`).
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import structlog

from harombe.decorator_decode import loads_answer
from harombe.decorator_runner import Runner
from harombe.decorator_wire import CALL_PATH, MAX_ERROR_CHARS, RESULT_PATH, runner_code
from harombe.errors import (
    DependencyInstallError,
    FileError,
    PackageFetchError,
    PackageSpecError,
    SandboxExecutionError,
    SandboxTimeoutError,
    SerializationError,
)
from harombe.security.approval.gate import HITLGate, Operation
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.sandbox import ExecutionResult

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CallSpec:
    """A decorated function's settings, checked once when it was decorated."""

    name: str
    source: str
    is_async: bool
    first_line: int = 1
    lines: tuple[str, ...] = ()
    dependencies: tuple[str, ...] = ()
    memory_mb: int = 1024
    timeout_s: float = 30.0
    cpus: float = 1.0
    allowed_domains: tuple[str, ...] = ()
    disable_cache: bool = False
    gate: HITLGate | None = field(default=None, compare=False)


def function_source(fn: Any) -> tuple[str, int, list[str]]:
    """What the gate is shown as the function's code (dedented), and its first line number
    and lines as written (for the remote traceback); a comment when there is no source."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        name = getattr(fn, "__qualname__", repr(fn))
        return f"# source of {name} is not available (defined at a prompt or generated)\n", 1, []
    return textwrap.dedent("".join(lines)), max(first, 1), lines


def uses_install_cache(spec: CallSpec) -> bool:
    """Whether the call's dependencies go through the host's install cache: unless
    ``disable_cache`` (which matters only when there are dependencies)."""
    return not (spec.disable_cache and spec.dependencies)


async def _decide(gate: HITLGate, spec: CallSpec, manager: SandboxManager) -> None:
    for package in spec.dependencies:
        op = Operation("code_install_package",
                       {"sandbox_id": None, "package": package, "registry": "pypi"})  # fmt: skip
        decision = await gate.check_approval(op)
        if not decision.approved:
            raise decision.error()
    timeout_s, _ = manager.effective_timeout(spec.timeout_s)
    params = {
        "language": "python", "code": spec.source, "sandbox_id": None, "timeout": timeout_s,
        "timeout_default_s": float(manager.limits.max_execution_time),
        "network_enabled": bool(spec.allowed_domains),
        "allowed_domains": list(spec.allowed_domains), "fresh": True, "profile": None,
        "function": spec.name, "dependencies": list(spec.dependencies),
    }  # fmt: skip
    decision = await gate.check_approval(Operation("code_execute", params))
    if not decision.approved:
        raise decision.error()


async def run_call(runner: Runner, spec: CallSpec, call: bytes) -> Any:
    """Run one pickled call (``call``) in a fresh sandbox; its return value, or the errors of
    the module docstring."""
    cached = uses_install_cache(spec)
    manager = await runner.manager(spec.memory_mb, spec.cpus, install_cache=cached)
    if spec.gate is not None:
        await _decide(spec.gate, spec, manager)
    # Through the install cache, the dependencies are an environment: its sandboxes come from
    # its own pool with the set installed. Without it, each is installed by the sandbox's pip.
    in_environment = spec.dependencies if cached else ()
    sandbox_id = await runner.claim(manager, spec.allowed_domains, in_environment)
    used = {sandbox_id}
    try:
        for package in () if cached else spec.dependencies:
            used.add(await _install(manager, sandbox_id, package))
        cap = manager.limits.max_file_bytes
        if len(call) > cap:
            raise SerializationError(
                f"{spec.name}'s pickled function and arguments take {len(call)} bytes, over "
                f"the sandbox's max_file_bytes of {cap}; pass less data, or raise "
                "security.sandbox.limits.max_file_bytes"
            )
        await manager.write_file(sandbox_id, CALL_PATH, call)
        code = runner_code(max_result_bytes=cap, is_async=spec.is_async,
                           source=(spec.first_line, list(spec.lines)))  # fmt: skip
        result = await manager.execute(sandbox_id, code, timeout_s=spec.timeout_s)
        used.add(result.sandbox_id)
        _forward_output(result)
        _check_status(spec, result, manager)
        try:
            answer = await manager.read_file(sandbox_id, RESULT_PATH)
        except FileError as err:
            if "max_file_bytes" in str(err):  # only a forged answer: the runner checks its size
                raise SerializationError(
                    f"{spec.name}'s answer is over the sandbox's max_file_bytes of {cap}; "
                    "return less data, or raise security.sandbox.limits.max_file_bytes"
                ) from None
            raise _no_answer(result, str(err)) from None
    finally:
        runner.discard(manager, used)
    return decode(spec, answer, cap)


async def _install(manager: SandboxManager, sandbox_id: str, package: str) -> str:
    try:
        result = await manager.install_package(sandbox_id, package, "pypi")
    except (PackageSpecError, PackageFetchError) as err:
        raise DependencyInstallError(f"dependency {package!r} did not install: {err}") from err
    if not result.success:
        why = (result.error or "").strip() or result.stderr.strip()[-800:] or result.status
        raise DependencyInstallError(f"dependency {package!r} did not install: {why}")
    return result.sandbox_id


def _forward_output(result: ExecutionResult) -> None:
    """What the function printed, onto this process's stdout and stderr."""
    if result.stdout:
        sys.stdout.write(result.stdout)
    if result.stderr:
        sys.stderr.write(result.stderr)


def _check_status(spec: CallSpec, result: ExecutionResult, manager: SandboxManager) -> None:
    if result.status == "timeout":
        _, capped = manager.effective_timeout(spec.timeout_s)
        how = capped[0] if capped else "raise timeout_sec if it needs longer"
        raise SandboxTimeoutError(
            f"TimeoutError: {spec.name} ran past its timeout of {result.timeout_s:g} s and was "
            f"stopped; {how}",
            error_type="TimeoutError",
        )
    if result.status == "oom":
        raise SandboxExecutionError(
            f"MemoryError: {spec.name} used more than its memory_mb={spec.memory_mb} and was "
            "stopped; raise memory_mb if it needs more",
            error_type="MemoryError",
        )
    if result.status in ("lost", "cancelled"):
        raise SandboxExecutionError(
            f"SandboxLost: the sandbox running {spec.name} ended ({result.error or 'lost'})",
            error_type="SandboxLost",
        )


def _no_answer(result: ExecutionResult, why: str) -> SandboxExecutionError:
    return SandboxExecutionError(
        f"ProcessExit: the function's process ended (exit code {result.exit_code}) before it "
        f"returned ({why[:200]})\n{result.stderr[-2000:]}",
        error_type="ProcessExit",
        traceback_str=result.stderr[-MAX_ERROR_CHARS:],
    )


def decode(spec: CallSpec, answer: bytes, cap: int) -> Any:
    """The return value in ``answer`` (an envelope from the sandbox, untrusted), or the error
    it describes."""
    if len(answer) > cap:
        raise SerializationError(f"{spec.name}'s answer is {len(answer)} bytes, over {cap}")
    envelope = loads_answer(answer)
    kind = envelope.get("kind") if isinstance(envelope, dict) else None
    if kind == "return" and set(envelope) == {"kind", "value"}:
        return envelope["value"]
    if kind == "raise":
        error_type, message, trace = (
            _text(envelope.get(key)) for key in ("error_type", "message", "traceback")
        )
        raise SandboxExecutionError(
            f"{error_type}: {message}\n{trace}", error_type=error_type, traceback_str=trace
        )
    if kind in ("unencodable", "too_large"):
        detail = f"{_text(envelope.get('message'))}{_text(envelope.get('bytes'))}"
        raise SerializationError(
            f"{spec.name} returned a {_text(envelope.get('type'))} that cannot cross back "
            f"({kind.replace('_', ' ')}: {detail[:300]}); return plain data (builtin scalars "
            "and containers, datetimes, Decimal, Fraction, UUID, collections' OrderedDict, "
            f"defaultdict, deque, Counter) of at most {cap} bytes encoded"
        )
    if kind == "version":
        inside = ".".join(_text(v) for v in envelope.get("version") or ())
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise SerializationError(
            f"the sandbox runs Python {inside}, this process {here}; functions cross as "
            f"bytecode, so run harombe under Python {inside} or use an image with Python {here}"
        )
    raise SerializationError(f"the sandbox's answer for {spec.name} is not an envelope")


def _text(value: object) -> str:
    """A field of an untrusted envelope as text: a string (capped), a small int, else ""."""
    if isinstance(value, str):
        return value[:MAX_ERROR_CHARS]
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() < 64:
        return str(value)
    return ""

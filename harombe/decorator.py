"""``@sandbox``: call a Python function, and have it run in a fresh gVisor sandbox.

::

    from harombe import sandbox

    @sandbox(dependencies=["toml==0.10.2"], memory_mb=1024, timeout_sec=30)
    def to_toml(data: dict) -> str:
        import toml
        return toml.dumps(data)

    to_toml({"a": 1})     # "a = 1\n", computed in a sandbox that is removed afterwards

The function, its arguments and keyword arguments cross by cloudpickle (closures, lambdas and
local functions work); the return value comes back as plain data only, as tagged JSON (see
:mod:`harombe.decorator_wire`: the host never unpickles what a sandbox sends). Each call
gets a fresh sandbox from the warm pool, so two calls never see each other's globals or files,
and it has the sandbox's clean environment, never the host's variables.

* ``dependencies``: pip requirements (``"pandas>=2.0"``), installed into each call's sandbox
  with ``SandboxManager.install_package`` (offline sandbox, host-side download, through the
  host's install cache); a malformed or failing one raises
  :class:`~harombe.errors.DependencyInstallError` naming it.
* ``memory_mb``, ``cpus``: the sandbox's limits (one manager and warm pool per distinct pair);
  a call over ``memory_mb`` raises :class:`~harombe.errors.SandboxExecutionError` with
  ``error_type == "MemoryError"``.
* ``timeout_sec``: the function's run (unpickling included) is stopped after it and
  :class:`~harombe.errors.SandboxTimeoutError` raised.
* ``allow_network``: a list of domain names (``"*.example.com"`` patterns allowed) that the
  sandbox may reach through harombe's egress proxy; ``None`` or ``[]``: no network. ``True``
  is refused: list the domains.
* ``disable_cache``: with dependencies, install them without the host's install cache: the
  sandbox's own pip installs freshly downloaded wheels, and no cached environment is read or
  filled (a manager of its own, with ``install_cache.enabled: false``). Without dependencies
  it changes nothing: every call gets a fresh sandbox anyway.
* ``gate``: a :class:`~harombe.security.hitl.HITLGate`; each call is then decided before it
  runs (see :mod:`harombe.decorator_call`), and a denial raises
  :class:`~harombe.errors.ApprovalDeniedError`. :func:`configure` sets a default gate; without
  either, the gate the configuration describes (``security.hitl``, with its approver) decides,
  and none when ``security.hitl.enabled`` is false.

A remote exception raises :class:`~harombe.errors.SandboxExecutionError`
(``"{type}: {message}\\n{traceback}"``, with ``error_type`` and ``traceback_str``). Sync functions
stay sync (no event loop of the caller's is needed, and calling from inside one works); async
functions give async wrappers; :func:`sandbox_async` always gives an async wrapper.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from harombe.config import HarombeConfig
from harombe.decorator_call import CallSpec, function_source, run_call
from harombe.decorator_runner import Runner
from harombe.decorator_wire import dumps_call
from harombe.errors import (
    ConfigError,
    DependencyInstallError,
    InvalidArgumentError,
    PackageSpecError,
)
from harombe.security.approval.gate import HITLGate, gate_from_config
from harombe.security.approval.policy_line import announce
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.policy.package_specs import parse_spec

F = TypeVar("F", bound=Callable[..., Any])
_state_lock = threading.RLock()  # reentrant: a signal handler may call in while it is held
_runner: Runner | None = None
_default_gate: HITLGate | None = None
_config: HarombeConfig | None = None
_config_gate: list[tuple[Runner, HITLGate | None]] = []  # the runner's config's gate, once built


def configure(*, config: HarombeConfig | None = None, gate: HITLGate | None = None) -> None:
    """Set the configuration the ``@sandbox`` managers are made with (``None``: the usual
    :func:`~harombe.config.load_config`) and the gate of functions decorated without one.
    Sandboxes already made by earlier calls are removed; the next call starts afresh."""
    global _runner, _default_gate, _config
    if config is not None and not isinstance(config, HarombeConfig):
        raise InvalidArgumentError("config must be a harombe.config.HarombeConfig")
    _check_gate(gate)
    with _state_lock:
        old, _runner, _default_gate, _config = _runner, None, gate, config
        _config_gate.clear()
    if old is not None:
        old.shutdown()


def shutdown() -> None:
    """Remove every ``@sandbox`` sandbox and stop the private loop now (it also happens at
    interpreter exit); a later call starts them again."""
    configure(config=_config, gate=_default_gate)


def runner() -> Runner:
    """The current private loop and its managers (made on first use)."""
    global _runner
    with _state_lock:
        if _runner is None:
            _runner = Runner(_config)
        return _runner


def _gate_of_config(current: Runner) -> HITLGate | None:
    """The gate the ``security.hitl`` of ``current``'s config describes, built on first use
    (its policy logged once)."""
    with _state_lock:
        if not _config_gate or _config_gate[0][0] is not current:
            from harombe.config import load_config

            gate = gate_from_config(current.config or load_config())
            announce(gate, "decorator")
            _config_gate[:] = [(current, gate)]
        return _config_gate[0][1]


def _check_gate(gate: object) -> None:
    if gate is not None and not callable(getattr(gate, "check_approval", None)):
        raise InvalidArgumentError(
            f"gate must be a harombe.security.hitl.HITLGate (got {type(gate).__name__})"
        )


def _number(name: str, value: object, *, low: float, high: float, whole: bool = False) -> float:
    kinds = (int,) if whole else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    ok = ok and low <= value <= high  # type: ignore[operator]  # exact: no float(10**400)
    if not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
        kind = "a whole number" if whole else "a number"
        raise InvalidArgumentError(f"{name} must be {kind} from {low:g} to {high:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _dependencies(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidArgumentError(
            f"dependencies must be a list of pip requirements, e.g. ['pandas>=2.0'] "
            f"(got {type(value).__name__})"
        )
    for item in value:
        if not isinstance(item, str):
            raise InvalidArgumentError(f"dependency {item!r} is not a string; write 'name>=1.0'")
        try:
            parse_spec(item, "pypi")
        except PackageSpecError as err:
            raise DependencyInstallError(f"dependency {item!r} cannot be installed: {err}") from err
    return tuple(value)


def _domains(value: object) -> tuple[str, ...]:
    if value is None or value is False:
        return ()
    if value is True:
        raise InvalidArgumentError(
            "allow_network=True would let the function reach every host; list the domains it "
            "needs instead, e.g. allow_network=['api.example.com', '*.example.org']"
        )
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, list | tuple):
        raise InvalidArgumentError(
            f"allow_network must be a list of domain names, e.g. ['api.example.com'] "
            f"(got {type(value).__name__})"
        )
    if not all(isinstance(item, str) for item in value):
        raise InvalidArgumentError(
            "allow_network must be a list of domain names (strings), e.g. ['api.example.com']"
        )
    domains = tuple(value)
    try:
        Allowlist.parse(domains)
    except ConfigError as err:
        raise InvalidArgumentError(f"allow_network: {err}") from None
    return domains


def _spec(fn: Callable[..., Any], options: dict[str, Any], *, is_async: bool) -> CallSpec:
    if not callable(fn):
        raise InvalidArgumentError(f"@sandbox decorates functions, not {type(fn).__name__}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise InvalidArgumentError("@sandbox cannot run generators; return a list instead")
    if not isinstance(options["disable_cache"], bool):
        raise InvalidArgumentError("disable_cache must be True or False")
    _check_gate(options["gate"])
    source, first_line, lines = function_source(fn)
    return CallSpec(
        name=getattr(fn, "__qualname__", None) or repr(fn),
        source=source,
        is_async=is_async,
        first_line=first_line,
        lines=tuple(lines),
        dependencies=_dependencies(options["dependencies"]),
        memory_mb=int(_number("memory_mb", options["memory_mb"], low=32, high=1 << 20, whole=True)),
        timeout_s=_number("timeout_sec", options["timeout_sec"], low=0.001, high=86_400),
        cpus=_number("cpus", options["cpus"], low=0.01, high=64),
        allowed_domains=_domains(options["allow_network"]),
        disable_cache=options["disable_cache"],
        gate=options["gate"],
    )


def _prepare(spec: CallSpec, fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Runner, Any]:
    """The runner one call is submitted to and the call's coroutine on it, with the default
    gate filled in. The arguments are pickled first (that runs their code, which may call
    configure()); the runner is then looked up once, so a call never spans two runners."""
    data = dumps_call(fn, tuple(args), dict(kwargs))
    current = runner()
    if spec.gate is None:
        spec = dataclasses.replace(spec, gate=_default_gate or _gate_of_config(current))
    return current, run_call(current, spec, data)


def _wrap(fn: F, options: dict[str, Any], *, force_async: bool) -> F:
    is_async = inspect.iscoroutinefunction(fn)
    spec = _spec(fn, options, is_async=is_async)
    if is_async or force_async:

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            current, call = _prepare(spec, fn, args, kwargs)
            return await asyncio.wrap_future(current.submit(call))

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            current, call = _prepare(spec, fn, args, kwargs)
            return current.call(call)

        wrapper = sync_wrapper
    wrapper._is_sandboxed = True
    wrapper._sandbox_config = {
        "dependencies": list(spec.dependencies), "memory_mb": spec.memory_mb,
        "timeout_sec": spec.timeout_s, "cpus": spec.cpus,
        "allow_network": list(spec.allowed_domains), "disable_cache": spec.disable_cache,
    }  # fmt: skip
    return wrapper  # type: ignore[no-any-return]


def _decorator(force_async: bool, dependencies: Any, options: dict[str, Any]) -> Any:
    if callable(dependencies):  # bare @sandbox, without parentheses
        return _wrap(dependencies, {**options, "dependencies": None}, force_async=force_async)
    options["dependencies"] = dependencies
    _spec(lambda: None, options, is_async=False)  # bad options fail at decoration

    def decorate(fn: F) -> F:
        return _wrap(fn, options, force_async=force_async)

    return decorate


def sandbox(
    dependencies: Sequence[str] | None = None,
    memory_mb: int = 1024,
    timeout_sec: float = 30,
    cpus: float = 1,
    allow_network: Sequence[str] | None = None,
    disable_cache: bool = False,
    *,
    gate: HITLGate | None = None,
) -> Callable[[F], F]:
    """Run the decorated function in a fresh sandbox on each call (see the module docstring);
    a sync function stays sync, an async one stays async."""
    options = dict(memory_mb=memory_mb, timeout_sec=timeout_sec, cpus=cpus,
                   allow_network=allow_network, disable_cache=disable_cache, gate=gate)  # fmt: skip
    return _decorator(False, dependencies, options)  # type: ignore[no-any-return]


def sandbox_async(
    dependencies: Sequence[str] | None = None,
    memory_mb: int = 1024,
    timeout_sec: float = 30,
    cpus: float = 1,
    allow_network: Sequence[str] | None = None,
    disable_cache: bool = False,
    *,
    gate: HITLGate | None = None,
) -> Callable[[F], Callable[..., Any]]:
    """As :func:`sandbox`, but the wrapper is always a coroutine function (a sync function's
    call is awaited as well)."""
    options = dict(memory_mb=memory_mb, timeout_sec=timeout_sec, cpus=cpus,
                   allow_network=allow_network, disable_cache=disable_cache, gate=gate)  # fmt: skip
    return _decorator(True, dependencies, options)  # type: ignore[no-any-return]


__all__ = ["configure", "runner", "sandbox", "sandbox_async", "shutdown"]

"""``@sandbox`` without Docker: argument checks, the wrappers' shape, the lazy export, and whole
calls through the private loop over FakeDocker (a fake guest that plays the runner)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harombe import decorator
from harombe.config import parse_config
from harombe.decorator_call import CallSpec, uses_install_cache
from harombe.decorator_encode import answer, envelope
from harombe.decorator_runner import Runner
from harombe.decorator_wire import CALL_PATH, RESULT_PATH
from harombe.errors import (
    ApprovalDeniedError,
    DependencyInstallError,
    ImageNotFoundError,
    InvalidArgumentError,
    SandboxExecutionError,
    SandboxStartError,
    SandboxStartupError,
    SandboxTimeoutError,
    SerializationError,
    UsageError,
)
from harombe.security.approval import approvers
from harombe.security.hitl import HITLGate
from harombe.testing import (
    FakeDocker,
    FakeGuest,
    RunOutcome,
    ScriptedApprover,
    capture_events,
    code_of,
    echo_handler,
)
from tests.unit.fake_manager import started_sandboxes

BAD_OPTIONS = {
    "network-true": ({"allow_network": True}, InvalidArgumentError, "list the domains"),
    "network-str": ({"allow_network": "example.com"}, InvalidArgumentError, "list of domain"),
    "network-bytes": ({"allow_network": b"example.com"}, InvalidArgumentError, "list of domain"),
    "network-url": ({"allow_network": ["https://x.com/a"]}, InvalidArgumentError, "bare host"),
    "network-ip": ({"allow_network": ["10.0.0.1"]}, InvalidArgumentError, "IP address"),
    "deps-str": ({"dependencies": "pandas"}, InvalidArgumentError, "list of pip"),
    "deps-int": ({"dependencies": [3]}, InvalidArgumentError, "not a string"),
    "deps-git": ({"dependencies": ["git+https://example.com/x.git"]}, DependencyInstallError,
                 "git+https"),
    "deps-option": ({"dependencies": ["--index-url=http://x"]}, DependencyInstallError,
                    "--index-url"),
    "memory-zero": ({"memory_mb": 0}, InvalidArgumentError, "memory_mb"),
    "memory-bool": ({"memory_mb": True}, InvalidArgumentError, "memory_mb"),
    "memory-str": ({"memory_mb": "1g"}, InvalidArgumentError, "memory_mb"),
    "memory-float": ({"memory_mb": 512.5}, InvalidArgumentError, "whole number"),
    "timeout-zero": ({"timeout_sec": 0}, InvalidArgumentError, "timeout_sec"),
    "timeout-nan": ({"timeout_sec": float("nan")}, InvalidArgumentError, "timeout_sec"),
    "timeout-inf": ({"timeout_sec": float("inf")}, InvalidArgumentError, "timeout_sec"),
    "cpus-zero": ({"cpus": 0}, InvalidArgumentError, "cpus"),
    "cpus-huge": ({"cpus": 1000}, InvalidArgumentError, "cpus"),
    "cache-str": ({"disable_cache": "yes"}, InvalidArgumentError, "disable_cache"),
    "gate-object": ({"gate": object()}, InvalidArgumentError, "HITLGate"),
}  # fmt: skip


@pytest.mark.parametrize(("options", "error", "needle"), list(BAD_OPTIONS.values()),
                         ids=list(BAD_OPTIONS))  # fmt: skip
def test_bad_options_fail_when_decorating(
    options: dict[str, Any], error: type[Exception], needle: str
) -> None:
    """Every option is checked once, at decoration, with a message that says how to fix it."""
    with pytest.raises(error, match=None) as raised:
        decorator.sandbox(**options)
    assert needle in str(raised.value)


def test_good_options_are_recorded() -> None:
    """Valid options decorate, and the wrapper records them (as pctx-sandbox does)."""
    wrapped = decorator.sandbox(["six==1.16.0"], 2048, 5, 2, ["api.example.com"], True)(len)
    assert wrapped._sandbox_config == {  # type: ignore[attr-defined]
        "dependencies": ["six==1.16.0"], "memory_mb": 2048, "timeout_sec": 5.0, "cpus": 2.0,
        "allow_network": ["api.example.com"], "disable_cache": True,
    }  # fmt: skip


def test_generators_and_non_callables_are_refused() -> None:
    """A generator cannot return a value to pickle; a non-callable is not a function."""

    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(InvalidArgumentError, match="generators"):
        decorator.sandbox()(gen)
    with pytest.raises(InvalidArgumentError, match="functions"):
        decorator.sandbox()(42)  # type: ignore[type-var]


async def _coro(x: int) -> int:
    return x


def _plain(x: int) -> int:
    return x


SHAPES = {
    "sync-stays-sync": (decorator.sandbox(), _plain, False),
    "async-stays-async": (decorator.sandbox(), _coro, True),
    "sandbox_async-of-sync": (decorator.sandbox_async(), _plain, True),
    "sandbox_async-of-async": (decorator.sandbox_async(), _coro, True),
    "bare-decorator": (decorator.sandbox, _plain, False),
}


@pytest.mark.parametrize(("wrap", "fn", "is_async"), list(SHAPES.values()), ids=list(SHAPES))
def test_wrappers_keep_the_functions_shape(
    wrap: Callable[[Any], Any], fn: Callable[..., Any], is_async: bool
) -> None:
    """Sync functions stay sync, async ones async (sandbox_async: always async); the name,
    docstring and signature are the function's."""
    wrapped = wrap(fn)
    assert inspect.iscoroutinefunction(wrapped) is is_async
    assert wrapped.__name__ == fn.__name__
    assert inspect.signature(wrapped) == inspect.signature(fn)
    assert wrapped._is_sandboxed is True


def test_import_harombe_stays_light_and_exports_the_decorator() -> None:
    """``import harombe`` loads neither the decorator nor cloudpickle; ``from harombe import
    sandbox, sandbox_async`` gives the decorator's functions."""
    code = (
        "import sys, harombe\n"
        "light = 'harombe.decorator' not in sys.modules and 'cloudpickle' not in sys.modules\n"
        "from harombe import sandbox, sandbox_async\n"
        "import harombe.decorator as d\n"
        "print(light, sandbox is d.sandbox, sandbox_async is d.sandbox_async)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    assert done.stdout.split() == ["True", "True", "True"]


def test_a_sync_call_on_the_private_loop_is_refused() -> None:
    """A sync @sandbox call made on the private loop's own thread (an approver, a callback)
    would wait for itself: UsageError saying what to do instead."""
    runner = Runner()

    async def nested() -> None:
        runner.call(asyncio.sleep(0))

    try:
        with pytest.raises(UsageError, match="sandbox_async"):
            runner.submit(nested()).result(10)
    finally:
        runner.shutdown()
    with pytest.raises(UsageError, match="shut down"):
        runner.submit(asyncio.sleep(0))


class FakeRunnerGuest:
    """Fake guests that play the runner: they unpickle the call, run it on the host (it is
    the test's own function) and write the envelope; ``mode`` makes them misbehave."""

    def __init__(self, mode: str = "run") -> None:
        self.mode = mode
        self.guests: list[FakeGuest] = []
        self.ran: list[FakeGuest] = []

    def factory(self) -> FakeGuest:
        guest = FakeGuest()
        guest.handler = functools.partial(self.handle, guest)
        self.guests.append(guest)
        return guest

    def handle(self, guest: FakeGuest, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        if "_harombe_call" not in code_of(msg, stdin):
            return echo_handler(msg, stdin)  # the warm-up
        self.ran.append(guest)
        if self.mode in ("timeout", "oom"):
            return RunOutcome(status=self.mode, exit_code=-9)
        if self.mode == "exit":
            return RunOutcome(exit_code=3, stderr="killed itself\n")
        if self.mode == "forged":
            forged = b"cos\nsystem\n(Vtouch /tmp/pwned\ntR."
            guest.files[f"/workspace/{RESULT_PATH}"] = forged
            return RunOutcome()
        fn, args, kwargs = pickle.loads(guest.files[f"/workspace/{CALL_PATH}"])
        try:
            data = answer(fn(*args, **kwargs), 1 << 20)
        except Exception as exc:  # noqa: BLE001 - the runner reports every exception
            data = envelope({"kind": "raise", "error_type": type(exc).__name__,
                             "message": str(exc), "traceback": "Traceback: fake\n"})  # fmt: skip
        guest.files[f"/workspace/{RESULT_PATH}"] = data
        return RunOutcome(stdout="from inside\n")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeRunnerGuest, FakeDocker]]:
    """The decorator's private loop over one FakeDocker whose guests play the runner."""
    guests = FakeRunnerGuest()
    docker = FakeDocker(guest_factory=guests.factory)
    config = parse_config({"security": {"sandbox": {"pool": {"size": 1}}}})
    runner = Runner(config, docker_factory=lambda: docker)
    monkeypatch.setattr(decorator, "_runner", runner)
    monkeypatch.setattr(decorator, "_default_gate", None)
    yield guests, docker
    runner.shutdown()
    assert docker.containers == {}  # shutdown removed every sandbox


def test_sync_calls_return_values_each_in_its_own_sandbox(
    fake: tuple[FakeRunnerGuest, FakeDocker], capsys: pytest.CaptureFixture[str]
) -> None:
    """Three calls run in three different sandboxes, each removed after its call; the
    function's output is printed here."""
    guests, docker = fake
    offset = 10
    add = decorator.sandbox()(lambda x: {"value": x + offset})
    assert [add(i) for i in range(3)] == [{"value": 10}, {"value": 11}, {"value": 12}]
    assert len(set(map(id, guests.ran))) == 3
    assert capsys.readouterr().out == "from inside\n" * 3
    runner = decorator.runner()
    runner.call(runner.settled())
    live_guests = {id(c.guest) for c in docker.containers.values()}
    assert not live_guests & set(map(id, guests.ran))  # each call's sandbox was removed
    assert len(docker.containers) == 1 + 2  # what is left: the warm pool and the ready ones


@pytest.mark.parametrize("form", ["sync", "async"])
def test_one_call_starts_one_sandbox_and_a_second_starts_the_pools(
    fake: tuple[FakeRunnerGuest, FakeDocker], form: str
) -> None:
    """The first call boots its own sandbox and nothing else (no pool, no prepared ones to
    wait for); the second call still answers, and starts the warm pool and prepared ones."""
    _, docker = fake
    double = (decorator.sandbox_async if form == "async" else decorator.sandbox)()(lambda x: 2 * x)

    def call(x: int) -> Any:
        return asyncio.run(double(x)) if form == "async" else double(x)

    runner = decorator.runner()
    started = started_sandboxes(docker)
    assert call(21) == 42
    runner.call(runner.settled())
    assert list(started.values()) == [False]  # one sandbox, booted for the call
    assert docker.containers == {}  # removed after its call; nothing else was made
    assert call(4) == 8
    runner.call(runner.settled())
    assert len(docker.containers) == 1 + 2  # now: the warm pool and the prepared ones


async def test_async_calls_are_awaited_from_the_callers_loop(
    fake: tuple[FakeRunnerGuest, FakeDocker],
) -> None:
    """An async wrapper awaits the private loop's future; concurrent calls both finish."""

    @decorator.sandbox_async()
    def square(x: int) -> int:
        return x * x

    assert await asyncio.gather(square(3), square(4)) == [9, 16]


def test_a_remote_exception_raises_sandbox_execution_error(
    fake: tuple[FakeRunnerGuest, FakeDocker],
) -> None:
    """The function's exception comes back as SandboxExecutionError with its type."""

    @decorator.sandbox()
    def fails() -> None:
        raise KeyError("missing")

    with pytest.raises(SandboxExecutionError) as raised:
        fails()
    assert raised.value.error_type == "KeyError"
    assert str(raised.value).startswith("KeyError: 'missing'\n")


OUTCOMES = {
    "timeout": (SandboxTimeoutError, "TimeoutError"),
    "oom": (SandboxExecutionError, "MemoryError"),
    "exit": (SandboxExecutionError, "ProcessExit"),
}


@pytest.mark.parametrize(("mode", "error", "error_type"), [(m, *v) for m, v in OUTCOMES.items()],
                         ids=list(OUTCOMES))  # fmt: skip
def test_timeouts_memory_and_exits_map_to_errors(
    fake: tuple[FakeRunnerGuest, FakeDocker], mode: str, error: type[Exception], error_type: str
) -> None:
    """A timeout is SandboxTimeoutError (a TimeoutError too); out of memory and a process that
    ended without an answer are SandboxExecutionError with their error_type."""
    fake[0].mode = mode
    with pytest.raises(error) as raised:
        decorator.sandbox(timeout_sec=1)(_plain)(1)
    assert raised.value.error_type == error_type  # type: ignore[attr-defined]
    if mode == "timeout":
        assert isinstance(raised.value, TimeoutError)


def test_a_forged_answer_is_refused_on_the_host(
    fake: tuple[FakeRunnerGuest, FakeDocker], tmp_path: Any
) -> None:
    """A sandbox that writes an os.system pickle as its answer gets SerializationError: the
    answer must be JSON, so nothing in it is unpickled."""
    fake[0].mode = "forged"
    with pytest.raises(SerializationError, match="not valid JSON"):
        decorator.sandbox()(_plain)(1)


def test_a_denied_call_claims_no_sandbox(fake: tuple[FakeRunnerGuest, FakeDocker]) -> None:
    """With a gate, the function's source and its dependencies are decided first; a denial
    raises ApprovalDeniedError and nothing runs."""
    approver = ScriptedApprover([True], default=False)
    gate = HITLGate(approver=approver)

    @decorator.sandbox(dependencies=["six==1.16.0"], gate=gate)
    def guarded(x: int) -> int:
        return x + 1

    with pytest.raises(ApprovalDeniedError):
        guarded(1)
    tools = [r.operation.tool_name for r in approver.requests]
    assert tools == ["code_install_package", "code_execute"]
    shown = approver.requests[1].operation.params
    assert "return x + 1" in shown["code"] and shown["dependencies"] == ["six==1.16.0"]
    assert fake[0].ran == []


def test_no_image_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager that cannot start raises SandboxStartupError (a SandboxStartError) with the
    cause chained."""
    docker = FakeDocker(images=())
    runner = Runner(parse_config({}), docker_factory=lambda: docker)
    monkeypatch.setattr(decorator, "_runner", runner)
    try:
        with pytest.raises(SandboxStartupError) as raised:
            decorator.sandbox()(_plain)(1)
    finally:
        runner.shutdown()
    assert isinstance(raised.value, SandboxStartError)
    assert isinstance(raised.value.__cause__, ImageNotFoundError)


def test_limits_pick_a_manager_of_their_own(fake: tuple[FakeRunnerGuest, FakeDocker]) -> None:
    """memory_mb and cpus become the limits of the manager (and pool) the call runs on; the
    defaults (1024 MB, 1 CPU) get theirs."""
    decorator.sandbox(memory_mb=256, cpus=2)(_plain)(1)
    decorator.sandbox()(_plain)(2)
    runner = decorator.runner()
    limits = {
        key: (m.limits.max_memory_mb, m.limits.max_cpu_cores)
        for key, m in ((k, runner.call(runner.manager(*k))) for k in [(256, 2.0), (1024, 1.0)])
    }
    assert limits == {(256, 2.0): (256, 2.0), (1024, 1.0): (1024, 1.0)}


def test_configure_sets_the_default_gate(
    fake: tuple[FakeRunnerGuest, FakeDocker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function decorated without a gate is gated by the one configure() set."""
    approver = ScriptedApprover(default=False)
    monkeypatch.setattr(decorator, "_default_gate", HITLGate(approver=approver))
    with pytest.raises(ApprovalDeniedError):
        decorator.sandbox()(_plain)(1)
    assert [r.operation.tool_name for r in approver.requests] == ["code_execute"]
    assert fake[0].ran == []


def test_without_a_gate_the_configs_gate_decides(
    fake: tuple[FakeRunnerGuest, FakeDocker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a gate of its own or configure()'s, the config's gate decides: plain code runs,
    a function that starts programs (CRITICAL) is denied at once where nobody can be asked,
    and the policy is logged once."""
    monkeypatch.setattr(approvers, "stdin_is_tty", lambda: False)

    @decorator.sandbox()
    def risky() -> int:
        import subprocess

        return subprocess.call(["true"])

    with capture_events() as events:
        assert decorator.sandbox()(_plain)(1) is not None
        with pytest.raises(ApprovalDeniedError, match=r"security\.hitl\.approver"):
            risky()
    announced = [e for e in events if e["event"] == "hitl.policy_announced"]
    assert [e["surface"] for e in announced] == ["decorator"]
    assert len(fake[0].ran) == 1


CACHE_CHOICES = {
    "default": ({}, True),
    "disabled-with-dependencies": ({"dependencies": ("six",), "disable_cache": True}, False),
    "disabled-without-dependencies": ({"disable_cache": True}, True),
    "dependencies-cached": ({"dependencies": ("six",)}, True),
}


@pytest.mark.parametrize(("fields", "cached"), list(CACHE_CHOICES.values()),
                         ids=list(CACHE_CHOICES))  # fmt: skip
def test_disable_cache_bypasses_the_install_cache_for_dependencies(
    fields: dict[str, Any], cached: bool
) -> None:
    """disable_cache=True sends a call with dependencies to a manager whose install cache is
    off; without dependencies it changes nothing."""
    spec = CallSpec(name="f", source="", is_async=False, **fields)
    assert uses_install_cache(spec) is cached


def test_a_manager_without_the_install_cache(fake: tuple[FakeRunnerGuest, FakeDocker]) -> None:
    """The runner makes a separate manager, with install_cache.enabled false, for such calls."""
    runner = decorator.runner()
    manager = runner.call(runner.manager(1024, 1.0, install_cache=False))
    assert manager.config.security.sandbox.install_cache.enabled is False
    default = runner.call(runner.manager(1024, 1.0))
    assert default is not manager and default.config.security.sandbox.install_cache.enabled


def test_a_closed_runner_hands_out_no_manager_or_sandbox() -> None:
    """After shutdown(), manager() and claim() refuse: a call that raced configure() starts
    no manager and claims no sandbox that nothing would remove."""
    closed = Runner(docker_factory=FakeDocker)
    closed.shutdown()
    with pytest.raises(UsageError, match="shut down"):
        asyncio.run(closed.manager(256, 1.0))
    with pytest.raises(UsageError, match="shut down"):
        asyncio.run(closed.claim(None))  # type: ignore[arg-type]

"""``@sandbox`` against real gVisor: values and exceptions cross, limits hold, calls are
isolated from each other and from the host, and no container outlives the process."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harombe import decorator, sandbox, sandbox_async
from harombe.config import load_config
from harombe.errors import (
    DependencyInstallError,
    InvalidArgumentError,
    SandboxExecutionError,
    SandboxTimeoutError,
    SerializationError,
)
from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import HITLGate
from harombe.security.runtime.sandbox import ENV_MOUNT, LABEL_OWNER
from harombe.testing import ScriptedApprover

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _fresh_runner() -> Iterator[None]:
    """One private loop for this module, shut down (its sandboxes removed) at the end. The
    config's gate is off: these tests are not about it (a lambda written inside a table is a
    fragment that does not parse, which the gate rates CRITICAL)."""
    off = {**os.environ, "HAROMBE__SECURITY__HITL__ENABLED": "false"}
    decorator.configure(config=load_config(environ=off))
    yield
    decorator.shutdown()


@sandbox()
def describe(value: Any) -> dict[str, Any]:
    """Echo a value with facts about where it ran."""
    import socket

    return {"value": value, "host": socket.gethostname(), "uid": os.getuid()}


def test_a_sync_call_returns_nested_plain_data() -> None:
    """Nested containers, datetimes and Decimals come back equal, from a sandbox user."""
    value = {"a": [1, (2, 3), {4}], "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
             "price": decimal.Decimal("9.99"), "raw": b"\x00\xff", "none": None}  # fmt: skip
    answer = describe(value)
    assert answer["value"] == value
    assert answer["uid"] == 1000 and answer["host"] != os.uname().nodename


async def test_an_async_function_is_awaited_in_the_sandbox() -> None:
    """An async def runs to completion inside; the wrapper is awaited from this loop."""

    @sandbox()
    async def later(x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 2

    assert await later(21) == 42


def _closure() -> Callable[[int], int]:
    base = 100

    def add(x: int) -> int:
        return base + x

    return add


def _local_function() -> Callable[[int], int]:
    def triple(x: int) -> int:
        return 3 * x

    return triple


FUNCTIONS = {
    "closure": (_closure(), 5, 105),
    "lambda": (lambda x: [x] * 2, 7, [7, 7]),
    "local-function": (_local_function(), 4, 12),
}


@pytest.mark.parametrize(("fn", "arg", "expected"), list(FUNCTIONS.values()), ids=list(FUNCTIONS))
def test_closures_lambdas_and_local_functions_run(
    fn: Callable[[int], Any], arg: int, expected: object
) -> None:
    """cloudpickle carries closures, lambdas and local functions into the sandbox."""
    assert sandbox()(fn)(arg) == expected


def test_a_remote_exception_carries_its_traceback() -> None:
    """SandboxExecutionError("{type}: {msg}\\n{traceback}") with the remote frames."""

    @sandbox()
    def parse(text: str) -> int:
        return int(text)

    with pytest.raises(SandboxExecutionError) as raised:
        parse("twelve")
    err = raised.value
    assert err.error_type == "ValueError"
    assert str(err).startswith("ValueError: invalid literal for int() with base 10: 'twelve'\n")
    assert "in parse" in err.traceback_str and "return int(text)" in err.traceback_str


def test_a_timeout_stops_the_function() -> None:
    """A function past timeout_sec is stopped: SandboxTimeoutError."""

    @sandbox(timeout_sec=1)
    def sleepy() -> None:
        import time

        time.sleep(30)

    with pytest.raises(SandboxTimeoutError, match="timeout of 1 s"):
        sleepy()


def test_memory_over_the_limit_is_a_memory_error() -> None:
    """Using more than memory_mb ends the call: SandboxExecutionError, error_type MemoryError."""

    @sandbox(memory_mb=64)
    def hog() -> int:
        blocks = [bytearray(16 * 1024 * 1024) for _ in range(16)]
        return len(blocks)

    with pytest.raises(SandboxExecutionError) as raised:
        hog()
    assert raised.value.error_type == "MemoryError"


@sandbox()
def leave_traces() -> dict[str, Any]:
    """Report what an earlier call could have left, then leave the same traces."""
    import builtins
    import sys as guest_sys

    seen = {
        "global": hasattr(builtins, "harombe_probe"),
        "file": os.path.exists("/workspace/probe.txt"),
        "module": "probe_module" in guest_sys.modules,
    }
    builtins.harombe_probe = 1  # type: ignore[attr-defined]
    with open("/workspace/probe.txt", "w") as f:
        f.write("left behind")
    guest_sys.modules["probe_module"] = guest_sys
    return seen


def test_calls_are_isolated_from_each_other() -> None:
    """The second call sees none of the first call's globals, files or modules."""
    nothing = {"global": False, "file": False, "module": False}
    assert leave_traces() == nothing
    assert leave_traces() == nothing


def test_host_environment_variables_do_not_reach_the_function() -> None:
    """A secret in this process's environment is not in the function's environment."""
    os.environ["HAROMBE_DECORATOR_SECRET"] = "s3cret-value"
    try:
        environment = sandbox()(lambda: dict(os.environ))()
    finally:
        del os.environ["HAROMBE_DECORATOR_SECRET"]
    assert "HAROMBE_DECORATOR_SECRET" not in environment
    assert "s3cret-value" not in environment.values()


def test_a_blanket_network_yes_is_refused() -> None:
    """allow_network=True is refused before anything runs: list the domains."""
    with pytest.raises(InvalidArgumentError, match="list the domains"):
        sandbox(allow_network=True)  # type: ignore[arg-type]


def test_allowed_domains_go_through_the_egress_proxy() -> None:
    """With allow_network the sandbox reaches only harombe's egress proxy, which refuses a
    host outside the list (no outside address is contacted)."""

    @sandbox(allow_network=["allowed.example.com"])
    def probe() -> str:
        import socket
        import urllib.parse

        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as s:
            s.sendall(b"CONNECT not-allowed.example.net:443 HTTP/1.1\r\n"
                      b"Host: not-allowed.example.net:443\r\n\r\n")  # fmt: skip
            return s.recv(200).decode("latin-1").split("\r\n")[0]

    status = probe()
    assert status.startswith("HTTP/1.1 403"), status


def test_dependencies_are_installed_for_the_call() -> None:
    """A pip requirement is installed into the call's sandbox and importable there."""

    @sandbox(dependencies=["toml==0.10.2"])
    def dump() -> str:
        import toml

        return str(toml.dumps({"a": 1}))

    assert dump() == "a = 1\n"


def _module_file() -> str:
    import toml

    return str(toml.__file__)


def test_disable_cache_installs_without_the_install_cache() -> None:
    """By default a dependency comes from the host's install cache (mounted read-only);
    disable_cache=True installs it with the sandbox's own pip instead."""
    cached = sandbox(dependencies=["toml==0.10.2"])(_module_file)()
    uncached = sandbox(dependencies=["toml==0.10.2"], disable_cache=True)(_module_file)()
    assert cached.startswith(ENV_MOUNT + "/")
    assert uncached.startswith("/home/") and "site-packages/toml" in uncached


def test_a_missing_dependency_names_the_package() -> None:
    """A requirement the index does not have: DependencyInstallError naming it."""

    @sandbox(dependencies=["harombe-no-such-package-zz==1.0"])
    def never() -> None:
        return None

    with pytest.raises(DependencyInstallError, match="harombe-no-such-package-zz"):
        never()


def test_a_return_value_that_is_not_plain_data_is_a_serialization_error() -> None:
    """A return value that cannot cross (a lambda) is a SerializationError, not a crash."""
    with pytest.raises(SerializationError, match="function"):
        sandbox()(lambda: (lambda: 1))()


async def test_a_sync_call_works_inside_a_running_event_loop() -> None:
    """Called from async code (as in Jupyter), the sync wrapper runs on harombe's own loop
    and returns without deadlocking this one."""
    assert describe("from a loop")["value"] == "from a loop"
    assert await sandbox_async()(lambda: "awaited")() == "awaited"


def test_a_gate_sees_the_source_and_can_approve() -> None:
    """With a gate, the approver is shown the function's source; approved, the call runs."""
    approver = ScriptedApprover(default=True)

    @sandbox(gate=HITLGate(approver=approver))
    def gated() -> str:
        return "ran after approval"

    assert gated() == "ran after approval"
    shown = approver.requests[-1].operation
    assert shown.tool_name == "code_execute"
    assert 'return "ran after approval"' in shown.params["code"]


async def test_no_container_outlives_the_process(docker_manager: DockerManager) -> None:
    """A script that calls a decorated function and simply exits leaves no container."""
    script = textwrap.dedent(
        """
        from harombe import sandbox
        from harombe.security.runtime.sandbox import process_owner
        print(process_owner(), flush=True)
        print(sandbox()(lambda: 6 * 7)(), flush=True)
        """
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    owner, answer = done.stdout.split("\n")[:2]
    assert answer == "42"
    assert await docker_manager.list_containers({LABEL_OWNER: owner}) == []

"""Properties that hold for any arguments at all, checked with hypothesis against real gVisor.

Every tool (and ``code_execute_stream``) is driven with generated arguments: wrong types,
``None``, huge strings, lone surrogates, NaN, negative numbers, nested lists and dicts, with
valid values mixed in so that some calls really run. For every call:

* a result dict comes back, never an exception; ``success`` is a bool, and a failure has a
  non-empty, bounded ``error`` string;
* arguments the tool's model refuses never reach the approver;
* afterwards, the manager's containers in Docker are exactly its live sandboxes and its pool.

Install calls that would pass validation only ever name a sandbox that does not exist, so no
package is ever downloaded.

Also here: a program that imports and uses harombe writes nothing but its own output to stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harombe.config import LANGUAGES
from harombe.errors import HarombeError
from harombe.security.hitl import HITLGate
from harombe.security.runtime.sandbox import LABEL_MANAGER, LABEL_SANDBOX
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import ScriptedApprover
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.params import TOOL_ARGS, parse_args

REPO = Path(__file__).resolve().parents[2]
UNKNOWN_ID = "sandbox-ffffffffffff"
HUGE = "x" * 10_000_000
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
    database=None,
)

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_text = st.text(st.one_of(st.characters(), surrogates), max_size=24)
special = st.sampled_from(
    [HUGE, "false", "true", "False", "10", "nan", "\ud800", "", " ", "None", "../..", "\x00"]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    any_text,
    st.binary(max_size=16),
    special,
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=2),
    ),
    max_leaves=6,
)
#: Code that finishes at once in any of the three languages (or fails at once).
SAFE_CODE = ["print(1)", "1 + 1", "", "echo hi", "console.log(1)", "raise SystemExit(3)",
             "print('é' * 3)", "import sys; sys.stderr.write('e')"]  # fmt: skip


def mixed(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid values about half the time, anything at all otherwise."""
    return st.one_of(valid, junk)


def draw_args(data: st.DataObject, valid: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Arguments where up to two parameters (often none) are anything, the rest valid."""
    bad = data.draw(st.sets(st.sampled_from(sorted(valid)), max_size=2), label="bad")
    return {name: data.draw(junk if name in bad else v, label=name) for name, v in valid.items()}


@dataclass
class Env:
    """What the property tests share: the loop, the manager, sandboxes they may run in."""

    loop: asyncio.AbstractEventLoop
    manager: SandboxManager
    tools: CodeExecutionTools
    approver: ScriptedApprover
    own: list[str]
    baseline: set[str] = field(default_factory=set)
    outcomes: dict[tuple[str, bool], int] = field(default_factory=dict)

    def run(self, work: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(work)


@pytest.fixture(scope="module")
async def env(sandbox_manager: SandboxManager) -> AsyncIterator[Env]:
    approver = ScriptedApprover(default=True)
    tools = CodeExecutionTools(sandbox_manager, hitl_gate=HITLGate(approver=approver))
    own = []
    for language in ("python", "shell"):
        created = await tools.code_execute(language=language, code="")
        assert created["success"], created
        own.append(created["sandbox_id"])
    found = Env(asyncio.get_running_loop(), sandbox_manager, tools, approver, own)
    found.baseline = set(sandbox_manager.sandboxes)
    yield found
    for sid in own:
        if sid in sandbox_manager.sandboxes:
            await sandbox_manager.destroy_sandbox(sid)
    await assert_no_leak(sandbox_manager)


async def assert_no_leak(manager: SandboxManager) -> None:
    """The manager's containers in Docker are exactly its live and pooled sandboxes."""
    await manager.wait_pool_settled()
    found = await manager.docker.list_containers({LABEL_MANAGER: manager.manager_id})
    in_docker = {c.labels.get(LABEL_SANDBOX, c.id) for c in found}
    pooled = set(manager.pool.all_ready())  # every key's: profiles' pools too
    assert in_docker == set(manager.sandboxes) | pooled


def check(env: Env, tool: str, args: dict[str, Any], call: Callable[[], Awaitable[Any]]) -> None:
    """Run one call and assert the per-call properties; destroy any sandbox it created."""
    asked = len(env.approver.requests)
    try:
        parse_args(TOOL_ARGS[tool], args, max_bytes=env.manager.limits.max_file_bytes)
        valid = True
    except HarombeError:
        valid = False
    result = env.run(call())
    assert isinstance(result, dict), result
    assert isinstance(result["success"], bool), result
    if not result["success"]:
        assert isinstance(result["error"], str) and result["error"], result
        assert len(result["error"]) < 5000, "a huge argument was echoed back"
    if not valid:
        assert result["success"] is False
        assert len(env.approver.requests) == asked, "refused arguments reached the approver"
    key = (tool, result["success"])
    env.outcomes[key] = env.outcomes.get(key, 0) + 1
    for sid in set(env.manager.sandboxes) - env.baseline:
        env.run(env.manager.destroy_sandbox(sid))  # created by this call: not kept around


def existing(env: Env) -> st.SearchStrategy[Any]:
    return st.sampled_from([*env.own, UNKNOWN_ID])


def execute_args(env: Env) -> dict[str, st.SearchStrategy[Any]]:
    """Valid code_execute arguments (never network: no proxy is started for these)."""
    return {
        "language": st.sampled_from(LANGUAGES),
        "code": st.sampled_from([*SAFE_CODE, "echo a\x00b", "#" * 131_072]),
        "sandbox_id": st.one_of(st.none(), existing(env)),
        "timeout": st.sampled_from([None, 2, 2.5, 1e12]),
        "network_enabled": st.just(False),
        "allowed_domains": st.sampled_from([None, []]),
        "fresh": st.booleans(),
    }


@SETTINGS
@given(data=st.data())
def test_code_execute_always_answers_with_a_result(env: Env, data: st.DataObject) -> None:
    """code_execute with anything: a result dict, and refused arguments ask nobody."""
    args = draw_args(data, execute_args(env))
    check(env, "code_execute", args, lambda: env.tools.code_execute(**args))


@SETTINGS
@given(data=st.data())
def test_code_execute_stream_always_ends_with_a_result(env: Env, data: st.DataObject) -> None:
    """The stream takes the same parameters and always ends with exactly one result item."""
    args = draw_args(data, execute_args(env))

    async def stream() -> dict[str, Any]:
        items = [i async for i in env.tools.code_execute_stream(**args)]
        assert all(i["type"] in ("stdout", "stderr") for i in items[:-1]), items
        assert items[-1]["type"] == "result"
        return {k: v for k, v in items[-1].items() if k != "type"}

    check(env, "code_execute_stream", args, stream)


@SETTINGS
@given(data=st.data())
def test_code_install_package_always_answers(env: Env, data: st.DataObject) -> None:
    """Install with anything; a spec that could be valid never names a live sandbox."""
    args = draw_args(data, {
        "sandbox_id": existing(env),
        "package": st.sampled_from(["six", "requests==2.31.0", "axios@1.6.0"]),
        "registry": st.sampled_from(["pypi", "npm"]),
    })  # fmt: skip
    if args["sandbox_id"] in env.own:  # only specs that cannot be valid: nothing is downloaded
        args["package"] = data.draw(st.one_of(st.sampled_from(
            [None, 3, HUGE, "--index-url=http://127.0.0.1/", "x @ http://127.0.0.1/x", "", "a/b",
             "git+http://127.0.0.1/r", "\ud800"]), st.lists(st.text(max_size=3))))  # fmt: skip
    check(env, "code_install_package", args, lambda: env.tools.code_install_package(**args))


PATHS = ["a.txt", "./d//b.txt", "/workspace/c.txt", ".env/", "run.py ", "a/" * 1000 + "b",
         "/etc/passwd", "../x", "d", "é.txt", "e\u0301.txt", "x\\y"]  # fmt: skip


@SETTINGS
@given(data=st.data())
def test_file_tools_always_answer(env: Env, data: st.DataObject) -> None:
    """Write, read and list with anything: a result dict each."""
    write = draw_args(data, {
        "sandbox_id": existing(env),
        "file_path": st.sampled_from(PATHS),
        "content": st.one_of(st.text(max_size=40), st.sampled_from(["", "print(1)", HUGE])),
    })  # fmt: skip
    check(env, "code_write_file", write, lambda: env.tools.code_write_file(**write))
    read = {"sandbox_id": write["sandbox_id"], "file_path": write["file_path"]}
    check(env, "code_read_file", read, lambda: env.tools.code_read_file(**read))
    listing = draw_args(
        data, {"sandbox_id": existing(env), "path": st.sampled_from([".", "d", "d/", "/workspace"])}
    )
    check(env, "code_list_files", listing, lambda: env.tools.code_list_files(**listing))


@SETTINGS
@given(sid=mixed(st.sampled_from([UNKNOWN_ID, "sandbox-", "sandbox-0123456789aZ"])))
def test_code_destroy_sandbox_always_answers(env: Env, sid: Any) -> None:
    """Destroy with anything but a live id: a clear failure, and nothing is removed."""
    args = {"sandbox_id": sid}
    check(env, "code_destroy_sandbox", args, lambda: env.tools.code_destroy_sandbox(**args))
    assert all(s in env.manager.sandboxes for s in env.own)


async def test_nothing_leaks_after_the_properties(env: Env) -> None:
    """After every generated call, Docker holds exactly the live and pooled sandboxes; and
    the generated calls included ones that ran as well as ones that were refused."""
    await assert_no_leak(env.manager)
    for tool in ("code_execute", "code_execute_stream", "code_write_file", "code_read_file"):
        assert env.outcomes.get((tool, True)) and env.outcomes.get((tool, False)), env.outcomes


PROGRAM = """
import asyncio, structlog
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

async def main():
    docker = DockerManager()
    await docker.start()
    manager = SandboxManager(docker_manager=docker, runtime="runsc")
    await manager.start()
    tools = CodeExecutionTools(sandbox_manager=manager, hitl_gate=None)
    try:
        result = await tools.code_execute(language="python", code="print('MARKER' + '-CODE')")
        print(result["stdout"], end="")
        await tools.code_destroy_sandbox(result["sandbox_id"])
    finally:
        await manager.stop()
        await docker.stop()

asyncio.run(main())
"""


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_a_program_using_harombe_owns_its_stdout(
    docker_manager: Any, tmp_path: Path, debug: bool
) -> None:
    """stdout holds only the program's own output; stderr is quiet unless debug is asked
    (code only then), and HAROMBE_LOG_JSON writes the audit events to a file as JSON lines."""
    audit = tmp_path / "audit.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    env["HAROMBE_LOG_JSON"] = str(audit)
    if debug:
        env["HAROMBE_LOG_LEVEL"] = "debug"
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, env=env,
        cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "MARKER-CODE\n"
    assert ("tool.called" in out.stderr and "sandbox_manager.started" in out.stderr) is debug
    assert ("'MARKER' + '-CODE'" in out.stderr) is debug, "code is logged only at debug"
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    called = [e for e in events if e["event"] == "tool.called"]
    assert [e["tool"] for e in called] == ["code_execute", "code_destroy_sandbox"]
    assert all(e["level"] == "info" and e["timestamp"].endswith("Z") for e in called)

"""Attacks on the tool layer where the sandbox's behaviour is the point, against real gVisor:
odd-but-valid values, callbacks that raise, streams left early or never read, races on one
sandbox, and calls to a stopped manager. Each probe asserts the attack is held: every call
returns a dict, the sandbox keeps working, and no container is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.runtime import output_guard as output
from harombe.security.runtime.sandbox import LABEL_MANAGER
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


async def labelled(manager: SandboxManager) -> set[str]:
    """Ids of the containers that carry this manager's label, once its pool has settled."""
    await manager.wait_pool_settled()
    found = await manager.docker.list_containers({LABEL_MANAGER: manager.manager_id})
    return {c.id for c in found}


async def alive(tools: CodeExecutionTools, sandbox_id: str) -> bool:
    result = await tools.code_execute("python", "print(6*7)", sandbox_id=sandbox_id)
    return bool(result["success"]) and result["stdout"] == "42\n"


FILE_MISUSE = [
    ("write-onto-a-directory", lambda t, s: t.code_write_file(s, "d", "x")),
    ("read-a-directory", lambda t, s: t.code_read_file(s, "d")),
    ("write-below-a-file", lambda t, s: t.code_write_file(s, "f.txt/x", "x")),
    ("list-a-file", lambda t, s: t.code_list_files(s, "f.txt")),
]


@pytest.mark.parametrize("call", [f[1] for f in FILE_MISUSE], ids=[f[0] for f in FILE_MISUSE])
async def test_a_path_of_the_wrong_kind_is_a_clear_refusal(
    tools: CodeExecutionTools, fresh_sandbox: str, call: Any
) -> None:
    """A directory where a file is meant (or the reverse) is success: False; the sandbox lives."""
    setup = await tools.code_execute(
        "shell", "mkdir -p d && echo hi > f.txt", sandbox_id=fresh_sandbox
    )
    assert setup["success"], setup
    result = await call(tools, fresh_sandbox)
    assert result["success"] is False and result["error"], result
    assert await alive(tools, fresh_sandbox)


async def test_the_result_of_a_huge_expression_is_capped(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """The repr of a 10 MB final expression does not come back whole."""
    result = await tools.code_execute("python", "'x' * 10_000_000", sandbox_id=sandbox_id)
    assert result["success"], result
    assert result["result"] is None or len(result["result"]) <= 1_100_000, len(result["result"])


async def test_a_subnormal_timeout_is_a_timeout_not_a_crash(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """timeout=5e-324 is above 0, so it is accepted: the call times out (as data) at once."""
    result = await tools.code_execute(
        "python", "import time; time.sleep(5)", sandbox_id=sandbox_id, timeout=5e-324
    )
    assert isinstance(result, dict) and result["success"] is False, result
    assert await alive(tools, sandbox_id)


async def boom(stream: str, data: bytes) -> None:
    raise RuntimeError("consumer failed")


async def stuck(stream: str, data: bytes) -> None:
    await asyncio.Event().wait()


def sync_boom(stream: str, data: bytes) -> None:
    raise RuntimeError("consumer failed")


CALLBACKS = [
    ("sync-raises", sync_boom, "on_output raised RuntimeError"),
    ("async-raises", boom, "on_output raised RuntimeError"),
    ("async-never-returns", stuck, "on_output did not return within"),
]


@pytest.mark.parametrize(
    ("callback", "said"), [c[1:] for c in CALLBACKS], ids=[c[0] for c in CALLBACKS]
)
async def test_an_output_callback_that_fails_does_not_lose_the_sandbox(
    tools: CodeExecutionTools,
    fresh_sandbox: str,
    callback: Any,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """on_output raising or hanging: the run completes with all its output and a warning, and
    the sandbox (with its state) serves the next call."""
    monkeypatch.setattr(output, "ON_OUTPUT_WAIT_S", 1.0)
    await tools.code_execute("python", "kept = 7", sandbox_id=fresh_sandbox)
    result = await tools.code_execute(
        "python", "for i in range(3): print(i, flush=True)", sandbox_id=fresh_sandbox,
        on_output=callback,
    )  # fmt: skip
    assert result["success"] and result["stdout"] == "0\n1\n2\n", result
    assert any(said in w for w in result["warnings"]), result["warnings"]
    kept = await tools.code_execute("python", "kept", sandbox_id=fresh_sandbox)
    assert kept["result"] == "7", kept


@pytest.mark.parametrize(
    ("callback", "said"), [c[1:] for c in CALLBACKS], ids=[c[0] for c in CALLBACKS]
)
async def test_an_output_callback_that_fails_under_the_manager_api_keeps_the_sandbox(
    sandbox_manager: SandboxManager,
    fresh_sandbox: str,
    callback: Any,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same through SandboxManager.execute directly: the guard sits under every caller."""
    monkeypatch.setattr(output, "ON_OUTPUT_WAIT_S", 1.0)
    await sandbox_manager.execute(fresh_sandbox, "kept = 7")
    result = await sandbox_manager.execute(
        fresh_sandbox, "for i in range(3): print(i, flush=True)", on_output=callback
    )
    assert result.success and result.stdout == "0\n1\n2\n", result
    assert any(said in w for w in result.warnings), result.warnings
    kept = await sandbox_manager.execute(fresh_sandbox, "kept")
    assert kept.result == "7" and kept.sandbox_id == fresh_sandbox, kept


async def test_a_stream_left_at_every_point_leaves_a_working_sandbox(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Breaking out after the first, second and third item each cancel the run cleanly."""
    code = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.2)"
    for stop_after in (1, 2, 3):
        seen = 0
        async for _ in tools.code_execute_stream("python", code, sandbox_id=fresh_sandbox):
            seen += 1
            if seen == stop_after:
                break
        assert await alive(tools, fresh_sandbox), stop_after


async def test_a_stream_nobody_reads_buffers_no_more_than_the_output_cap(
    tools: CodeExecutionTools, fresh_sandbox: str, sandbox_manager: SandboxManager
) -> None:
    """Code printing 20 MB to a consumer that waits: what is queued stays within the cap."""
    code = "import sys\nfor _ in range(20):\n    sys.stdout.write('y' * 1_000_000)\n"
    stream = tools.code_execute_stream("python", code, sandbox_id=fresh_sandbox)
    first = await stream.__anext__()
    await asyncio.sleep(3)  # the consumer stalls while the run goes on
    total = len(first.get("text", ""))
    last: dict[str, Any] = first
    async for item in stream:
        total += len(item.get("text", ""))
        last = item
    cap = sandbox_manager.limits.max_output_bytes
    assert last["type"] == "result" and last["stdout_truncated"] is True, last
    assert total <= 2 * cap + 65_536, total


async def test_execute_and_destroy_racing_both_return_dicts(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager
) -> None:
    """A destroy racing a run on the same sandbox: two dicts, and the sandbox is gone."""
    created = await tools.code_execute("python", "pass")
    sid = created["sandbox_id"]
    run = asyncio.ensure_future(tools.code_execute("python", "import time; time.sleep(3)",
                                                   sandbox_id=sid))  # fmt: skip
    await asyncio.sleep(0.5)
    destroyed, ran = await asyncio.gather(tools.code_destroy_sandbox(sid), run)
    assert isinstance(destroyed, dict) and isinstance(ran, dict)
    assert destroyed["success"] is True and sid not in sandbox_manager.sandboxes


async def test_install_and_destroy_racing_both_return_dicts(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager
) -> None:
    """A destroy racing an (offline, failing) install: two dicts, and the sandbox is gone."""
    created = await tools.code_execute("python", "pass")
    sid = created["sandbox_id"]
    install = asyncio.ensure_future(tools.code_install_package(sid, "six"))
    await asyncio.sleep(0.2)
    destroyed, installed = await asyncio.gather(tools.code_destroy_sandbox(sid), install)
    assert isinstance(destroyed, dict) and isinstance(installed, dict)
    assert sid not in sandbox_manager.sandboxes


class Raising(float):
    def __float__(self) -> float:
        raise RuntimeError("__float__ was called")


NO_SANDBOX = [
    ("timeout-10**10000", {"timeout": 10**10000}),
    ("timeout-negative-zero", {"timeout": -0.0}),
    ("timeout-minus-inf", {"timeout": -math.inf}),
    ("network-numpy-like-1", {"network_enabled": 1}),
    ("domains-without-network", {"allowed_domains": ["example.com"]}),
    ("domains-a-string", {"network_enabled": True, "allowed_domains": "example.com"}),
    ("code-none", {"code": None}),
    ("code-lone-surrogate", {"code": "print('\ud800')"}),
    ("language-10MB", {"language": "p" * 10_000_000}),
]


@pytest.fixture(scope="module")
async def own_manager(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    """A manager of this module's own (no warm pool), so its label counts only our containers."""
    config = parse_config({"security": {"sandbox": {"pool": {"size": 0}}}})
    manager = SandboxManager(docker_manager, runtime="runsc", config=config)
    await manager.start()
    yield manager
    await manager.stop()


@pytest.mark.parametrize("bad", [n[1] for n in NO_SANDBOX], ids=[n[0] for n in NO_SANDBOX])
async def test_bad_arguments_without_a_sandbox_id_create_nothing(
    own_manager: SandboxManager, bad: dict[str, Any]
) -> None:
    """A refused call that named no sandbox leaves no container with this manager's label."""
    tools = CodeExecutionTools(own_manager, hitl_gate=None)
    before = await labelled(own_manager)
    kwargs: dict[str, Any] = {"language": "python", "code": "print(1)", **bad}
    result = await tools.code_execute(**kwargs)
    assert result["success"] is False and result["sandbox_id"] is None, result
    assert len(result["error"]) < 2000
    assert await labelled(own_manager) == before


async def test_calls_on_a_stopped_manager_are_dicts(docker_manager: DockerManager) -> None:
    """After stop(), every tool returns success: False saying what to do, and creates nothing."""
    manager = SandboxManager(docker_manager, runtime="runsc")
    await manager.start()
    tools = CodeExecutionTools(manager, hitl_gate=None)
    created = await tools.code_execute("python", "pass")
    sid = created["sandbox_id"]
    await manager.stop()
    results = [
        await tools.code_execute("python", "print(1)"),
        await tools.code_execute("python", "print(1)", sandbox_id=sid),
        await tools.code_write_file(sid, "a.txt", "x"),
        await tools.code_read_file(sid, "a.txt"),
        await tools.code_list_files(sid),
        await tools.code_install_package(sid, "six"),
        await tools.code_destroy_sandbox(sid),
    ]
    for result in results:
        assert isinstance(result, dict) and result["success"] is False, result
    found = await docker_manager.list_containers({LABEL_MANAGER: manager.manager_id})
    assert found == []


OTHER_LOOP = [
    ("execute-existing", lambda t, s: t.code_execute("python", "print(1)", sandbox_id=s)),
    ("execute-new", lambda t, s: t.code_execute("python", "print(1)")),
    ("write", lambda t, s: t.code_write_file(s, "a.txt", "x")),
    ("destroy", lambda t, s: t.code_destroy_sandbox(s)),
]


@pytest.mark.parametrize("call", [o[1] for o in OTHER_LOOP], ids=[o[0] for o in OTHER_LOOP])
async def test_a_call_from_another_event_loop_is_refused_and_harms_nothing(
    own_manager: SandboxManager, call: Any
) -> None:
    """A call made with asyncio.run in another thread is a UsageError dict: no sandbox is
    created on a loop that dies with the call, and the sandbox still works on its own loop."""
    tools = CodeExecutionTools(own_manager, hitl_gate=None)
    created = await tools.code_execute("python", "kept = 1")
    sid = created["sandbox_id"]
    before = await labelled(own_manager)
    result = await asyncio.to_thread(lambda: asyncio.run(call(tools, sid)))
    assert result["success"] is False and result["error"].startswith("UsageError: "), result
    assert await labelled(own_manager) == before
    kept = await tools.code_execute("python", "kept", sandbox_id=sid)
    assert kept["result"] == "1", kept
    await tools.code_destroy_sandbox(sid)


async def test_a_stream_left_early_on_a_new_sandbox_leaves_no_container(
    own_manager: SandboxManager,
) -> None:
    """The id of a sandbox a stream creates comes only with the final item: leaving before it
    destroys that sandbox instead of keeping one nobody can name."""
    tools = CodeExecutionTools(own_manager, hitl_gate=None)
    before = await labelled(own_manager)
    code = "import time\nfor i in range(50):\n    print(i, flush=True)\n    time.sleep(0.1)"
    async with contextlib.aclosing(tools.code_execute_stream("python", code)) as items:
        async for item in items:
            assert item["type"] == "stdout", item
            break
    assert await labelled(own_manager) == before


async def test_calls_while_the_manager_starts_are_dicts(docker_manager: DockerManager) -> None:
    """A call racing start() gets a dict (success or 'not started'), and stop() removes all."""
    config = parse_config({"security": {"sandbox": {"pool": {"size": 0}}}})
    manager = SandboxManager(docker_manager, runtime="runsc", config=config)
    tools = CodeExecutionTools(manager, hitl_gate=None)
    starting = asyncio.ensure_future(manager.start())
    early = await tools.code_execute("python", "print(1)")
    await starting
    assert isinstance(early, dict)
    assert early["success"] or "not started" in early["error"], early
    await manager.stop()
    assert await docker_manager.list_containers({LABEL_MANAGER: manager.manager_id}) == []


FOREIGN = [
    ("execute", lambda t, s: t.code_execute("python", "print(1)", sandbox_id=s)),
    ("write", lambda t, s: t.code_write_file(s, "planted.txt", "x")),
    ("read", lambda t, s: t.code_read_file(s, "planted.txt")),
    ("list", lambda t, s: t.code_list_files(s)),
    ("install", lambda t, s: t.code_install_package(s, "six")),
    ("destroy", lambda t, s: t.code_destroy_sandbox(s)),
]


@pytest.mark.parametrize("call", [f[1] for f in FOREIGN], ids=[f[0] for f in FOREIGN])
async def test_another_managers_sandbox_cannot_be_reached(
    own_manager: SandboxManager, tools: CodeExecutionTools, sandbox_id: str, call: Any
) -> None:
    """An id that belongs to another manager is unknown here: SandboxNotFoundError, and the
    other manager's sandbox is untouched."""
    result = await call(CodeExecutionTools(own_manager, hitl_gate=None), sandbox_id)
    assert result["success"] is False, result
    assert result["error"].startswith("SandboxNotFoundError: "), result
    assert await alive(tools, sandbox_id)
    listing = await tools.code_list_files(sandbox_id)
    assert "planted.txt" not in listing["files"]

"""Lifecycle: labels, stop, orphan sweep, unknown ids, concurrency, audit, the event loop."""

import asyncio
import subprocess
import sys
import textwrap
import threading

import docker.api.client
import pytest
import structlog

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


async def _labelled(docker_manager: DockerManager, **labels: str) -> list[str]:
    return [c.id for c in await docker_manager.list_containers({"harombe.managed": "1", **labels})]


async def test_stop_removes_every_container(docker_manager: DockerManager) -> None:
    """After stop(), no container of that manager is left, warm-pool ones included."""
    manager = SandboxManager(docker_manager)
    await manager.start()
    tools = CodeExecutionTools(sandbox_manager=manager, hitl_gate=None)
    ids = [
        (await tools.code_execute(language=lang, code="true" if lang == "shell" else ""))
        for lang in ("python", "shell")
    ]
    assert all(r["success"] for r in ids)
    await manager.wait_pool_settled()  # the warm pool filled behind the two cold starts
    mine = {"harombe.manager": manager.manager_id}
    everything = await _labelled(docker_manager, **mine)
    pooled = await _labelled(docker_manager, **mine, **{"harombe.pooled": "1"})
    assert len(pooled) == 2 * manager.sandbox_config.pool.size  # python and shell pools
    assert len(everything) == len(pooled) + 2
    await manager.stop()
    assert await _labelled(docker_manager, **{"harombe.manager": manager.manager_id}) == []


async def test_destroy_removes_the_container(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager
) -> None:
    """code_destroy_sandbox removes the container; the id is then unknown."""
    created = await tools.code_execute(language="python", code="")
    sid = created["sandbox_id"]
    assert len(await _labelled(sandbox_manager.docker, **{"harombe.sandbox": sid})) == 1
    destroyed = await tools.code_destroy_sandbox(sid)
    assert destroyed["success"] is True
    assert await _labelled(sandbox_manager.docker, **{"harombe.sandbox": sid}) == []
    again = await tools.code_execute(language="python", code="", sandbox_id=sid)
    assert again["success"] is False and again["error"].startswith("SandboxNotFoundError")


async def test_orphans_of_a_crashed_process_are_swept(docker_manager: DockerManager) -> None:
    """A process that dies without stop() leaves a container; the next start() removes it."""
    script = textwrap.dedent("""
        import asyncio, os
        from harombe.security.docker_manager import DockerManager
        from harombe.security.sandbox_manager import SandboxManager
        async def main():
            dm = DockerManager(); await dm.start()
            sm = SandboxManager(dm); await sm.start()
            box = await sm.create_sandbox("python")
            print(box.sandbox_id, flush=True)
            os._exit(0)  # crash: no stop()
        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    orphan = out.decode().split()[-1]
    assert len(await _labelled(docker_manager, **{"harombe.sandbox": orphan})) == 1
    manager = SandboxManager(docker_manager)
    await manager.start()
    try:
        assert await _labelled(docker_manager, **{"harombe.sandbox": orphan}) == []
    finally:
        await manager.stop()


@pytest.mark.parametrize(
    "bad_id",
    [
        "sandbox-000000000000",
        "../../../etc",
        "sandbox-abc; docker rm -f $(docker ps -q)",
        "",
        "x" * 300,
    ],
    ids=["unknown", "traversal", "injection", "empty", "long"],
)
async def test_unknown_or_crafted_ids_touch_nothing(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, bad_id: str
) -> None:
    """Every tool answers SandboxNotFoundError for a bad id, and no container changes."""
    before = sorted(await _labelled(sandbox_manager.docker))
    calls = [
        tools.code_execute(language="python", code="print(1)", sandbox_id=bad_id),
        tools.code_write_file(sandbox_id=bad_id, file_path="a.txt", content="x"),
        tools.code_read_file(sandbox_id=bad_id, file_path="a.txt"),
        tools.code_list_files(sandbox_id=bad_id),
        tools.code_install_package(sandbox_id=bad_id, package="six"),
        tools.code_destroy_sandbox(bad_id),
    ]
    for result in await asyncio.gather(*calls):
        assert result["success"] is False
        assert result["error"].startswith("SandboxNotFoundError: Sandbox not found")
    assert sorted(await _labelled(sandbox_manager.docker)) == before


SPAN = "import time\nstart = time.time()\ntime.sleep(1.5)\nprint(start, time.time())"


def _span(result: dict) -> tuple[float, float]:
    start, end = result["stdout"].split()
    return float(start), float(end)


async def test_different_sandboxes_run_in_parallel(tools: CodeExecutionTools) -> None:
    """Two sandboxes' runs overlap in time (clocks read inside the sandboxes)."""
    a, b = await asyncio.gather(*(tools.code_execute(language="python", code="") for _ in range(2)))
    ra, rb = await asyncio.gather(
        tools.code_execute(language="python", code=SPAN, sandbox_id=a["sandbox_id"]),
        tools.code_execute(language="python", code=SPAN, sandbox_id=b["sandbox_id"]),
    )
    (sa, ea), (sb, eb) = _span(ra), _span(rb)
    assert sa < eb and sb < ea  # the intervals intersect
    for r in (a, b):
        await tools.code_destroy_sandbox(r["sandbox_id"])


async def test_calls_on_one_sandbox_are_serialised(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Two concurrent runs on one sandbox do not overlap."""
    r1, r2 = await asyncio.gather(
        tools.code_execute(language="python", code=SPAN, sandbox_id=sandbox_id),
        tools.code_execute(language="python", code=SPAN, sandbox_id=sandbox_id),
    )
    first, second = sorted([_span(r1), _span(r2)])
    assert first[1] <= second[0]


async def test_every_call_is_one_audit_event_without_code(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Each tool call logs one tool.called event with sizes; code appears only at debug."""
    secret_code = "print('TOP-SECRET-CODE')"
    with structlog.testing.capture_logs() as events:
        await tools.code_execute(language="python", code=secret_code, sandbox_id=sandbox_id)
        await tools.code_write_file(sandbox_id=sandbox_id, file_path="a.txt", content="FILE-BODY")
    called = [e for e in events if e["event"] == "tool.called"]
    assert [e["tool"] for e in called] == ["code_execute", "code_write_file"]
    run = called[0]
    assert run["sandbox_id"] == sandbox_id and run["language"] == "python"
    assert run["exit_code"] == 0 and run["stdout_bytes"] == len("TOP-SECRET-CODE\n")
    assert run["duration_s"] > 0
    assert called[1]["written_bytes"] == len("FILE-BODY")
    above_debug = [e for e in events if e["log_level"] != "debug"]
    assert "TOP-SECRET-CODE" not in repr(above_debug) and "FILE-BODY" not in repr(above_debug)


async def test_no_docker_call_runs_on_the_event_loop(
    tools: CodeExecutionTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Docker API request of a full sandbox life happens off the event loop's thread."""
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []
    original = docker.api.client.APIClient.send

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(docker.api.client.APIClient, "send", spy)
    created = await tools.code_execute(language="python", code="print(1)")
    await tools.code_write_file(sandbox_id=created["sandbox_id"], file_path="f", content="x")
    await tools.code_destroy_sandbox(created["sandbox_id"])
    assert len(threads) >= 4  # image lookup, create, start, remove at least
    assert loop_thread not in threads

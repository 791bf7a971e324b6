"""Stateful sessions: one live Python or Node interpreter per sandbox, in real gVisor."""

import asyncio
import re

import pytest

from harombe.config import load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


async def run(tools: CodeExecutionTools, sid: str, language: str, code: str, **kw: object) -> dict:  # type: ignore[type-arg]
    return await tools.code_execute(language=language, code=code, sandbox_id=sid, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("language", "cells", "results"),
    [
        ("python", ["import math\nx = 40", "def f(n):\n    return n + 2", "f(x)", "math.pi > 3"],
         [None, None, "42", "True"]),
        ("javascript", ["let x = 40; const util = require('util');",
                        "function f(n) { return n + 2 }", "f(x)", "util.format('%s!', 'hi')"],
         [None, None, "42", "'hi!'"]),
    ],
    ids=["python", "javascript"],
)  # fmt: skip
async def test_state_persists_and_result_is_the_last_expression(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, cells: list[str],
    results: list[str | None],
) -> None:  # fmt: skip
    """Variables, imports and functions survive between calls; result is the final repr."""
    for code, expected in zip(cells, results, strict=True):
        result = await run(tools, fresh_sandbox, language, code)
        assert result["success"] and result["stateful"], result
        assert result["result"] == expected and result["state_lost"] is False


async def test_errors_print_like_python_and_keep_state(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """An exception is a failed run with its traceback on stderr; earlier state is kept."""
    await run(tools, fresh_sandbox, "python", "kept = 'yes'")
    failed = await run(tools, fresh_sandbox, "python", "x = 1\n\n1 / 0")
    assert failed["status"] == "error" and failed["exit_code"] == 1
    assert re.search(r'File "<cell \d+>", line 3', failed["stderr"])
    assert failed["stderr"].rstrip().endswith("ZeroDivisionError: division by zero")
    assert "harombe" not in failed["stderr"] and "serve_python" not in failed["stderr"]
    exited = await run(tools, fresh_sandbox, "python", "exit(3)")
    assert exited["exit_code"] == 3 and exited["state_lost"] is False
    assert (await run(tools, fresh_sandbox, "python", "kept"))["result"] == "'yes'"


@pytest.mark.parametrize(
    ("language", "spin"),
    [("python", "while True:\n    pass"), ("javascript", "while (true) {}")],
    ids=["python", "javascript"],
)
async def test_timeout_interrupts_and_keeps_state(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, spin: str
) -> None:
    """A timed-out busy loop is interrupted, not killed: the session's variables survive."""
    await run(
        tools, fresh_sandbox, language, "var kept = 7" if language == "javascript" else "kept = 7"
    )
    result = await run(tools, fresh_sandbox, language, spin, timeout=1)
    assert result["status"] == "timeout" and result["exit_code"] == -1
    assert result["error"] == "TimeoutError" and result["state_lost"] is False
    assert (await run(tools, fresh_sandbox, language, "kept"))["result"] == "7"


async def test_timeout_that_must_kill_reports_state_lost(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Code that ignores the interrupt is killed: state_lost, and the next call starts afresh."""
    await run(tools, fresh_sandbox, "python", "kept = 7")
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('stubborn')\ntime.sleep(60)"
    )
    result = await run(tools, fresh_sandbox, "python", stubborn, timeout=1)
    assert result["status"] == "timeout" and result["state_lost"] is True
    assert result["stdout"] == "stubborn\n", "partial output is kept, even unflushed"
    after = await run(tools, fresh_sandbox, "python", "'kept' in globals()")
    assert after["result"] == "False" and after["state_lost"] is False
    assert after["sandbox_id"] == fresh_sandbox


LOADED_ROUNDS = 8
BURN_S = 120  # an upper bound: the burners are destroyed when the test ends


async def test_interrupts_reach_sleeping_code_on_a_loaded_host(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """With every core busy, each timeout still interrupts sleeping code (state kept) and a
    stubborn call still hands over its unflushed output before it is killed."""
    burners = []
    for _ in range(4):  # four other sandboxes (half a core each) keep both cores busy, for a while
        made = await tools.code_execute(language="python", code="pass")
        burners.append(made["sandbox_id"])
    burn = f"timeout {BURN_S} sh -c 'while :; do :; done'; true"
    load = [
        asyncio.create_task(run(tools, sid, "shell", burn, timeout=BURN_S + 10)) for sid in burners
    ]
    try:
        await asyncio.sleep(1)
        stubborn = (
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "print('held')\ntime.sleep(60)"
        )
        for round_ in range(LOADED_ROUNDS):
            await run(tools, fresh_sandbox, "python", f"kept = {round_}")
            slept = await run(
                tools, fresh_sandbox, "python", "import time\ntime.sleep(60)", timeout=1
            )
            assert slept["status"] == "timeout" and slept["state_lost"] is False, (round_, slept)
            assert (await run(tools, fresh_sandbox, "python", "kept"))["result"] == str(round_)
            killed = await run(tools, fresh_sandbox, "python", stubborn, timeout=1)
            assert killed["state_lost"] is True and killed["stdout"] == "held\n", (round_, killed)
    finally:
        for sid in burners:
            await tools.code_destroy_sandbox(sid)
        await asyncio.gather(*load, return_exceptions=True)


async def test_out_of_memory_loses_state_not_the_sandbox(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A memory bomb in a session is oom with state_lost; the sandbox answers the next call."""
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))"
    result = await run(tools, fresh_sandbox, "python", bomb)
    assert result["status"] == "oom" and result["state_lost"] is True
    assert (await run(tools, fresh_sandbox, "python", "1 + 1"))["result"] == "2"


async def test_fresh_runs_and_shell_leave_the_session_alone(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """fresh=True and shell calls run separate processes and do not disturb the session."""
    await run(tools, fresh_sandbox, "python", "kept = 7")
    isolated = await run(tools, fresh_sandbox, "python", "print('kept' in globals())", fresh=True)
    assert isolated["stdout"] == "False\n" and isolated["stateful"] is False
    shell = await run(tools, fresh_sandbox, "shell", "sleep 0.1; echo shell")
    assert shell["stdout"] == "shell\n" and shell["stateful"] is False
    assert (await run(tools, fresh_sandbox, "python", "kept"))["result"] == "7"


async def test_session_killed_between_calls_is_reported(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """`kill -9 -1` from a shell call kills the session; the next Python call says so."""
    await run(tools, fresh_sandbox, "python", "kept = 7")
    await run(tools, fresh_sandbox, "shell", "kill -9 -1")
    after = await run(tools, fresh_sandbox, "python", "'kept' in globals()")
    assert after["state_lost"] is True and after["result"] == "False"
    assert after["sandbox_id"] == fresh_sandbox


async def test_hostile_session_code_cannot_break_the_channel(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """os.kill(1, 9) from the session interpreter fails; the session and the channel go on."""
    code = "import os\ntry:\n    os.kill(1, 9)\nexcept PermissionError:\n    print('EPERM')\nz = 1"
    result = await run(tools, fresh_sandbox, "python", code)
    assert result["stdout"] == "EPERM\n"
    assert (await run(tools, fresh_sandbox, "python", "z"))["result"] == "1"


async def test_stateful_false_runs_a_fresh_process_each_time(
    docker_manager: DockerManager,
) -> None:
    """With stateful: false in the config, nothing carries over between calls."""
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["stateful"] = False
    manager = SandboxManager(docker_manager, config=parse_config(data))
    await manager.start()
    try:
        tools = CodeExecutionTools(manager, hitl_gate=None)
        first = await tools.code_execute(language="python", code="x = 1\nprint('set')")
        second = await run(tools, first["sandbox_id"], "python", "print('x' in globals())")
        assert second["stdout"] == "False\n" and second["stateful"] is False
        assert second["result"] is None
    finally:
        await manager.stop()


@pytest.mark.parametrize("language", ["python", "javascript"])
async def test_streaming_yields_chunks_as_they_are_printed(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str
) -> None:
    """code_execute_stream yields each printed line as its own chunk, then the result."""
    code = {
        "python": "import time\nfor i in range(3):\n"
        "    print('line', i)\n    time.sleep(0.2)\n'end'",
        "javascript": "(async () => { for (let i = 0; i < 3; i++) { console.log('line', i); "
        "await new Promise(r => setTimeout(r, 200)); } return 'end'; })()",
    }[language]
    items = [
        item
        async for item in tools.code_execute_stream(
            language=language, code=code, sandbox_id=fresh_sandbox
        )
    ]
    chunks = [item["text"] for item in items if item["type"] == "stdout"]
    assert chunks == ["line 0\n", "line 1\n", "line 2\n"]
    assert items[-1]["type"] == "result" and items[-1]["result"] == "'end'"
    assert items[-1]["stdout"] == "line 0\nline 1\nline 2\n"


async def test_leaving_a_stream_cancels_the_run(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Breaking out of a stream stops the run inside the sandbox; the session stays usable."""
    stream = tools.code_execute_stream(
        language="python",
        code="import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)",
        sandbox_id=fresh_sandbox,
    )
    first = await anext(stream)
    assert first == {"type": "stdout", "text": "started\n"}
    await stream.aclose()  # type: ignore[attr-defined]
    after = await run(tools, fresh_sandbox, "python", "'alive'")
    assert after.get("result") == "'alive'", after


async def test_large_and_mixed_output_arrives_whole_and_in_order(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Output beyond the in-memory buffer, and output of child processes, arrive in order."""
    code = (
        "import subprocess\nprint('start')\nsubprocess.run(['echo', 'child'])\n"
        "for i in range(20000):\n    print(i)\nprint('end')"
    )
    result = await run(tools, fresh_sandbox, "python", code)
    lines = result["stdout"].splitlines()
    assert lines[0] == "start" and lines[-1] == "end" and "child" in lines
    assert [int(x) for x in lines if x.isdigit()] == list(range(20000))


async def test_cancel_works_against_a_flood_and_busy_children(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Busy child processes and an output flood do not starve the channel: cancel still works."""
    code = (
        "import os\nfor _ in range(4):\n    if os.fork() == 0:\n        while True:\n"
        "            pass\nwhile True:\n    print('x' * 1000, flush=True)"
    )
    stream = tools.code_execute_stream(language="python", code=code, sandbox_id=fresh_sandbox)
    first = await anext(stream)
    assert first["type"] == "stdout" and first["text"].startswith("x")
    await stream.aclose()  # type: ignore[attr-defined]
    count = "ps -e -o stat=,comm= | grep -v '^Z' | grep -c python3"
    after = await run(tools, fresh_sandbox, "shell", count)
    assert after["stdout"] == "2\n", after  # the supervisor and the (interrupted) session
    await run(tools, fresh_sandbox, "python", "1")  # the session collects its dead children
    zombies = await run(tools, fresh_sandbox, "shell", "ps -e -o stat= | grep -c '^Z' || true")
    assert zombies["stdout"] == "0\n"


@pytest.mark.parametrize(
    ("language", "code", "expected"),
    [("python", "__name__, __file__", "('__main__', '<stdin>')"),
     ("javascript", "[typeof require, __dirname, require('path').basename('/a/b')]",
      "[ 'function', '/workspace', 'b' ]")],
    ids=["python", "javascript"],
)  # fmt: skip
async def test_session_scope_matches_a_fresh_script(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, code: str, expected: str
) -> None:
    """Names a script can count on in a fresh process exist in the session too."""
    result = await run(tools, fresh_sandbox, language, code)
    assert result["result"] == expected, result


async def test_node_session_restarts_after_process_exit(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """process.exit() ends the Node session with state_lost; the next call gets a new one."""
    ended = await run(tools, fresh_sandbox, "javascript", "var kept = 1; process.exit(3)")
    assert ended["exit_code"] == 3 and ended["state_lost"] is True
    again = await run(tools, fresh_sandbox, "javascript", "typeof kept")
    assert again["result"] == "'undefined'" and again["success"], again


async def test_background_thread_restarts_the_session_and_says_why(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A thread left running ends the session: state_lost, a warning, and a fresh next call."""
    code = (
        "import threading, time\nkept = 7\nchunks = []\ndef grow():\n    while True:\n"
        "        chunks.append(bytearray(1 << 20))\n        time.sleep(0.01)\n"
        "threading.Thread(target=grow, daemon=True).start()\n'started'"
    )
    result = await run(tools, fresh_sandbox, "python", code)
    assert result["result"] == "'started'" and result["state_lost"] is True, result
    assert any("background thread" in w for w in result["warnings"]), result
    after = await run(tools, fresh_sandbox, "python", "'kept' in globals()")
    assert after["result"] == "False" and after["state_lost"] is False, after


async def test_session_interpreter_is_stopped_between_calls(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Between calls the session interpreter is stopped (state T), so nothing of it runs."""
    await run(tools, fresh_sandbox, "python", "x = 1")
    state = await run(tools, fresh_sandbox, "shell", "ps -e -o pid=,stat=,comm= | grep python3")
    worker = [line.split() for line in state["stdout"].splitlines() if line.split()[0] != "1"]
    assert [fields[1][0] for fields in worker] == ["T"], state


async def test_node_call_waits_for_its_timers_like_a_script(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A pending setTimeout finishes within its call (as `node -` would wait for it)."""
    code = "var kept = 1; setTimeout(() => console.log('later'), 200); 'now'"
    result = await run(tools, fresh_sandbox, "javascript", code)
    assert result["stdout"] == "later\n" and result["result"] == "'now'", result
    assert result["state_lost"] is False
    assert (await run(tools, fresh_sandbox, "javascript", "kept"))["result"] == "1"


async def test_node_interval_left_running_restarts_the_session(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """An endless setInterval keeps the call going to its timeout, then the session restarts."""
    result = await run(
        tools, fresh_sandbox, "javascript", "setInterval(() => {}, 50); 1", timeout=2
    )
    assert result["status"] == "timeout" and result["state_lost"] is True, result
    assert any("pending" in w for w in result["warnings"]), result
    assert (await run(tools, fresh_sandbox, "javascript", "2"))["result"] == "2"


async def test_forged_reply_is_capped_and_the_session_recovers(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A 20 MB reply forged on the worker's channel never reaches the host; the session says so."""
    code = (
        'import os, struct\ndata = b\'{"cell": 1, "exit_code": 0, "result": "\' + '
        "b'x' * 20_000_000 + b'\"}'\nos.write(4, struct.pack('>II', len(data), 0) + data)"
    )
    result = await run(tools, fresh_sandbox, "python", code)
    assert result["state_lost"] is True and len(result["result"] or "") <= 10000, result
    assert any("reply channel" in w for w in result["warnings"]), result
    assert (await run(tools, fresh_sandbox, "python", "40 + 2"))["result"] == "42"


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "import threading\nts = [threading.Thread(target=sum, args=(range(99),)) "
                   "for _ in range(4)]\nfor t in ts:\n    t.start()\nfor t in ts:\n    t.join()"),
        ("python", "from concurrent.futures import ThreadPoolExecutor\n"
                   "with ThreadPoolExecutor(4) as ex:\n    list(ex.map(abs, range(20)))"),
        ("python", "import asyncio\nasync def main():\n    await asyncio.to_thread(sum, range(9))\n"
                   "asyncio.run(main())"),
        ("javascript", "(async () => { await require('fs').promises.readFile('/etc/passwd'); "
                       "await new Promise((r) => require('zlib').gzip('abc', r)); "
                       "await new Promise((r) => require('crypto').pbkdf2('a', 'b', 9, 9, "
                       "'sha1', r)); require('child_process').execSync('true'); })()"),
    ],
    ids=["py-joined-threads", "py-executor-with", "py-asyncio-to-thread", "js-thread-pool-work"],
)  # fmt: skip
async def test_work_that_finishes_within_its_call_keeps_the_session(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, code: str
) -> None:
    """Threads joined, pools shut down and async work awaited never cost the session its state."""
    await run(
        tools, fresh_sandbox, language, "var kept = 1" if language == "javascript" else "kept = 1"
    )
    for _ in range(10):
        result = await run(tools, fresh_sandbox, language, code)
        assert result["success"] and result["state_lost"] is False, result
    assert (await run(tools, fresh_sandbox, language, "kept"))["result"] == "1"

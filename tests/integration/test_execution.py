"""Execution in real gVisor sandboxes: languages, streams, exit codes, limits."""

import pytest

from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

LANGUAGE_CASES = [
    ("python", "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)", 3),
    ("javascript", "console.log('out'); console.error('err'); process.exit(4);", 4),
    ("shell", "echo out; echo err >&2; exit 5", 5),
]


@pytest.mark.parametrize(
    ("language", "code", "exit_code"), LANGUAGE_CASES, ids=[c[0] for c in LANGUAGE_CASES]
)
async def test_streams_apart_and_exit_codes_as_set(
    tools: CodeExecutionTools, sandbox_id: str, language: str, code: str, exit_code: int
) -> None:
    """stdout and stderr come back apart, and the exit code is the one the program set."""
    result = await tools.code_execute(language=language, code=code, sandbox_id=sandbox_id)
    assert result["stdout"] == "out\n"
    assert result["stderr"] == "err\n"
    assert result["exit_code"] == exit_code
    assert result["success"] is False
    assert result["status"] == "error"
    assert result["execution_time"] > 0
    assert result["runtime"] == "runsc"


async def test_images_have_the_promised_interpreters(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Python >= 3.11 with pip, Node >= 20, Bash 5.2, a non-root user, /workspace as cwd."""
    code = (
        "python3 -c 'import sys; print(sys.version_info >= (3, 11))'\n"
        "python3 -m pip --version >/dev/null && echo pip-ok\n"
        "node -e 'console.log(Number(process.versions.node.split(\".\")[0]) >= 20)'\n"
        'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"\n'
        "id -u; pwd"
    )
    result = await tools.code_execute(language="shell", code=code, sandbox_id=sandbox_id)
    assert result["stdout"].split() == ["True", "pip-ok", "true", "5.2", "1000", "/workspace"]


async def test_runs_under_gvisor(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """The kernel the code sees is gVisor's, not the host's."""
    result = await tools.code_execute(
        language="shell", code="dmesg | head -n 1", sandbox_id=sandbox_id
    )
    assert "gVisor" in result["stdout"]


async def test_timeout_kills_keeps_partial_output_and_sandbox_survives(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """On expiry: exit_code -1, error TimeoutError, output so far kept, next call works."""
    code = "import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('never')"
    result = await tools.code_execute(
        language="python", code=code, sandbox_id=sandbox_id, timeout=1
    )
    assert result["exit_code"] == -1
    assert result["error"] == "TimeoutError"
    assert result["status"] == "timeout"
    assert result["stdout"] == "before\n"
    after = await tools.code_execute(
        language="python", code="print('after')", sandbox_id=sandbox_id
    )
    assert after["stdout"] == "after\n" and after["sandbox_id"] == sandbox_id


async def test_sigterm_ignored_still_dies_after_grace(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """A fresh process that ignores SIGTERM is SIGKILLed after the grace period."""
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('armed', flush=True)\ntime.sleep(60)"
    )
    result = await tools.code_execute(
        language="python", code=code, sandbox_id=sandbox_id, timeout=1, fresh=True
    )
    assert result["status"] == "timeout" and result["stdout"] == "armed\n"
    survivors = await tools.code_execute(
        language="shell",
        sandbox_id=sandbox_id,
        code=(
            "for p in /proc/[0-9]*; do [ ${p#/proc/} != 1 ] && "
            '[ "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" = "python3 - " ] && echo $p; '
            "done; true"
        ),
    )
    assert survivors["stdout"] == ""  # the SIGTERM-proof `python3 -` was SIGKILLed


async def test_background_processes_do_not_outlive_the_call(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Processes a call leaves running are gone before the next call."""
    first = await tools.code_execute(
        language="shell", code="sleep 300 &\necho started", sandbox_id=sandbox_id
    )
    assert first["stdout"] == "started\n"
    count = (
        "import os\nprint(sum(open(f'/proc/{p}/comm').read().strip() == 'sleep' "
        "for p in os.listdir('/proc') if p.isdigit()))"
    )
    second = await tools.code_execute(language="python", code=count, sandbox_id=sandbox_id)
    assert second["stdout"] == "0\n"
    probe = await tools.code_execute(
        language="shell", code="sleep 3 & sleep 0.2; ps -e -o comm=", sandbox_id=sandbox_id
    )
    assert "sleep" in probe["stdout"]  # the probe itself can see a running sleep


async def test_timeout_is_capped_by_max_timeout_s(sandbox_manager: SandboxManager) -> None:
    """A per-call timeout above the hard ceiling is capped to it, and the result says so."""
    timeout, warnings = sandbox_manager.effective_timeout(10_000)
    assert timeout == sandbox_manager.limits.max_timeout_s
    assert "capped" in warnings[0]


async def test_output_is_capped_in_bytes_and_marked(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """20 MB of output comes back as 1 MiB plus the marker; the full size is reported."""
    code = "import sys\nfor _ in range(20):\n    sys.stdout.write('é' * 500_000)"  # 1 MB a write
    result = await tools.code_execute(language="python", code=code, sandbox_id=sandbox_id)
    assert result["success"] is True
    assert result["stdout_truncated"] is True
    assert result["stdout"].endswith("[OUTPUT TRUNCATED]")
    kept = result["stdout"].removesuffix("\n[OUTPUT TRUNCATED]")
    assert len(kept.encode()) <= 1_048_576
    assert len(kept.encode()) >= 1_048_574  # at most one character dropped at the cut
    assert set(kept) == {"é"}
    assert result["stdout_bytes"] == 20_000_000


async def test_memory_bomb_fails_fast_and_next_call_works(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Allocating without bound gives a failed result, and the sandbox (or its named
    replacement) runs the next call."""
    for language, code in [
        ("python", "x = []\nwhile True:\n    x.append(bytearray(10**7))"),
        ("javascript", "const a = []; while (true) a.push(Buffer.alloc(1e7).fill(1));"),
    ]:
        result = await tools.code_execute(language=language, code=code, sandbox_id=fresh_sandbox)
        assert result["success"] is False
        assert result["status"] in ("oom", "lost")
        assert "MemoryError" in result["error"] or "memory" in result["error"]
        fresh_sandbox = result["sandbox_id"]
        after = await tools.code_execute(
            language="python", code="print('ok')", sandbox_id=fresh_sandbox
        )
        assert after["stdout"] == "ok\n"


async def test_fork_bomb_is_contained(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """Process creation stops at max_pids; a shell fork bomb leaves the sandbox working."""
    forker = (
        "import os, time\nn = 0\ntry:\n    while n < 5000:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
        "except BlockingIOError:\n    print('limited at', n)"
    )
    result = await tools.code_execute(
        language="python", code=forker, sandbox_id=fresh_sandbox, fresh=True
    )
    words = result["stdout"].split()
    assert words[:2] == ["limited", "at"]
    processes = int(words[2]) + 1  # the forked children and the forking process
    assert processes <= sandbox_manager.limits.max_pids
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 2; echo done"
    result = await tools.code_execute(
        language="shell", code=bomb, sandbox_id=fresh_sandbox, timeout=5
    )
    assert result["sandbox_id"] == fresh_sandbox  # contained, not lost
    after = await tools.code_execute(language="shell", code="echo alive", sandbox_id=fresh_sandbox)
    assert after["stdout"] == "alive\n"


async def test_unknown_language_is_a_clear_error(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """An unsupported language fails with the list of supported ones."""
    result = await tools.code_execute(language="ruby", code="puts 1", sandbox_id=sandbox_id)
    assert result["success"] is False
    assert "python, javascript, shell" in result["error"]


async def test_syntax_error_is_data(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """User-code failures come back in the result, never as exceptions."""
    result = await tools.code_execute(language="python", code="def (:", sandbox_id=sandbox_id)
    assert result["success"] is False and "SyntaxError" in result["stderr"]


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "session"])
async def test_memory_in_memfd_counts_against_the_limit(
    tools: CodeExecutionTools, fresh_sandbox: str, fresh: bool
) -> None:
    """720 MB written to a memfd under the 512 MB limit is oom, as heap memory would be."""
    code = (
        "import os\nfd = os.memfd_create('x')\nfor _ in range(90):\n"
        "    os.write(fd, b'm' * (8 << 20))\nprint('survived')"
    )
    result = await tools.code_execute(
        language="python", code=code, sandbox_id=fresh_sandbox, fresh=fresh, timeout=60
    )
    assert result["status"] == "oom" and "survived" not in result["stdout"], result


async def test_shm_and_tmp_are_bounded(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """/dev/shm and /tmp are sized tmpfs mounts: files there cannot grow without bound."""
    result = await tools.code_execute(
        language="shell",
        code="df -m --output=target,size /dev/shm /tmp | tail -n +2",
        sandbox_id=sandbox_id,
    )
    sizes = {line.split()[0]: int(line.split()[1]) for line in result["stdout"].splitlines()}
    assert 0 < sizes["/dev/shm"] <= 256 and 0 < sizes["/tmp"] <= 1024, result

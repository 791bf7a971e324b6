"""More attacks from code in a sandbox on its session, its channel and its limits.

Variants of the classes in ``test_guest.py``, each run in real gVisor and asserting the attack
is held:
- work left behind by native threads, POSIX timers, processes forked while the supervisor
  looks for leftover threads, new namespaces, ptrace, ``CLONE_PARENT``, renamed or re-exec'd
  processes, an orphaned process group (gVisor continues its stopped members), Node timers
  made around the worker's bookkeeping (``timers/promises``, ``AbortSignal.timeout``,
  unref()'d immediates, patched built-ins) and Node thread-pool jobs never runs between calls
  nor into the next call, unless the session says it was restarted;
- children a call leaves leave no zombies holding the process limit between calls;
- user code that closes, replaces or floods the worker's channel and output fds, or replaces
  what the worker calls, gets neither a forged answer to the host nor a broken sandbox;
- memory in pipe buffers (which gVisor does not show in ``/proc/meminfo``) ends at the
  container's backstop with a ``lost`` result that names memory and a working replacement;
  memory split across both session interpreters, or in deleted mapped files, is still oom.
"""

from __future__ import annotations

from typing import Any

import pytest

from harombe.tools.code_execution import CodeExecutionTools
from tests.adversarial.test_guest import (
    ATTACK_TIMEOUT_S,
    JS_BEAT,
    PY_BEAT,
    RESULT_LIMIT,
    SH_LOOP,
    assert_no_heartbeat,
    assert_quiet_between_calls,
    call,
    never_silent,
)

MB = 1024 * 1024
LIBC = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
)


FORGED_THEN_BEAT = (
    "import os, sys, json, struct, signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n{join}\nf = sys._getframe()\n"
    "while f is not None and 'request' not in f.f_locals:\n    f = f.f_back\n"
    "cell = f.f_locals['request']['cell']\nif os.fork() == 0:\n    time.sleep(30)\n"
    "    os._exit(0)\ndata = json.dumps({{'cell': cell, 'exit_code': 0, 'result': 'forged', "
    "'cpu_s': 0, 'maxrss_kb': 0}}).encode()\n"
    "os.write(4, struct.pack('>II', len(data), 0) + data)\nfor _ in range(300):\n"
    "    open('/tmp/beat', 'w').close()\n    time.sleep(0.01)"
)

# The forged reply ends the call while the interpreter forks without pause: a fork in flight
# when the sweep stops it must not leave a child running between calls.
FORGED_THEN_FORK = (
    "import os, sys, json, struct, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "f = sys._getframe()\nwhile f is not None and 'request' not in f.f_locals:\n"
    "    f = f.f_back\ncell = f.f_locals['request']['cell']\n"
    "data = json.dumps({'cell': cell, 'exit_code': 0, 'result': 'forged', "
    "'cpu_s': 0, 'maxrss_kb': 0}).encode()\n"
    "os.write(4, struct.pack('>II', len(data), 0) + data)\nwhile True:\n    try:\n"
    "        pid = os.fork()\n    except OSError:\n        continue\n    if pid == 0:\n"
    "        for _ in range(100):\n            open('/tmp/beat', 'w').close()\n"
    "            time.sleep(0.01)\n        os._exit(0)"
)

BACKGROUND = [
    # A thread that keeps forking: the supervisor lets the worker run a moment while it waits
    # for leftover threads to exit, and a child forked then must not survive the restart.
    ("python", PY_BEAT + "import threading\ndef forker():\n    while True:\n"
               "        if os.fork() == 0:\n            beat()\n        time.sleep(0.001)\n"
               "threading.Thread(target=forker, daemon=True).start()\ntime.sleep(0.05)", {}),
    # A POSIX timer (not an itimer) armed through ctypes, signalling a Python handler.
    ("python", LIBC + "import signal\n"
               "signal.signal(signal.SIGUSR2, lambda *_: open('/tmp/beat', 'w').close())\n"
               "class Event(ctypes.Structure):\n"
               "    _fields_ = [('value', ctypes.c_long), ('signo', ctypes.c_int),\n"
               "                ('notify', ctypes.c_int), ('pad', ctypes.c_char * 48)]\n"
               "event = Event(0, signal.SIGUSR2, 0)\ntimer = ctypes.c_void_p()\n"
               "assert libc.timer_create(1, ctypes.byref(event), ctypes.byref(timer)) == 0\n"
               "spec = (ctypes.c_long * 4)(0, 50_000_000, 0, 50_000_000)\n"
               "assert libc.timer_settime(timer, 0, spec, None) == 0", {}),
    # A thread created in C (pthread_create) running a Python callback.
    ("python", PY_BEAT + LIBC + "CB = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)\n"
               "def body(_):\n    beat()\ncallback = CB(body)\ntid = ctypes.c_ulong()\n"
               "assert libc.pthread_create(ctypes.byref(tid), None, callback, None) == 0", {}),
    # clone(CLONE_PARENT): the child is the supervisor's, a sibling of the interpreter.
    ("python", PY_BEAT + LIBC + "if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:\n    beat()",
     {}),
    # A child that keeps sending SIGCONT to every process it can, racing the sweep's SIGSTOP.
    ("python", PY_BEAT + "import signal\nif os.fork() == 0:\n    if os.fork() == 0:\n"
               "        beat()\n    while True:\n        try:\n"
               "            os.kill(-1, signal.SIGCONT)\n"
               "        except OSError:\n            pass", {}),
    # A tracer and its tracee: signals to the tracee go to the tracer first.
    ("python", PY_BEAT + LIBC + "child = os.fork()\nif child == 0:\n    beat()\n"
               "if os.fork() == 0:\n    libc.ptrace(0x4206, child, 0, 0)\n    while True:\n"
               "        os.waitpid(child, 0x40000000)\n        libc.ptrace(7, child, 0, 0)", {}),
    # A new user and pid namespace (allowed to uid 1000 under gVisor).
    ("python", f"import subprocess, time\nsubprocess.Popen(['unshare', '-Urpf', 'sh', '-c', "
               f"'{SH_LOOP}'])\ntime.sleep(0.3)", {}),
    # A process that re-execs itself under other names, keeping its pid.
    ("python", "import os\nif os.fork() == 0:\n    os.execv('/bin/bash', ['python3', '-c', "
               "': > /tmp/beat; sleep 0.05; exec -a harombe-worker bash -c "
               "\"$BASH_EXECUTION_STRING\"'])", {}),
    ("python", "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', "
               f"'{SH_LOOP}'], {{}}, setsid=True)", {}),
    ("shell", f"trap '' TERM HUP INT QUIT USR1 USR2; ( trap '' TERM HUP INT; {SH_LOOP} ) &", {}),
    ("shell", f"unshare -Urpf --fork sh -c '{SH_LOOP}' &\nsleep 0.3", {}),
    ("shell", f"for i in 1 2 3 4; do ( exec -a python3 sh -c '{SH_LOOP}' ) & done; sleep 0.2", {}),
    ("python", PY_BEAT + "if os.fork() == 0:\n    os.setsid()\n    beat()", {"fresh": True}),
    ("javascript", JS_BEAT + "(async () => { for await (const _ of require('timers/promises')"
                   ".setInterval(50, null, { ref: false })) beat(); })(); 1", {}),
    ("javascript", JS_BEAT + "function arm() { AbortSignal.timeout(50).addEventListener('abort', "
                   "() => { beat(); arm(); }); }\narm();", {}),
    ("javascript", JS_BEAT + "function again() { beat(); setImmediate(again).unref(); }\nagain();",
     {}),
    ("javascript", JS_BEAT + "process.getActiveResourcesInfo = () => [];\n"
                   "Array.prototype.filter = () => [];\nRegExp.prototype.test = () => false;\n"
                   "setInterval(beat, 50);", {}),
    ("javascript", JS_BEAT + "setInterval(() => { beat(); throw new Error('again'); }, 50);", {}),
    ("javascript", JS_BEAT + "process.on('beforeExit', () => setTimeout(beat, 10));\n"
                   "process.on('exit', beat);\nsetTimeout(beat, 1);", {}),
    ("javascript", "const { Worker } = require('worker_threads');\n"
                   "const shared = new Int32Array(new SharedArrayBuffer(4));\n"
                   "new Worker(\"const { workerData } = require('worker_threads'); "
                   "const fs = require('fs'); for (;;) { fs.writeFileSync('/tmp/beat', ''); "
                   "Atomics.wait(workerData, 0, 0, 50); }\", { eval: true, workerData: shared });",
     {}),
    ("javascript", "require('child_process').spawn('sh', ['-c', 'while :; do : > /tmp/beat; "
                   "kill -CONT -1 2>/dev/null; done'], { detached: true, stdio: 'ignore' });", {}),
    # A thread that waits until the interpreter was stopped and continued (the supervisor
    # looking for leftover threads), then forks a child and exits.
    ("python", PY_BEAT + "import sys, threading\nsys.setswitchinterval(0.0005)\n"
               "def sneak():\n    last = time.monotonic()\n    while True:\n"
               "        now = time.monotonic()\n        if now - last > 0.004:\n"
               "            if os.fork() == 0:\n                beat()\n            return\n"
               "        last = now\nthreading.Thread(target=sneak, daemon=True).start()\n"
               "time.sleep(0.1)", {}),
    # A forged end of call, SIGHUP and SIGCHLD ignored, a child the sweep kills: an orphaned
    # process group with a stopped member gets SIGCONT under gVisor.
    ("python", FORGED_THEN_BEAT.format(join=""), {}),
    ("python", FORGED_THEN_BEAT.format(join="os.setpgid(0, 1)"), {}),
    ("python", FORGED_THEN_FORK, {}),
    # Thread-pool work is not among Node's active resources.
    ("javascript", JS_BEAT + "require('crypto').pbkdf2('a', 'b', 4e5, 64, 'sha512', beat);", {}),
    ("javascript", JS_BEAT + "require('zlib').gzip(Buffer.alloc(50e6, 7), beat);", {}),
    ("javascript", JS_BEAT + "require('crypto').pbkdf2('a', 'b', 1e9, 64, 'sha512', beat);", {}),
]  # fmt: skip
BACKGROUND_IDS = [
    "py-thread-keeps-forking", "py-posix-timer-signal", "py-ctypes-pthread",
    "py-clone-parent", "py-sigcont-everyone", "py-ptrace-sibling", "py-unshare-userns-pidns",
    "py-reexec-renamed", "py-posix-spawn-setsid", "sh-traps-everything", "sh-unshare-pidns",
    "sh-disguised-as-python3", "py-fresh-setsid-child", "js-timers-promises-unref",
    "js-abortsignal-timeout-chain", "js-unref-immediate-chain", "js-patched-builtins",
    "js-throwing-interval", "js-exit-handlers", "js-atomics-wait-worker",
    "js-child-sigcont-everyone", "py-thread-forks-when-thawed", "py-forged-sighup-ignored",
    "py-forged-in-supervisor-pgrp", "py-forged-then-fork-storm", "js-crypto-pool-job",
    "js-zlib-pool-job", "js-endless-pool-job",
]  # fmt: skip


@pytest.mark.parametrize(("language", "attack", "kw"), BACKGROUND, ids=BACKGROUND_IDS)
async def test_background_work_ends_with_its_call(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, attack: str, kw: dict[str, Any]
) -> None:
    """Work a call leaves behind never runs between calls or into the next call, silently."""
    result = await call(tools, fresh_sandbox, language, attack, timeout=ATTACK_TIMEOUT_S, **kw)
    assert result["sandbox_id"] == fresh_sandbox and result["status"] != "lost", result
    never_silent(result)
    await assert_no_heartbeat(
        tools, fresh_sandbox, "javascript" if language == "javascript" else "python"
    )


SUPERVISOR_FRAME = (
    "import json, struct\nbody = json.dumps({'op': 'done', 'id': 99, 'status': 'ok',"
    " 'exit_code': 0, 'result': 'forged', 'stdout_len': 0, 'stderr_len': 0, 'stdout_total': 0,"
    " 'stderr_total': 0}).encode()\nframe = struct.pack('>II', len(body), 0) + body\n"
)
CHANNEL = [
    ("python", "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 4)"),
    ("python", "import os\nos.close(3)"),
    ("python", "import os, signal\nsignal.set_wakeup_fd(4)\nos.kill(os.getpid(), signal.SIGUSR1)"),
    ("python", "import os, signal\nr, w = os.pipe()\nos.dup2(r, 3)\nos.write(w, b'\\0' * 8)"),
    ("python", SUPERVISOR_FRAME + "import os, sys\nfor fd in (1, 2):\n"
               "    os.write(fd, frame * 50)\nprint(frame.decode('latin-1') * 50)\n"
               "sys.stderr.write('x')"),
    ("python", "import os\nfor fd in (1, 2):\n    for _ in range(40):\n"
               "        os.write(fd, b'z' * (1 << 20))"),
    ("python", "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = None\n"
               "sys.stdin = None\nprint('gone')"),
    ("python", "import os, struct\ndata = b'[' * 100_000 + b']' * 100_000\n"
               "os.write(4, struct.pack('>II', len(data), 0) + data)"),
    ("javascript", "require('fs').closeSync(4);"),
    ("javascript", "const fs = require('fs'); fs.writeSync = () => 0; JSON.stringify = () => '{}';"
                   "\nPromise.prototype.then = function () { return this; };"
                   "\nPromise.race = () => 0;"
                   "\nrequire('util').inspect = () => 'forged'; 'x'"),
    ("javascript", "const fs = require('fs'); for (let i = 0; i < 40; i++) "
                   "fs.writeSync(1, Buffer.alloc(1 << 20, 122));"),
    ("shell", "python3 - <<'EOF'\n" + SUPERVISOR_FRAME + "import os\nfor _ in range(1000):\n"
              "    os.write(1, frame)\nEOF"),
]  # fmt: skip
CHANNEL_IDS = [
    "py-dup2-devnull-over-reply-fd", "py-close-request-fd", "py-wakeup-fd-on-reply-fd",
    "py-fake-request-pipe", "py-supervisor-frames-on-stdout-stderr", "py-40MB-raw-fds",
    "py-replace-sys-streams", "py-deeply-nested-reply", "js-close-reply-fd",
    "js-replace-what-the-worker-calls", "js-40MB-raw-stdout", "sh-supervisor-frames-on-stdout",
]  # fmt: skip


@pytest.mark.parametrize(("language", "attack"), CHANNEL, ids=CHANNEL_IDS)
async def test_channel_abuse_never_forges_or_breaks_the_sandbox(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, attack: str
) -> None:
    """Closing, replacing or flooding the worker's fds yields capped, honest results."""
    result = await call(tools, fresh_sandbox, language, attack, timeout=ATTACK_TIMEOUT_S)
    assert result["sandbox_id"] == fresh_sandbox and result["status"] != "lost", result
    assert result.get("result") != "'forged'" and result.get("result") != "forged", result
    assert len(result.get("result") or "") <= RESULT_LIMIT
    assert len(result["stdout"]) <= MB + 100 and len(result["stderr"]) <= MB + 100
    never_silent(result)
    await assert_quiet_between_calls(tools, fresh_sandbox)
    if language != "shell":
        marker = "'mine'"
        after = await call(tools, fresh_sandbox, language, marker, timeout=ATTACK_TIMEOUT_S)
        never_silent(after)
        if after["result"] != marker:  # the attack may end the session: said, then fresh
            assert after["state_lost"] is True, after
            after = await call(tools, fresh_sandbox, language, marker)
        assert after["result"] == marker, after
        assert after["stdout"] == "" and after["status"] == "ok", after


async def test_streamed_output_flood_is_capped(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Streaming 40 MB from several processes at once delivers at most the cap per stream."""
    got: list[bytes] = []
    result = await tools.code_execute(
        language="shell",
        code="for i in 1 2 3 4; do head -c 10M /dev/zero | tr '\\0' a & done; wait",
        sandbox_id=fresh_sandbox,
        timeout=30,
        on_output=lambda _stream, data: got.append(data),
    )
    assert result["sandbox_id"] == fresh_sandbox and result["status"] == "ok", result
    assert sum(map(len, got)) <= 2 * (MB + 100), sum(map(len, got))


async def test_pipe_buffers_end_at_the_backstop_as_lost_memory(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Pipe buffers, unseen by gVisor's meminfo, end at the cgroup backstop: lost, naming
    memory, with a working replacement."""
    flood = (
        "import os, fcntl\nkeep = []\nfor _ in range(4000):\n    r, w = os.pipe()\n"
        "    fcntl.fcntl(w, 1031, 1 << 20)\n    os.write(w, b'p' * (1 << 20))\n    os.close(w)\n"
        "    keep.append(r)"
    )
    result = await call(tools, fresh_sandbox, "python", flood, timeout=120)
    assert result["status"] in ("lost", "oom"), result
    if result["status"] == "lost":
        assert "memory" in result["error"], result
        replacement = result["sandbox_id"]
        assert replacement != fresh_sandbox
        after = await call(tools, replacement, "python", "'alive'")
        assert after["result"] == "'alive'", after
        await tools.code_destroy_sandbox(replacement)


MEMORY = [
    # Half the limit in each session interpreter: the sandbox-wide total is what counts.
    [("python", "hold = bytearray(300 << 20)\nfor i in range(0, len(hold), 4096):\n"
                "    hold[i] = 1"),
     ("javascript", "var hold = Buffer.alloc(300 << 20, 1); hold.length")],
    # Deleted files kept mapped: gone from the directory, still in memory.
    [("python", "import mmap, os\nmaps = []\nfor i in range(4):\n    p = '/tmp/m%d' % i\n"
                "    with open(p, 'wb') as f:\n        f.write(b'd' * (200 << 20))\n"
                "    fd = os.open(p, os.O_RDWR)\n    maps.append(mmap.mmap(fd, 200 << 20))\n"
                "    os.close(fd)\n    os.unlink(p)")],
]  # fmt: skip


@pytest.mark.parametrize("steps", MEMORY, ids=["split-across-interpreters", "deleted-mapped-files"])
async def test_memory_outside_one_process_still_counts(
    tools: CodeExecutionTools, fresh_sandbox: str, steps: list[tuple[str, str]]
) -> None:
    """Memory split across interpreters or held in unlinked mapped files is over the limit:
    the last step is oom or refused (no space), never ok with the memory still held."""
    results = [await call(tools, fresh_sandbox, lang, code, timeout=60) for lang, code in steps]
    last = results[-1]
    assert last["sandbox_id"] == fresh_sandbox, last
    assert last["status"] in ("oom", "error"), results
    if last["status"] == "oom":
        assert last["state_lost"] or last["stateful"] is False, last
    check = await call(tools, fresh_sandbox, "shell", "rm -f /tmp/* /workspace/big; echo alive")
    assert check["stdout"] == "alive\n", check


@pytest.mark.parametrize(
    "path", ["/tmp/big", "/workspace/big", "/dev/shm/big"], ids=["tmp", "workspace", "dev-shm"]
)
async def test_fallocate_past_a_mount_is_refused_or_oom(
    tools: CodeExecutionTools, fresh_sandbox: str, path: str
) -> None:
    """Reserving 4 GB in a memory-backed mount is refused (no space) or ends oom, never held."""
    code = f"fallocate -l 4G {path} && echo HELD-4G || echo REFUSED; rm -f {path}"
    result = await call(tools, fresh_sandbox, "shell", code, timeout=60)
    assert result["sandbox_id"] == fresh_sandbox, result
    assert result["status"] == "oom" or result["stdout"] == "REFUSED\n", result


async def test_children_of_a_stopped_interpreter_hold_no_process_budget(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """110 children a session call leaves are gone with it: no zombies hold the process
    limit while the interpreter is stopped, and the next call can start 40 processes."""
    spawn = "import subprocess\nkids = [subprocess.Popen(['sleep', '100']) for _ in range(110)]"
    first = await call(tools, fresh_sandbox, "python", spawn, timeout=60)
    assert first["status"] == "ok", first
    many = "for i in $(seq 40); do sleep 0.1 & done; wait; ps -eo stat= | grep -c '^Z' || true"
    after = await call(tools, fresh_sandbox, "shell", many, timeout=60)
    assert after["status"] == "ok" and "fork" not in after["stderr"], after
    assert after["stdout"] == "0\n", after

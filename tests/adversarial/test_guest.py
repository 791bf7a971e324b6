"""Attacks from code running in a sandbox on its own session, its channel and its limits.

Each probe runs hostile code in real gVisor and asserts the attack is held:
- background work (threads, timers, processes, fork chains, daemons) never runs after its call
  ends: a heartbeat file it keeps touching stays untouched between calls and during the next
  call, and a session that had to be restarted says so (``state_lost`` with a warning);
- frames forged on the session worker's reply channel never reach the host as the supervisor's
  words: sizes stay capped, the sandbox survives, and the next call gets its own answer or says
  the session was lost;
- memory held in memory-backed files (memfd, /dev/shm, /tmp, shared mappings) counts against
  ``max_memory_mb`` or is capped by its mount;
- the host channel refuses frames over its caps without allocating them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import struct
from typing import Any

import pytest

from harombe.errors import SandboxLostError
from harombe.security.runtime.channel import Channel, FrameDecoder, ProtocolError, encode
from harombe.tools.code_execution import CodeExecutionTools

BEAT = "/tmp/beat"
ATTACK_TIMEOUT_S = 3
RESULT_LIMIT = 10000


async def call(tools: CodeExecutionTools, sid: str, language: str, code: str, **kw: Any) -> dict:  # type: ignore[type-arg]
    return await tools.code_execute(language=language, code=code, sandbox_id=sid, **kw)  # type: ignore[no-any-return]


def never_silent(result: dict[str, Any]) -> None:
    """A session that was lost says so: state_lost comes with a warning naming why."""
    assert result["state_lost"] is False or result["warnings"], result


async def assert_quiet_between_calls(tools: CodeExecutionTools, sid: str) -> None:
    """Nothing of the session touches the heartbeat while no session call runs."""
    between = await call(
        tools, sid, "shell", f"rm -f {BEAT}; sleep 0.6; test -e {BEAT} && echo LEAK || echo HELD"
    )
    assert between["stdout"] == "HELD\n", between


async def assert_no_heartbeat(tools: CodeExecutionTools, sid: str, language: str) -> None:
    """Nothing touches the heartbeat between calls, nor during the next call of the session; a
    next call that finds its interpreter gone (a timer's signal killed it) says so."""
    await assert_quiet_between_calls(tools, sid)
    if language == "javascript":
        probe = (
            "(async () => { const fs = require('fs'); fs.rmSync('/tmp/beat', {force: true});"
            " await new Promise((r) => setTimeout(r, 600)); return fs.existsSync('/tmp/beat'); })()"
        )
        expected = "false"
    else:
        probe = f"import os, time\nif os.path.exists('{BEAT}'): os.remove('{BEAT}')\n"
        probe += f"time.sleep(0.6)\nos.path.exists('{BEAT}')"
        expected = "False"
    during = await call(tools, sid, language, probe, timeout=10)
    never_silent(during)
    if during["result"] is None and during["state_lost"]:
        during = await call(tools, sid, language, probe, timeout=10)
    assert during["result"] == expected, during
    assert (await call(tools, sid, language, "1 + 1"))["result"] == "2"


PY_BEAT = (
    "import os, time\ndef beat():\n    while True:\n        open('/tmp/beat', 'w').close()\n"
    "        time.sleep(0.05)\n"
)
JS_BEAT = "var beatFs = require('fs'); var beat = () => beatFs.writeFileSync('/tmp/beat', '');\n"
SH_LOOP = "while :; do : > /tmp/beat; sleep 0.05; done"

BACKGROUND = [
    ("python", PY_BEAT + "import threading\nthreading.Thread(target=beat, daemon=True).start()"),
    ("python", PY_BEAT + "import threading\nthreading.Thread(target=beat).start()"),
    ("python", PY_BEAT + "import _thread\n_thread.start_new_thread(beat, ())"),
    ("python", PY_BEAT + "from concurrent.futures import ThreadPoolExecutor\n"
               "pool = ThreadPoolExecutor(2)\npool.submit(beat)"),
    ("python", "import threading\ndef tick():\n    open('/tmp/beat', 'w').close()\n"
               "    t = threading.Timer(0.05, tick); t.daemon = True; t.start()\ntick()"),
    ("python", "import asyncio, threading\nasync def beat():\n    while True:\n"
               "        open('/tmp/beat', 'w').close()\n        await asyncio.sleep(0.05)\n"
               "loop = asyncio.new_event_loop()\nloop.create_task(beat())\n"
               "threading.Thread(target=loop.run_forever, daemon=True).start()"),
    ("python", "import asyncio\nasync def beat():\n    while True:\n"
               "        open('/tmp/beat', 'w').close()\n        await asyncio.sleep(0.05)\n"
               "async def main():\n    asyncio.get_running_loop().create_task(beat())\n"
               "    await asyncio.sleep(0.1)\nasyncio.run(main())"),
    ("python", "import signal\ndef on_alarm(*_):\n    open('/tmp/beat', 'w').close()\n"
               "signal.signal(signal.SIGALRM, on_alarm)\n"
               "signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)"),
    ("python", "import faulthandler\nfaulthandler.dump_traceback_later(0.05, repeat=True, "
               "file=open('/tmp/beat', 'w'))"),
    ("python", PY_BEAT + "if os.fork() == 0:\n    beat()"),
    ("python", "import os, time\nif os.fork() == 0:\n    while True:\n"
               "        if os.fork():\n            os._exit(0)\n"
               "        open('/tmp/beat', 'w').close()\n        time.sleep(0.01)"),
    ("python", "import os\nif os.fork() == 0:\n    n = 0\n    while True:\n"
               "        if os.fork():\n            os._exit(0)\n        n += 1\n"
               "        if n % 10 == 0:\n            open('/tmp/beat', 'w').close()"),
    ("python", "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        n = 0\n"
               "        while True:\n"
               "            os.setsid() if os.getsid(0) != os.getpid() else None\n"
               "            if os.fork():\n                os._exit(0)\n            n += 1\n"
               "            if n % 10 == 0:\n                open('/tmp/beat', 'w').close()"),
    ("python", PY_BEAT + "if os.fork() == 0:\n    os.setsid()\n    if os.fork():\n"
               "        os._exit(0)\n    beat()"),
    ("python", f"import subprocess\nsubprocess.Popen(['sh', '-c', '{SH_LOOP}'], "
               "start_new_session=True)"),
    ("python", PY_BEAT + "import multiprocessing as mp\n"
               "mp.Process(target=beat, daemon=False).start()"),
    ("python", PY_BEAT + "import threading, os\n"
               "threading.Thread(target=lambda: os.fork() or None, daemon=True).start()\n"
               "threading.Thread(target=beat, daemon=True).start()"),
    ("shell", f"( {SH_LOOP} ) &\ndisown"),
    ("shell", f"nohup setsid sh -c '{SH_LOOP}' >/dev/null 2>&1 &"),
    ("shell", "hop() { : > /tmp/beat; sleep 0.02; ( hop & ) ; }\n( hop & )\nsleep 0.2"),
    ("javascript", JS_BEAT + "setInterval(beat, 50);"),
    ("javascript", JS_BEAT + "setInterval(beat, 50).unref();"),
    ("javascript", JS_BEAT + "function again() { beat(); setTimeout(again, 50); } again();"),
    ("javascript", JS_BEAT + "require('timers').setInterval(beat, 50).unref();"),
    ("javascript", JS_BEAT + "(async () => { for (;;) { beat(); "
                   "await new Promise((r) => setTimeout(r, 50)); } })(); 'started'"),
    ("javascript", JS_BEAT + "(async () => { for await (const _ of "
                   "require('timers/promises').setInterval(50)) beat(); })();"),
    ("javascript", "const { Worker } = require('worker_threads');\nnew Worker(\"const fs = "
                   "require('fs'); setInterval(() => fs.writeFileSync('/tmp/beat', ''), 50)\", "
                   "{ eval: true }).unref();"),
    ("javascript", f"require('child_process').spawn('sh', ['-c', '{SH_LOOP}'], "
                   "{ detached: true, stdio: 'ignore' }).unref();"),
]  # fmt: skip
BACKGROUND_IDS = [
    "py-daemon-thread", "py-thread", "py-_thread", "py-executor", "py-timer-chain",
    "py-asyncio-loop-thread", "py-asyncio-task-left", "py-itimer-signal", "py-faulthandler-later",
    "py-fork-child", "py-fork-hopping", "py-fork-hopping-fast", "py-fork-hopping-setsid-x3",
    "py-setsid-double-fork", "py-popen-new-session",
    "py-multiprocessing", "py-fork-from-thread", "sh-background-disown", "sh-nohup-setsid",
    "sh-fork-hopping", "js-setInterval", "js-setInterval-unref", "js-setTimeout-chain",
    "js-timers-module-unref", "js-promise-loop", "js-timers-promises", "js-worker-thread",
    "js-detached-child",
]  # fmt: skip


@pytest.mark.parametrize(("language", "attack"), BACKGROUND, ids=BACKGROUND_IDS)
async def test_background_work_ends_with_its_call(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, attack: str
) -> None:
    """Work a call leaves running never runs between calls or into the next call."""
    result = await call(tools, fresh_sandbox, language, attack, timeout=ATTACK_TIMEOUT_S)
    assert result["sandbox_id"] == fresh_sandbox, result
    if result["stateful"]:
        never_silent(result)
    await assert_no_heartbeat(
        tools, fresh_sandbox, "javascript" if language == "javascript" else "python"
    )


def forge(header: str, body: str = "") -> str:
    """Python that writes bytes on the worker's reply channel (fd 4)."""
    return "import os, struct, json, sys\n" + header + "\n" + body


def find_cell() -> str:
    return (
        "f = sys._getframe()\nwhile f is not None and 'request' not in f.f_locals:\n"
        "    f = f.f_back\ncell = f.f_locals['request']['cell'] if f else 1\n"
    )


def frame(json_expr: str, blob_expr: str = "b''") -> str:
    return (
        f"data = json.dumps({json_expr}).encode()\nblob = {blob_expr}\n"
        "os.write(4, struct.pack('>II', len(data), len(blob)) + data + blob)\n"
    )


GOOD = "{'cell': cell, 'exit_code': 0, 'result': 'forged', 'cpu_s': 0, 'maxrss_kb': 0}"
FORGED = [
    ("python", forge(find_cell() + frame(GOOD), "import time\nfor _ in range(400):\n"
     "    open('/tmp/beat', 'w').close()\n    time.sleep(0.01)")),
    ("python", forge(find_cell()
                     + frame("{'cell': cell, 'exit_code': 0, 'result': 'x' * 20_000_000}"))),
    ("python", forge(find_cell() + frame(GOOD, "b'y' * 20_000_000"))),
    ("python", forge("os.write(4, struct.pack('>II', 20_000_000, 0))",
                     "import time\ntime.sleep(0.2)")),
    ("python", forge("os.write(4, struct.pack('>II', 0xFFFFFFFF, 0xFFFFFFFF))")),
    ("python", forge(frame("None").replace("json.dumps(None).encode()", "b'{not json'"))),
    ("python", forge("cell = 1\n" + frame("[1, 2, 3]"))),
    ("python", forge("cell = -5\n" + frame(GOOD))),
    ("python", forge(find_cell() + frame("{'cell': cell, 'exit_code': 10**30}"))),
    ("python", forge(find_cell() + frame("{'cell': cell, 'exit_code': 0, 'evil': 1}"))),
    ("python", forge(find_cell() + "import time\ndata = json.dumps(" + GOOD + ").encode()\n"
     "whole = struct.pack('>II', len(data), 0) + data\nos.write(4, whole[:5])\ntime.sleep(0.1)\n"
     "os.write(4, whole[5:])")),
    ("python", forge(find_cell() + "data = json.dumps(" + GOOD + ").encode()\n"
     "os.write(4, struct.pack('>II', len(data) + 40, 0) + data)")),
    ("python", forge(find_cell() + frame(GOOD) + frame(GOOD))),
    ("python", forge(find_cell() + frame(GOOD), "os._exit(0)")),
    ("python", forge(find_cell() + frame(GOOD),
                     "import threading, time\ndef beat():\n    while True:\n"
                     "        open('/tmp/beat', 'w').close()\n        time.sleep(0.05)\n"
                     "threading.Thread(target=beat).start()\ntime.sleep(1)")),
    ("javascript", "const fs = require('fs'); const d = Buffer.from(JSON.stringify({cell: 1, "
     "exit_code: 0, result: 'x'.repeat(20e6)})); const h = Buffer.alloc(8); "
     "h.writeUInt32BE(d.length, 0); fs.writeSync(4, Buffer.concat([h, d]));"),
    ("javascript", "const h = Buffer.alloc(8); h.writeUInt32BE(0xFFFFFFF0, 0); "
     "require('fs').writeSync(4, h);"),
    ("javascript", "const fs = require('fs'); const d = Buffer.from('{\"ready\": true, "
     "\"threads\": []}'); const h = Buffer.alloc(8); h.writeUInt32BE(d.length, 0); "
     "fs.writeSync(4, Buffer.concat([h, d])); for (let i = 0; i < 200; i++) "
     "fs.writeFileSync('/tmp/beat', '');"),
]  # fmt: skip
FORGED_IDS = [
    "py-done-then-run-on", "py-20MB-result", "py-20MB-tail", "py-20MB-header-only",
    "py-4GB-header", "py-not-json", "py-not-an-object", "py-wrong-cell", "py-huge-exit-code",
    "py-unknown-field", "py-split-across-writes", "py-short-frame-swallows-next",
    "py-two-dones", "py-done-then-exit", "py-done-then-thread", "js-20MB-result",
    "js-4GB-header", "js-forged-ready",
]  # fmt: skip


@pytest.mark.parametrize(("language", "attack"), FORGED, ids=FORGED_IDS)
async def test_forged_worker_frames_never_speak_for_the_supervisor(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, attack: str
) -> None:
    """Frames user code writes on the worker's channel are capped and cannot derail the session."""
    result = await call(tools, fresh_sandbox, language, attack, timeout=ATTACK_TIMEOUT_S)
    assert result["sandbox_id"] == fresh_sandbox and result["status"] != "lost", result
    assert len(result.get("result") or "") <= RESULT_LIMIT
    assert len(result["stdout"]) <= 1_048_576 + 100
    never_silent(result)
    # A forged end of call stops the code on the spot (it may only go on inside a later call,
    # under that call's limits, which then says the session was lost).
    await assert_quiet_between_calls(tools, fresh_sandbox)
    # The session answers with its own results again, whatever the forgery did.
    marker = "'mine'"
    after = await call(tools, fresh_sandbox, language, marker, timeout=ATTACK_TIMEOUT_S)
    never_silent(after)
    if after["result"] != marker:
        after = await call(tools, fresh_sandbox, language, marker)
    assert after["result"] == marker, after


MB = 1024 * 1024
MEMORY = [
    ("python", "import os\nfd = os.memfd_create('x')\nfor _ in range(90):\n"
               "    os.write(fd, b'm' * (8 << 20))", ("oom",)),
    ("python", "import mmap\nm = mmap.mmap(-1, 720 << 20, flags=mmap.MAP_SHARED)\n"
               "for i in range(0, 720 << 20, 1 << 20):\n    m[i:i + (1 << 20)] = b's' * (1 << 20)",
     ("oom",)),
    ("python", "import os, mmap\nfd = os.memfd_create('x')\nos.ftruncate(fd, 720 << 20)\n"
               "m = mmap.mmap(fd, 720 << 20)\nfor i in range(0, 720 << 20, 4096):\n    m[i] = 1",
     ("oom",)),
    ("python", "import os\nfd = os.memfd_create('x')\nfor _ in range(40):\n"
               "    os.write(fd, b'm' * (8 << 20))\nhold = [bytearray(8 << 20) for _ in range(50)]",
     ("oom",)),
    ("python", "with open('/dev/shm/x', 'wb') as f:\n    for _ in range(90):\n"
               "        f.write(b's' * (8 << 20))", ("oom", "error")),
    ("python", "with open('/tmp/x', 'wb') as f:\n    for _ in range(90):\n"
               "        f.write(b't' * (8 << 20))", ("oom", "error")),
    ("python", "from multiprocessing import shared_memory\n"
               "s = shared_memory.SharedMemory(create=True, size=720 << 20)\n"
               "for i in range(0, 720 << 20, 4096):\n    s.buf[i] = 1", ("oom", "error")),
    ("shell", "head -c 760M /dev/zero > /dev/shm/x; head -c 760M /dev/zero > /tmp/x; "
              "python3 -c \"import os; fd = os.memfd_create('x'); [os.write(fd, b'z' * (8 << 20)) "
              "for _ in range(90)]\"", ("oom",)),
    ("javascript", "const fs = require('fs'); const b = Buffer.alloc(8 << 20, 1);\n"
                   "const fd = fs.openSync('/dev/shm/js', 'w');\n"
                   "for (let i = 0; i < 90; i++) fs.writeSync(fd, b);", ("oom", "error")),
]  # fmt: skip
MEMORY_IDS = [
    "memfd-write", "mmap-shared-anon", "memfd-mmap", "memfd-plus-heap", "dev-shm-file",
    "tmp-file", "shared-memory-module", "shell-shm-tmp-memfd", "js-dev-shm",
]  # fmt: skip


@pytest.mark.parametrize(("language", "attack", "statuses"), MEMORY, ids=MEMORY_IDS)
async def test_memory_backed_files_count_against_the_limit(
    tools: CodeExecutionTools, fresh_sandbox: str, language: str, attack: str,
    statuses: tuple[str, ...],
) -> None:  # fmt: skip
    """720 MB held in memory-backed files under a 512 MB limit is oom, or capped by its mount."""
    result = await call(tools, fresh_sandbox, language, attack, timeout=60)
    assert result["status"] in statuses, result
    assert result["sandbox_id"] == fresh_sandbox
    check = await call(
        tools, fresh_sandbox, "shell", "rm -f /dev/shm/* /tmp/x; echo alive", timeout=30
    )
    assert check["stdout"] == "alive\n", check


async def test_memory_kept_across_calls_adds_up(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Two calls that each keep 300 MB in memfds are over 512 MB together: the second is oom."""
    keep = "import os\nfds = globals().setdefault('fds', [])\nfd = os.memfd_create('k')\n"
    keep += "for _ in range(38):\n    os.write(fd, b'k' * (8 << 20))\nfds.append(fd)"
    first = await call(tools, fresh_sandbox, "python", keep, timeout=60)
    assert first["status"] == "ok", first
    second = await call(tools, fresh_sandbox, "python", keep, timeout=60)
    assert second["status"] == "oom" and second["state_lost"] is True, second


FD_PROBES = [
    # gVisor (20221219) lists /proc/1/fd to anyone (mode 0555); opening an entry is what counts.
    "import os\nopened = []\nfor f in os.listdir('/proc/1/fd'):\n"
    "    for mode in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):\n        try:\n"
    "            os.open('/proc/1/fd/' + f, mode)\n            opened.append(f)\n"
    "        except OSError:\n            pass\nprint('OPEN' if opened else 'HELD')",
    "import os\ntry:\n    os.open('/proc/1/fd/1', os.O_WRONLY)\n    print('OPEN')\n"
    "except PermissionError:\n    print('HELD')",
    "import os\nprint('HELD' if sorted(int(f) for f in os.listdir('/proc/self/fd'))[:5] == "
    "[0, 1, 2, 3, 4] and os.readlink('/proc/self/fd/0') == '/dev/null' else 'OPEN')",
]  # fmt: skip


@pytest.mark.parametrize(
    "probe",
    FD_PROBES,
    ids=["proc-1-fd-any-open", "proc-1-fd-open-stdout", "worker-fds-are-its-own"],
)
async def test_session_code_cannot_reach_the_supervisors_fds(
    tools: CodeExecutionTools, sandbox_id: str, probe: str
) -> None:
    """The supervisor's fds (its channel to the host) are out of reach of session code."""
    result = await call(tools, sandbox_id, "python", probe)
    assert result["stdout"] == "HELD\n", result


class FakeStdio:
    """Stands in for a container's stdio: the test plays the supervisor."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self.written: list[bytes] = []

    async def read(self) -> tuple[int, bytes] | None:
        return await self.inbox.get()

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.inbox.put_nowait(None)


HOSTILE_STREAMS = [
    struct.pack(">II", 20_000_000, 0),
    struct.pack(">II", 16, 0xFFFFFFFF),
    struct.pack(">II", 5, 0) + b"[1,2]",
    struct.pack(">II", 9, 0) + b"{not json",
]


@pytest.mark.parametrize(
    "data", HOSTILE_STREAMS, ids=["20MB-json", "4GB-blob", "not-an-object", "not-json"]
)
async def test_host_channel_refuses_frames_out_of_bounds(data: bytes) -> None:
    """A frame over the caps or not an object fails the sandbox cleanly (lost), never buffered."""
    stdio = FakeStdio()
    channel = Channel(stdio, sandbox_id="probe", max_blob_bytes=1 << 20)  # type: ignore[arg-type]
    stdio.inbox.put_nowait((1, encode({"op": "hello"})))
    await channel.hello(timeout_s=5)
    waiting = asyncio.create_task(channel.request({"op": "ping"}, timeout_s=5))
    await asyncio.sleep(0)
    stdio.inbox.put_nowait((1, data))
    with pytest.raises(SandboxLostError, match="protocol"):
        await waiting
    assert channel.lost is not None
    await channel.close()


def test_frame_decoder_checks_lengths_before_buffering() -> None:
    """A header that claims 20 MB is refused at once, before any body arrives."""
    decoder = FrameDecoder(max_json_bytes=1024, max_blob_bytes=1024)
    with pytest.raises(ProtocolError):
        decoder.feed(struct.pack(">II", 20_000_000, 0))


async def test_streamed_output_over_the_cap_loses_the_sandbox() -> None:
    """Streamed chunks are counted per run: past the blob cap the channel ends."""
    stdio = FakeStdio()
    channel = Channel(stdio, sandbox_id="probe", max_blob_bytes=1000)  # type: ignore[arg-type]
    stdio.inbox.put_nowait((1, encode({"op": "hello"})))
    await channel.hello(timeout_s=5)
    chunks: list[bytes] = []
    waiting = asyncio.create_task(
        channel.request({"op": "run"}, timeout_s=5, on_output=lambda _s, b: chunks.append(b))
    )
    await asyncio.sleep(0)
    for _ in range(3):
        stdio.inbox.put_nowait((1, encode({"op": "out", "id": 1, "stream": "stdout"}, b"x" * 600)))
    with pytest.raises(SandboxLostError, match="protocol"):
        await waiting
    assert sum(map(len, chunks)) <= 1000


async def test_channel_timeout_leaves_no_unretrieved_future(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request that times out fails cleanly; asyncio logs no 'exception was never retrieved'."""
    stdio = FakeStdio()
    channel = Channel(stdio, sandbox_id="probe")  # type: ignore[arg-type]
    stdio.inbox.put_nowait((1, encode({"op": "hello"})))
    await channel.hello(timeout_s=5)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(SandboxLostError):
            await channel.request({"op": "ping"}, timeout_s=0.05)
        await channel.close()
        gc.collect()
        await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
    assert json.loads(stdio.written[0][8:])["op"] == "ping"

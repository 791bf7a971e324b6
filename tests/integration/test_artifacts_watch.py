"""``changed_files`` from the supervisor's inotify watch, against real gVisor: after every call of
a sequence of file operations, the list is the one two full walks of ``/workspace`` give (the
walk run as user code, before and after the call)."""

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.security.guest import HERE, SUPERVISOR_PARTS, load
from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

SUPERVISOR = load(SUPERVISOR_PARTS, "harombe_supervisor_watch_live")
_TEXT = (HERE / "supervisor_artifacts.py").read_text(encoding="utf-8")
#: ``scan_workspace`` and what it needs, run as user code: the reference answer.
WALK = (
    "import errno, json, os\n"
    "WORKSPACE_ROOT, MAX_SCAN_ENTRIES, SKIPPED_TOP = '/workspace', 10000, {'.harombe'}\n"
    + _TEXT[_TEXT.index("def scan_workspace") : _TEXT.index("def scan_as_user")]
    + "print(json.dumps(scan_workspace()))\n"
)

#: Writes to each of two files in the flood step: together past the watch's MAX_EVENTS.
FLOOD_WRITES = 10000
#: (id, language, code): each a call whose changed_files must be the walks' answer.
STEPS = [
    ("create", "shell", "echo a > f1"),
    ("append", "shell", "echo b >> f1"),
    ("truncate", "shell", "truncate -s 1 f1"),
    ("same-size-rewrite", "shell", "printf Z | dd of=f1 conv=notrunc 2>/dev/null"),
    ("rename", "shell", "mv f1 f2"),
    ("mkdir-p-deep", "shell", "mkdir -p d1/d2/d3/d4 && echo x > d1/d2/d3/d4/g && echo y > d1/h"),
    ("write-deep", "shell", "echo more >> d1/d2/d3/d4/g"),
    ("dir-rename", "shell", "mv d1 m1 && echo new > m1/d2/n"),
    ("rm-rf", "shell", "rm -rf m1"),
    ("hard-link-out", "shell", "echo h > hl && mkdir -p .harombe && ln hl .harombe/hl2"),
    ("write-via-link", "shell", "echo via >> .harombe/hl2"),
    ("hard-link-in", "shell", "ln hl hl3 && echo both >> hl3"),
    ("chmod", "shell", "chmod 600 f2"),
    ("utime-old", "shell", "touch -d 2001-01-01 f2"),
    ("python-utime", "python", "import os; os.utime('/workspace/hl', (1, 1))"),
    ("write-only", "shell", "chmod 200 f2 && echo w >> f2"),
    ("unreadable-dir", "shell", "mkdir -p u && chmod 300 u && echo s > u/secret"),
    ("readable-again", "shell", "chmod 755 u"),
    (
        "moved-in",
        "shell",
        "mkdir -p .harombe/md/sub && echo m > .harombe/md/sub/m && mv .harombe/md md",
    ),
    ("moved-out", "shell", "mv md .harombe/md2 && echo later >> .harombe/md2/sub/m"),
    ("file-to-dir", "shell", "rm f2 && mkdir f2 && echo i > f2/inner"),
    ("symlink-swap", "shell", "rm -rf u && ln -s /etc u && mkfifo p1"),
    (
        "background-killed",
        "shell",
        "(while true; do echo z >> bg; echo q >> bg2; sleep 0.01; done) & sleep 0.3",
    ),
    # More events than the watch reads (MAX_EVENTS): its queue is dropped and the walk answers.
    # One write is one event; two files take turns so that none is merged with the last.
    # (Writes, not a shell loop: 10,000 shell redirections took over 30 s on a busy machine.)
    (
        "event-flood",
        "python",
        "import os\n"
        "flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND\n"
        "fds = [os.open(f'/workspace/e{n}', flags) for n in (0, 1)]\n"
        f"for i in range({FLOOD_WRITES}):\n"
        "    for fd in fds:\n"
        "        os.write(fd, b'.')\n"
        "for fd in fds:\n"
        "    os.close(fd)\n",
    ),
    ("after-the-flood", "shell", "echo again >> e0"),
    ("python-session", "python", "open('/workspace/py.txt', 'w').write('p' * 10)"),
    ("nothing", "python", "1 + 1"),
]


async def walk(tools: CodeExecutionTools, sid: str) -> tuple[dict[str, Any], bool]:
    result = await tools.code_execute(language="python", sandbox_id=sid, code=WALK)
    assert result["success"] and result["changed_files"] == [], result
    files, cut = json.loads(result["stdout"])
    return {path: tuple(key) for path, key in files.items()}, cut


@pytest.fixture(scope="module")
async def sandbox(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A sandbox past its first call (the supervisor is hardened: the watch is in use)."""
    created = await tools.code_execute(language="python", code="1")
    assert created["success"], created
    yield created["sandbox_id"]
    await tools.code_destroy_sandbox(created["sandbox_id"])


async def test_the_watch_lists_what_two_walks_list(tools: CodeExecutionTools, sandbox: str) -> None:
    """Every call of the sequence lists exactly the files the walks before and after it see
    as created or modified, with their sizes."""
    assert 2 * FLOOD_WRITES > SUPERVISOR.MAX_EVENTS  # the flood does overflow the watch
    before = await walk(tools, sandbox)
    for label, language, code in STEPS:
        result = await tools.code_execute(language=language, sandbox_id=sandbox, code=code)
        assert result["success"], (label, result)
        after = await walk(tools, sandbox)
        expected = SUPERVISOR.changed_files(before, after[0], 0)
        got = [[f["path"], f["size_bytes"], f["change"]] for f in result["changed_files"]]
        assert (label, got, result["changed_files_truncated"]) == (label, expected, False)
        before = after

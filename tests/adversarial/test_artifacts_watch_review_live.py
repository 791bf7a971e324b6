"""Attacks on ``changed_files`` from the supervisor's inotify watch, against real gVisor: what a
call lists must be what full walks of ``/workspace`` before and after it see (the walk run as
user code), and floods of events must neither stop the supervisor nor keep a call past its
timeout."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.tools.code_execution import CodeExecutionTools
from tests.integration.test_artifacts_watch import SUPERVISOR, walk

pytestmark = pytest.mark.integration

#: (id, language, code, timeout_s): each a call whose changed_files must be the walks' answer.
STEPS: list[tuple[str, str, str, float | None]] = [
    ("tree", "shell", "mkdir -p z/s/t && echo f > z/s/t/f", None),
    ("renamed-to-an-earlier-name", "shell", "mv z 0", None),
    ("created-in-the-renamed", "shell", "echo n > 0/n && echo m > 0/s/m && echo k > 0/s/t/k", None),
    ("moved-up-a-level", "shell", "mv 0/s 00 && echo u > 00/u", None),
    ("written-after", "shell", "echo more >> 00/t/k && echo o > 0/o", None),
    (
        "writes-without-write",
        "python",
        "import os, mmap\n"
        "os.chdir('/workspace')\n"
        "open('src', 'wb').write(b's' * 5000)\n"
        "for name in ('sf', 'cfr', 'sp', 'tr', 'mm'):\n"
        "    open(name, 'wb').write(b'0' * 100)\n",
        None,
    ),
    (
        "sendfile-copy_file_range-splice-truncate",
        "python",
        "import os\n"
        "os.chdir('/workspace')\n"
        "src = os.open('src', os.O_RDONLY)\n"
        "out = os.open('sf', os.O_WRONLY); os.sendfile(out, src, 0, 300); os.close(out)\n"
        "out = os.open('cfr', os.O_WRONLY)\n"
        "try:\n"
        "    os.copy_file_range(src, out, 200, 0, 0)\n"
        "except OSError:\n"
        "    os.write(out, b'c' * 200)\n"
        "os.close(out)\n"
        "r, w = os.pipe(); os.write(w, b'p' * 150)\n"
        "out = os.open('sp', os.O_WRONLY); os.splice(r, out, 150); os.close(out)\n"
        "os.truncate('tr', 7)\n",
        None,
    ),
    (
        "mmap-write",
        "python",
        "import mmap\n"
        "with open('/workspace/mm', 'r+b') as f:\n"
        "    m = mmap.mmap(f.fileno(), 100); m[0:4] = b'MMAP'; m.flush(); m.close()\n",
        None,
    ),
    # Two files with 2,000 hard links each, written in turns until the timeout: every event
    # names every link (the drain once spent seconds of a 50 ms poll noting them).
    (
        "many-links",
        "python",
        "import os\n"
        "os.makedirs('/workspace/L')\n"
        "os.chdir('/workspace/L')\n"
        "for name in ('x', 'y'):\n"
        "    open(name, 'w').close()\n"
        "    for i in range(2000):\n"
        "        os.link(name, name + str(i))\n",
        None,
    ),
    (
        "links-flood-until-timeout",
        "python",
        "fx = open('/workspace/L/x', 'ab', buffering=0)\n"
        "fy = open('/workspace/L/y', 'ab', buffering=0)\n"
        "while True:\n"
        "    fx.write(b'1'); fy.write(b'1')\n",
        1.0,
    ),
    ("links-gone", "shell", "rm -rf L", None),
    (
        "churn-until-timeout",
        "shell",
        "while :; do mkdir c1 c2; echo a > c1/a; mv c1 c2/; rm -rf c2; done",
        1.0,
    ),
    ("after-the-floods", "shell", "echo again >> 00/u && mkdir -p 0/s2 && echo q > 0/s2/q", None),
]


@pytest.fixture(scope="module")
async def sandbox(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A sandbox past its first call (the supervisor is hardened: the watch is in use)."""
    created = await tools.code_execute(language="python", code="1")
    assert created["success"], created
    yield created["sandbox_id"]
    await tools.code_destroy_sandbox(created["sandbox_id"])


async def test_hostile_sequences_list_what_two_walks_list(
    tools: CodeExecutionTools, sandbox: str
) -> None:
    """Renames that reorder names, writes by sendfile, copy_file_range, splice, truncate and
    mmap, floods through thousands of hard links and churned directories: every call lists
    exactly what the walks see, and a flooding call still ends by its timeout."""
    before = await walk(tools, sandbox)
    durations: dict[str, Any] = {}
    for label, language, code, timeout_s in STEPS:
        result = await tools.code_execute(
            language=language, sandbox_id=sandbox, code=code, timeout=timeout_s
        )
        if timeout_s is None:
            assert result["success"], (label, result)
        else:
            assert (label, result["status"]) == (label, "timeout"), {
                k: v for k, v in result.items() if k != "changed_files"
            }
            durations[label] = result.get("execution_time")
        after = await walk(tools, sandbox)
        expected = SUPERVISOR.changed_files(before, after[0], 0)
        got = [[f["path"], f["size_bytes"], f["change"]] for f in result["changed_files"]]
        cap = SUPERVISOR.MAX_CHANGED_FILES
        assert (label, got, result["changed_files_truncated"]) == (
            label,
            expected[:cap],
            len(expected) > cap,
        )
        before = after
    print("durations of the flooding calls (timeout 1 s):", durations)

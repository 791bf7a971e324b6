"""Review of changed files, images and the ``llm`` output mode on real gVisor: hostile text
in what a call leaves behind, forged image replies, deep trees, and the saved output file's
path prepared by the code (FIFOs, links, a file where a directory should be).

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration


def encodable(result: dict[str, Any]) -> str:
    """The result as the HTTP service and MCP send it: UTF-8 JSON (raises if it cannot be)."""
    text = json.dumps(result, ensure_ascii=False)
    text.encode("utf-8")
    return text


#: A pyplot of the code's own making: its figure's savefig fails with a lone surrogate in the
#: message, and the final expression's repr is one.
HOSTILE_PYPLOT = r"""
import sys, types
m = types.ModuleType("matplotlib.pyplot")
class Figure:
    def savefig(self, buf, format=None):
        raise ValueError("bad \ud800")
m.get_fignums = lambda: [1]
m.figure = lambda n: Figure()
m.close = lambda f: None
sys.modules["matplotlib.pyplot"] = m
class Value:
    def __repr__(self):
        return "r\udcff"
Value()
"""

#: A reply the code writes on the worker's channel itself, naming one image with a lone
#: surrogate in its source and bytes that are not a PNG.
FORGED_IMAGE = r"""
import os, struct, json, sys
f = sys._getframe()
while f is not None and 'request' not in f.f_locals:
    f = f.f_back
cell = f.f_locals['request']['cell']
data = json.dumps({'cell': cell, 'exit_code': 0, 'result': None, 'cpu_s': 0, 'maxrss_kb': 0,
                   'artifacts': [['fig \ud800', 8]], 'artifact_notes': ['note \udcff']}).encode()
blob = b'NOTAPNG!'
os.write(4, struct.pack('>II', len(data), len(blob)) + data + blob)
"""


async def test_hostile_text_from_a_python_call_leaves_the_result_encodable(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Lone surrogates in a render failure's message and in a repr come back escaped: the
    result stays valid UTF-8, so the HTTP service and MCP can send it."""
    result = await tools.code_execute(language="python", code=HOSTILE_PYPLOT,
                                      sandbox_id=fresh_sandbox)  # fmt: skip
    assert result["success"], result
    text = encodable(result)
    assert "\\ud800" in text and "\\udcff" in text
    assert result["artifacts"] == []


async def test_a_forged_image_reply_is_checked_and_encodable(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Images and notes in a reply forged by user code are held to the protocol: bytes that
    are not a PNG are dropped with a warning, and hostile text is escaped."""
    result = await tools.code_execute(language="python", code=FORGED_IMAGE,
                                      sandbox_id=fresh_sandbox)  # fmt: skip
    assert result["status"] != "lost", result
    assert result["artifacts"] == []
    text = encodable(result)
    assert "not a PNG" in text and "\\ud800" in text


async def test_a_tree_deeper_than_a_path_says_changed_files_is_incomplete(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A file under directories nested past PATH_MAX is not silently missing: the list says it
    is incomplete, and the supervisor survives the walk."""
    code = (
        "import os\nos.chdir('/workspace')\nfor _ in range(25):\n"
        "    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\n"
        "open('deep.txt', 'w').write('x')\nprint('ok')"
    )
    result = await tools.code_execute(language="python", code=code, sandbox_id=fresh_sandbox)
    assert result["success"] and result["stdout"] == "ok\n", result
    assert result["changed_files_truncated"] is True, result["changed_files"]
    assert any("changed_files is incomplete" in w for w in result["warnings"])
    after = await tools.code_execute(language="shell", code="echo alive", sandbox_id=fresh_sandbox)
    assert after["stdout"] == "alive\n"


TRAPS = {
    "fifo": "mkdir -p .harombe/output; for n in $(seq 1 20); do "
    "mkfifo .harombe/output/call-$n.stdout; done",
    "symlink-to-passwd": "mkdir -p .harombe/output; for n in $(seq 1 20); do "
    "ln -s /etc/passwd .harombe/output/call-$n.stdout; done",
    "hard-link": "echo keep > mine.txt; mkdir -p .harombe/output; for n in $(seq 1 20); do "
    "ln mine.txt .harombe/output/call-$n.stdout; done",
    "output-dir-symlink": "mkdir -p .harombe /tmp/elsewhere; ln -s /tmp/elsewhere .harombe/output",
    "harombe-is-a-file": "echo x > .harombe",
}
CHECK = (
    "md5sum /etc/passwd | cut -c1-32; cat mine.txt 2>/dev/null; ls -A /tmp/elsewhere 2>/dev/null;"
    " find .harombe -type f -name 'call-*' ! -user sandbox | wc -l"
)


@pytest.mark.parametrize("trap", list(TRAPS), ids=list(TRAPS))
async def test_the_saved_output_never_goes_through_what_the_code_prepared(
    tools: CodeExecutionTools, fresh_sandbox: str, trap: str
) -> None:
    """FIFOs, symlinks and hard links at the saved file's path, or a link or a file where its
    directory should be: the call neither blocks nor fails, nothing outside the workspace or
    behind a link is written, and the copy is a new file of the sandbox user's or not made."""
    before = await tools.code_execute(language="shell", code=CHECK, sandbox_id=fresh_sandbox)
    setup = await tools.code_execute(language="shell", code=TRAPS[trap], sandbox_id=fresh_sandbox)
    assert setup["success"], setup
    result = await tools.code_execute(
        language="shell", code="seq 1 5000", sandbox_id=fresh_sandbox, output_mode="llm"
    )
    assert result["success"] and result["stdout_truncated"], result
    after = await tools.code_execute(language="shell", code=CHECK, sandbox_id=fresh_sandbox)
    keep = "keep\n" if trap == "hard-link" else ""
    assert after["stdout"] == before["stdout"].replace("\n", "\n" + keep, 1), after
    path = result["output_files"].get("stdout")
    if path is None:
        assert "could not be saved" in result["stdout"], result["stdout"][-600:]
    else:
        saved = await tools.code_read_file(fresh_sandbox, path)
        assert saved["content"] == "".join(f"{i}\n" for i in range(1, 5001))

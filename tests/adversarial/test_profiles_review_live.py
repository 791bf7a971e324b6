"""Review probes of policy profiles on real gVisor, through ``code_execute(..., profile=...)``:
escapes that pass a shipped profile's scan and leave its runtime layer, a session left
unguarded for its next call, and a workspace module that shadows an allowed one. Few and
bounded: four sandboxes, each destroyed at the end of its test.

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.profile_files import read_profile_documents
from harombe.security.policy.profiles import resolve_profiles
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from tests.adversarial.test_profiles_review import MATCH_SPAWN

pytestmark = pytest.mark.integration

#: minimal with its static scan switched off: only the runtime layer decides.
EXTRA = {"scan-off": {"extends": "minimal", "scan_stages": {"pre": []}}}

#: Turns the audit hook off without starting anything (the next call then tries).
HOOK_OFF = MATCH_SPAWN.replace('os.popen("echo $((6*7))").read().strip()', '"off"')
NEXT_CALL = (
    "import collections\nos = collections._sys.modules['os']\nos.system('true')\n"
    "print('NEXT', sorted(os.listdir('/'))[:3])"
)
#: A protocol-0 pickle written as text by numpy.savetxt (library code, so the layer lets it
#: open the file), loaded with allow_pickle passed through **kwargs: the unpickler compiles
#: and runs code under a library file name.
PICKLE_ESCAPE = r"""
import numpy as np
src = "import os;print('PICKLED', sorted(os.listdir('/'))[:3])"
blob = ("cbuiltins\nexec\n(cbuiltins\ncompile\n(V" + src + "\nV/usr/lib/x.py\nVexec\ntRtR.")
np.savetxt("/tmp/p.txt", np.zeros((0,)), header=blob, comments="")
np.load("/tmp/p.txt", **{"allow_pickle": True})
"""
#: What a workspace module shadowing ``statistics`` runs: as library code, outside the layer.
SHADOW = "import os\nprint('SHADOW', sorted(os.listdir('/'))[:3])\n"


@pytest.fixture(scope="module")
async def tools(sandbox_manager: SandboxManager) -> CodeExecutionTools:
    return CodeExecutionTools(
        sandbox_manager,
        profiles=resolve_profiles({**read_profile_documents(None), **EXTRA}),
        hitl_gate=None,
    )


@pytest.fixture
async def cleanup(tools: CodeExecutionTools) -> AsyncIterator[list[str]]:
    """Sandbox ids to destroy after the test."""
    made: list[str] = []
    yield made
    for sandbox_id in made:
        await tools.code_destroy_sandbox(sandbox_id)


async def _run(tools: CodeExecutionTools, made: list[str], **call: Any) -> dict[str, Any]:
    result = await tools.code_execute(language="python", **call)
    if result.get("sandbox_id") and result["sandbox_id"] not in made:
        made.append(str(result["sandbox_id"]))
    return result


@pytest.mark.parametrize(
    ("profile", "code", "marker"),
    [
        pytest.param("minimal", MATCH_SPAWN, "SPAWNED 42", id="minimal-match-args-spawn"),
        pytest.param("data-science", PICKLE_ESCAPE, "PICKLED", id="data-science-pickle"),
    ],
)
async def test_code_that_passes_the_scan_stays_inside_the_layer(
    tools: CodeExecutionTools, cleanup: list[str], profile: str, code: str, marker: str
) -> None:
    """Code the shipped profile's scan lets through cannot start a process or list '/'."""
    result = await _run(tools, cleanup, code=code, profile=profile)
    assert marker not in result.get("stdout", ""), result


async def test_a_call_cannot_leave_the_next_call_unguarded(
    tools: CodeExecutionTools, cleanup: list[str]
) -> None:
    """After a call that switches the layer's audit hook off, the next call on the same
    sandbox is still refused os.system and os.listdir."""
    first = await _run(tools, cleanup, code=HOOK_OFF, profile="scan-off")
    assert first.get("sandbox_id"), first  # it ran (whether or not the hook went off)
    second = await _run(tools, cleanup, code=NEXT_CALL, sandbox_id=first["sandbox_id"])
    assert "NEXT" not in second.get("stdout", ""), second


async def test_a_workspace_module_does_not_run_outside_the_layer(
    tools: CodeExecutionTools, cleanup: list[str]
) -> None:
    """A file written to the workspace under an allowed module's name is not imported as
    library code by ``import statistics`` (which passes the scan)."""
    first = await _run(tools, cleanup, code="x = 1", profile="minimal")
    sandbox_id = str(first["sandbox_id"])
    written = await tools.code_write_file(sandbox_id, "statistics.py", SHADOW)
    assert written["success"], written
    result = await _run(tools, cleanup, code="import statistics", sandbox_id=sandbox_id)
    assert "SHADOW" not in result.get("stdout", ""), result

"""Second review round of the profiles' runtime layer on real gVisor: a workspace file that a
restarted session imports before its audit hook, and what ``RLIMIT_NPROC`` = 0 leaves of
ordinary numpy, pandas and scipy work. Few and bounded: three sandboxes, each destroyed at the
end of its test.

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.profile_files import read_profile_documents
from harombe.security.policy.profiles import resolve_profiles
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

#: numpy allowed but not preimported: it is imported after RLIMIT_NPROC is 0.
EXTRA = {"numpy-late": {"extends": "minimal", "imports": {"additional": ["numpy"]}}}

#: Written to the workspace as ``numpy.py``: when the session restarts, the preimport of
#: ``numpy`` runs it (the working directory is still first on sys.path), before the hook and
#: RLIMIT_NPROC; it leaves its proof in the workspace and hands over the real numpy.
SHADOW_NUMPY = """
import os, subprocess, sys
try:
    who = subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip()
except Exception as exc:
    who = repr(exc)
with open("/workspace/proof.txt", "w") as out:
    out.write("PREHOOK uid=%s root=%s" % (who, sorted(os.listdir("/"))[:3]))
sys.path.remove("")
del sys.modules["numpy"]
import numpy
"""
OUTLIVE_INTERRUPT = (
    "while True:\n    try:\n        while True:\n            pass\n"
    "    except BaseException:\n        pass"
)
ORDINARY_SCIENCE = """
import numpy as np, pandas as pd, scipy.linalg, scipy.optimize, scipy.stats
a = np.random.default_rng(0).normal(size=(300, 300))
u, s, vt = np.linalg.svd(a)
inv = scipy.linalg.inv(a @ a.T + np.eye(300))
fit = scipy.optimize.minimize(lambda x: ((x - 3) ** 2).sum(), np.zeros(4))
df = pd.DataFrame({"k": np.arange(10_000) % 7, "v": np.arange(10_000.0)})
g = df.groupby("k")["v"].agg(["mean", "sum"]).rolling(2).mean()
t = scipy.stats.ttest_ind(a[:, 0], a[:, 1])
print("SCIENCE", round(float(s[0]), 3) > 0, inv.shape, round(float(fit.x[0]), 2), g.shape,
      0 <= t.pvalue <= 1)
"""


@pytest.fixture(scope="module")
async def tools(sandbox_manager: SandboxManager) -> CodeExecutionTools:
    return CodeExecutionTools(
        sandbox_manager,
        profiles=resolve_profiles({**read_profile_documents(None), **EXTRA}),
        hitl_gate=None,
    )


@pytest.fixture
async def cleanup(tools: CodeExecutionTools) -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    for sandbox_id in made:
        await tools.code_destroy_sandbox(sandbox_id)


async def _run(tools: CodeExecutionTools, made: list[str], **call: Any) -> dict[str, Any]:
    result = await tools.code_execute(language="python", **call)
    if result.get("sandbox_id") and result["sandbox_id"] not in made:
        made.append(str(result["sandbox_id"]))
    return result


async def test_a_restarted_session_never_imports_the_workspace_before_its_hook(
    tools: CodeExecutionTools, cleanup: list[str]
) -> None:
    """Under data-science (scan enforced), a workspace ``numpy.py`` is not what a restarted
    session's preimport runs: nothing in the workspace runs before the audit hook (no process,
    no listing of /)."""
    first = await _run(tools, cleanup, code="x = 1", profile="data-science")
    sandbox_id = str(first["sandbox_id"])
    written = await tools.code_write_file(sandbox_id, "numpy.py", SHADOW_NUMPY)
    assert written["success"], written
    # Code that passes the scan and ignores the timeout's interrupt: the interpreter is killed.
    killed = await _run(tools, cleanup, code=OUTLIVE_INTERRUPT, sandbox_id=sandbox_id, timeout=2)
    assert killed.get("state_lost"), killed
    after = await _run(tools, cleanup, code="import numpy\nprint(numpy.__name__)",
                       sandbox_id=sandbox_id)  # fmt: skip
    proof = await tools.code_read_file(sandbox_id, "proof.txt")
    assert not proof.get("success"), (proof.get("content"), after)


@pytest.mark.parametrize(
    ("profile", "code", "marker"),
    [
        pytest.param("numpy-late", "import numpy as np\na = np.ones((300, 300))\n"
                     "print('DOT', float((a @ a).sum()))", "DOT 27000000.0",
                     id="numpy-imported-after-nproc-0"),
        pytest.param("data-science", ORDINARY_SCIENCE,
                     "SCIENCE True (300, 300) 3.0 (7, 2) True", id="data-science-ordinary"),
    ],
)  # fmt: skip
async def test_ordinary_library_work_runs_without_new_threads(
    tools: CodeExecutionTools, cleanup: list[str], profile: str, code: str, marker: str
) -> None:
    """RLIMIT_NPROC = 0 leaves ordinary numpy, pandas and scipy work running: linear algebra,
    optimisation, group-bys, statistics, also when numpy is first imported by user code."""
    result = await _run(tools, cleanup, code=code, profile=profile, timeout=120)
    assert marker in result.get("stdout", ""), result

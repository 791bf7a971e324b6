"""Policy profiles on real gVisor: the scan before the gate, the runtime layer inside the
sandbox (held even with the scan in observe mode), preimports in the warm pool, and the
refusals that keep a profiled sandbox's calls inside its layer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from harombe.config import parse_config
from harombe.profile_files import read_profile_documents
from harombe.security.docker_manager import DockerManager
from harombe.security.policy.profiles import Profile, resolve_profiles
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools

OBSERVE = {"audit": {"mode": {"ast_scan": "observe", "blocklist_audit": "observe"}}}
#: The shipped profiles, and test profiles whose scans only observe, so the code reaches the
#: runtime layer; "ds-probe" may also look at sys.modules.
EXTRA = {
    "minimal-observe": {"extends": "minimal", **OBSERVE},
    "ds-probe": {"extends": "data-science", "imports": {"additional": ["sys", "time"]},
                 **OBSERVE},
    "broken": {"extends": "minimal", "imports": {"additional": ["no_such_module_anywhere"]},
               "preimport": ["no_such_module_anywhere"]},
}  # fmt: skip


def profiles() -> dict[str, Profile]:
    return resolve_profiles({**read_profile_documents(None), **EXTRA})


@pytest.fixture(scope="module")
async def manager(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    config = parse_config({"security": {"sandbox": {"pool": {"size": 1, "prewarm": []}}}})
    manager = SandboxManager(docker_manager=docker_manager, runtime="runsc", config=config)
    await manager.start()
    yield manager
    await manager.stop()


@pytest.fixture(scope="module")
async def tools(manager: SandboxManager) -> CodeExecutionTools:
    return CodeExecutionTools(manager, profiles=profiles(), hitl_gate=None)


@pytest.fixture(scope="module")
async def observed(tools: CodeExecutionTools) -> str:
    """A sandbox under "minimal-observe": the scan reports, the runtime layer decides."""
    result = await tools.code_execute(language="python", code="x = 1", profile="minimal-observe")
    assert result["success"], result
    return str(result["sandbox_id"])


BLOCKED = "blocked by sandbox"
ORIGINAL_IMPORT = (
    "real = [c.cell_contents for c in __import__.__closure__ if callable(c.cell_contents)][0]\n"
)
# fmt: off
LAYER_CASES = [
    pytest.param("import os", "ImportError: import of 'os' blocked by sandbox", id="import-os"),
    pytest.param("import builtins", "ImportError: import of 'builtins' blocked", id="builtins"),
    pytest.param("__import__('subprocess')", "import of 'subprocess' blocked", id="dunder-import"),
    pytest.param("open('/etc/passwd')", "NameError: name 'open' is not defined", id="open"),
    pytest.param("input()", "NameError: name 'input' is not defined", id="input"),
    pytest.param("__builtins__['open']", "KeyError: 'open'", id="builtins-dict"),
    pytest.param("print.__self__.open('/etc/passwd')", "RuntimeError: open " + BLOCKED,
                 id="restored-open"),
    pytest.param("import operator\noperator.attrgetter('__class__')",
                 "RuntimeError: dunder attribute access blocked by sandbox", id="attrgetter"),
    pytest.param("from operator import methodcaller as m\nm('__reduce_ex__', 2)",
                 "RuntimeError: dunder attribute access blocked by sandbox", id="methodcaller"),
    pytest.param("getattr(1, '__class__')",
                 "RuntimeError: dunder attribute access blocked by sandbox", id="getattr"),
    pytest.param("import random\nrandom._os", "has no attribute '_os'", id="random-os"),
    pytest.param("import collections\ncollections._sys.modules['os'].system('id')",
                 "AttributeError: module 'sys' has no attribute 'modules'",
                 id="collections-sys"),
    pytest.param(ORIGINAL_IMPORT + "real('os').system('id')", "RuntimeError: os.system " + BLOCKED,
                 id="closure-import"),
    pytest.param(ORIGINAL_IMPORT + "real('os').listdir('/')", "RuntimeError: os.listdir " + BLOCKED,
                 id="closure-listdir"),
    pytest.param("exec('import os')", "RuntimeError: compile " + BLOCKED, id="exec"),
    pytest.param("(lambda: 0).__code__", "RuntimeError: object.__getattr__ " + BLOCKED,
                 id="code-object"),
    pytest.param("x = bytearray(1024 * 1024 * 1024)", "MemoryError", id="rlimit-as-1gb"),
]
# fmt: on


@pytest.mark.parametrize(("code", "expected"), LAYER_CASES)
async def test_the_runtime_layer_holds_in_observe_mode(
    tools: CodeExecutionTools, observed: str, code: str, expected: str
) -> None:
    """With the scan only observing, the code runs and the layer inside the sandbox refuses."""
    result = await tools.code_execute(language="python", code=code, sandbox_id=observed)
    assert result["status"] == "error" and expected in result["stderr"], result
    assert result["state_lost"] is False


async def test_allowed_code_runs_and_observed_findings_are_warnings(
    tools: CodeExecutionTools, observed: str
) -> None:
    """Ordinary code runs under the layer; an observed finding comes back as a warning, with
    one audit event for the decision."""
    ok = await tools.code_execute(
        language="python", sandbox_id=observed,
        code="import math, statistics\nfrom operator import attrgetter\n"
        "attrgetter('real')(3) + round(statistics.mean([1, 2, 3]) * math.pi)",
    )  # fmt: skip
    assert ok["success"] and ok["result"] == "9" and ok["warnings"] == [], ok
    with capture_events() as events:
        seen = await tools.code_execute(language="python", code="import os", sandbox_id=observed)
    decided = [e for e in events if e["event"] == "guardrail.decided"]
    assert [(e["outcome"], e["profile"]) for e in decided] == [("observed", "minimal-observe")]
    assert any("observe mode" in w and "Line 1" in w for w in seen["warnings"]), seen


async def test_refused_code_is_data_and_creates_nothing(
    tools: CodeExecutionTools, manager: SandboxManager
) -> None:
    """Under enforce, violations come back as data; no sandbox is made; one audit event."""
    before = set(manager.sandboxes)
    with capture_events() as events:
        result = await tools.code_execute(
            language="python", code="import os\nos.system('id')", profile="minimal"
        )
    assert result["success"] is False and result["error"].startswith("GuardrailError: ")
    assert result["violations"] and result["violations"][0].startswith("Line 1: ")
    assert set(manager.sandboxes) == before
    decided = [e for e in events if e["event"] == "guardrail.decided"]
    assert len(decided) == 1 and decided[0]["outcome"] == "rejected"
    assert decided[0]["violation_count"] == len(result["violations"])


async def test_a_profiled_sandbox_keeps_its_profile_and_limits(
    tools: CodeExecutionTools, manager: SandboxManager
) -> None:
    """Its memory limit is the profile's; its timeout is capped; other languages, fresh runs
    and another profile are refused on it."""
    made = await tools.code_execute(language="python", code="1 + 1", profile="minimal",
                                    timeout=90)  # fmt: skip
    assert made["success"] and made["result"] == "2", made
    assert any("timeout_max of profile 'minimal'" in w for w in made["warnings"])
    sid = made["sandbox_id"]
    box = manager.get(sid)
    assert box.profile is not None and box.profile.name == "minimal"
    assert box.limits is not None and box.limits.max_memory_mb == 256
    refusals = [
        dict(language="shell", code="id"),
        dict(language="python", code="1", fresh=True),
        dict(language="python", code="1", profile="data-science"),
    ]
    for call in refusals:
        result = await tools.code_execute(sandbox_id=sid, **call)  # type: ignore[arg-type]
        assert result["success"] is False and "profile" in result["error"], (call, result)
    again = await tools.code_execute(language="python", code="import os", sandbox_id=sid)
    assert again["violations"], again  # its own profile applies with profile left out
    await tools.code_destroy_sandbox(sid)


async def test_a_failing_preimport_names_the_module(tools: CodeExecutionTools) -> None:
    """A profile whose preimport cannot be imported: no sandbox, an error naming it."""
    result = await tools.code_execute(language="python", code="1", profile="broken")
    assert result["success"] is False, result
    assert result["error"].startswith("SandboxStartError: ")
    assert "preimport of 'no_such_module_anywhere' failed" in result["error"]


async def test_data_science_is_preimported_in_the_warm_pool(
    tools: CodeExecutionTools, manager: SandboxManager
) -> None:
    """A pooled data-science sandbox has pandas loaded before the first call; pandas works."""
    profile = tools.profiles.get("ds-probe")
    manager.prewarm("python", profile=profile)
    await manager.wait_pool_settled()
    ready = manager.pool.ready(manager.pool_key("python", profile))
    assert len(ready) == 1
    code = (
        "import sys, time\nloaded = all(m in sys.modules for m in ('numpy', 'pandas', 'scipy'))\n"
        "t0 = time.perf_counter()\nimport pandas as pd\n"
        "took_ms = (time.perf_counter() - t0) * 1000\n"
        "print(loaded, pd.DataFrame({'a': [1, 2, 3]})['a'].sum())\ntook_ms"
    )
    started = time.perf_counter()
    result = await tools.code_execute(language="python", code=code, profile="ds-probe")
    elapsed_s = time.perf_counter() - started
    assert result["success"], result
    assert result["sandbox_id"] == ready[0] and result["stdout"] == "True 6\n"
    assert result["state_lost"] is False  # BLAS left no threads: the session lives on
    print(
        f"pooled ds call {elapsed_s * 1000:.0f} ms; import pandas {float(result['result']):.2f} ms"
    )
    blocked = await tools.code_execute(
        language="python", sandbox_id=result["sandbox_id"],
        code="import pandas\npandas.read_pickle('x')",
    )  # fmt: skip
    assert "pandas.read_pickle is blocked by sandbox" in blocked["stderr"], blocked
    kept = await tools.code_execute(language="python", code="took_ms > 0",
                                    sandbox_id=result["sandbox_id"])  # fmt: skip
    assert kept["result"] == "True" and kept["state_lost"] is False, kept
    await tools.code_destroy_sandbox(result["sandbox_id"])


async def test_scipy_and_numpy_work_under_the_layer(tools: CodeExecutionTools) -> None:
    """The layer's refusals do not break the libraries a profile allows."""
    code = (
        "import numpy as np\nfrom scipy import optimize, stats\n"
        "r = optimize.minimize_scalar(lambda x: (x - 2) ** 2)\n"
        "round(float(r.x), 3), round(float(stats.norm.cdf(0)), 2), int(np.arange(5).sum())"
    )
    result = await tools.code_execute(language="python", code=code, profile="data-science")
    assert result["success"] and result["result"] == "(2.0, 0.5, 10)", result
    await tools.code_destroy_sandbox(result["sandbox_id"])

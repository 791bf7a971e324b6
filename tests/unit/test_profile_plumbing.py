"""Profiles through the manager and the tools, on FakeDocker: the layer's spec reaches the
sandbox, the profile's limits apply, its calls stay inside the layer, the warm pool keeps
sandboxes per profile, and the scan decides before the gate with one audit event."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from harombe.errors import SandboxStartError, UsageError
from harombe.profile_files import read_profile_documents
from harombe.security.approval.gate import HITLGate
from harombe.security.guest import PROFILE_ENV
from harombe.security.policy.profiles import Profile, resolve_profiles
from harombe.security.runtime.sandbox import Sandbox
from harombe.testing import FakeDocker, RunOutcome, ScriptedApprover, capture_events, code_of
from harombe.testing import echo_handler as echo
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.params import CodeExecuteArgs
from harombe.tools.profiles import ProfileTable
from tests.unit.fake_manager import config, container_of, running

OBSERVE = {"audit": {"mode": {"ast_scan": "observe", "blocklist_audit": "observe"}}}
PROFILES = resolve_profiles(
    {**read_profile_documents(None), "watch": {"extends": "minimal", **OBSERVE}}
)
MINIMAL, DATA_SCIENCE = PROFILES["minimal"], PROFILES["data-science"]


def layer_spec(docker: FakeDocker, box: Sandbox) -> dict[str, Any]:
    """The runtime spec the sandbox's prewarmed interpreter was started with."""
    cid = container_of(docker, box.sandbox_id)
    assert cid is not None
    env = json.loads(docker.containers[cid].spec["environment"]["HAROMBE_USER_ENV"])
    return json.loads(env[PROFILE_ENV])  # type: ignore[no-any-return]


async def test_a_profiled_sandbox_carries_its_layer_and_limits() -> None:
    """The spec is in the interpreter's environment and every run's; the profile's memory
    (256 MiB) is the sandbox's; the layer check ran no code and counts as no run."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python", profile=MINIMAL)
        assert layer_spec(docker, box) == {**MINIMAL.runtime_spec(), "enforce": True}
        assert box.profile is MINIMAL and box.limits is not None
        assert box.limits.max_memory_mb == 256 and box.runs == 0
        guest = docker.guest(box.container_id)
        check = guest.requests[-1]
        assert check["op"] == "run" and check["session"] and check["max_memory_mb"] == 256
        assert PROFILE_ENV in check["env"]
        result = await manager.execute(box.sandbox_id, "print(1)")
        assert result.success and guest.requests[-1]["max_memory_mb"] == 256
        plain = await manager.create_sandbox("python")
        assert plain.profile is None and plain.limits is None and PROFILE_ENV not in plain.env


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param({"language": "shell"}, "allows Python only, not shell", id="shell"),
        pytest.param({"language": "javascript"}, "Python only", id="javascript"),
        pytest.param({"fresh": True}, "fresh=True would run outside it", id="fresh"),
    ],
)
async def test_calls_outside_the_layer_are_refused(call: dict[str, Any], message: str) -> None:
    """Another language or a fresh process on a profiled sandbox would bypass the layer."""
    async with running() as (_, manager):
        box = await manager.create_sandbox("python", profile=MINIMAL)
        with pytest.raises(UsageError, match=message):
            await manager.execute(box.sandbox_id, "1", **call)


async def test_the_profile_caps_the_timeout_with_a_warning() -> None:
    """timeout_max (30 s) caps a longer timeout; the warning names the profile."""
    async with running() as (_, manager):
        assert manager.effective_timeout(90, MINIMAL) == (
            30.0, ["timeout 90s capped to 30s, the timeout_max of profile 'minimal'"],
        )  # fmt: skip
        box = await manager.create_sandbox("python", profile=MINIMAL)
        result = await manager.execute(box.sandbox_id, "1", timeout_s=45)
        assert result.timeout_s == 30.0 and "timeout_max of profile" in result.warnings[0]


async def test_a_profile_needs_python() -> None:
    """A profiled sandbox for shell is refused before anything is made."""
    async with running() as (docker, manager):
        with pytest.raises(UsageError, match="applies to Python only"):
            await manager.create_sandbox("shell", profile=MINIMAL)
        assert not docker.containers


async def test_a_layer_that_fails_discards_the_sandbox_and_names_why() -> None:
    """The interpreter reports the failed preimport: no sandbox, an error naming it."""

    def handler(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        if PROFILE_ENV in msg.get("env", {}) and not code_of(msg, stdin):
            return RunOutcome(stderr="ProfileLayerError: preimport of 'pandas' failed\n",
                              exit_code=1)  # fmt: skip
        return echo(msg, stdin)

    async with running(FakeDocker(handler=handler)) as (docker, manager):
        with pytest.raises(SandboxStartError, match="preimport of 'pandas' failed"):
            await manager.create_sandbox("python", profile=DATA_SCIENCE)
        assert not docker.containers and not manager.sandboxes


async def test_the_warm_pool_is_per_profile() -> None:
    """prewarm(profile) fills that profile's pool with its layer up; only its calls claim it."""
    async with running(pool={"size": 1, "prewarm": []}) as (docker, manager):
        manager.prewarm("python", profile=DATA_SCIENCE)
        await manager.wait_pool_settled()
        key = manager.pool_key("python", DATA_SCIENCE)
        assert key != manager.pool_key("python") and key[-1] == DATA_SCIENCE.fingerprint()
        (ready,) = manager.pool.ready(key)
        plain = await manager.create_sandbox("python")
        assert plain.sandbox_id != ready
        box = await manager.create_sandbox("python", profile=DATA_SCIENCE)
        assert box.sandbox_id == ready and box.profile is DATA_SCIENCE and box.runs == 0
        assert layer_spec(docker, box)["preimport"] == ["numpy", "pandas", "scipy"]


async def test_a_lost_profiled_sandbox_is_replaced_under_its_profile() -> None:
    """The replacement of a lost sandbox has the same profile."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python", profile=MINIMAL)
        docker.kill(box.container_id)
        result = await manager.execute(box.sandbox_id, "1")
        assert result.status == "lost"
        assert manager.get(result.sandbox_id).profile is MINIMAL


def tools_on(manager: Any, approver: ScriptedApprover | None = None) -> CodeExecutionTools:
    gate = HITLGate(approver=approver) if approver is not None else None
    return CodeExecutionTools(manager, gate, profiles=PROFILES)


async def test_refused_code_never_reaches_the_gate_or_a_sandbox() -> None:
    """Violations come back as data; nobody is asked; no sandbox; one rejected event."""
    approver = ScriptedApprover(default=True)
    async with running() as (docker, manager):
        tools = tools_on(manager, approver)
        with capture_events() as events:
            result = await tools.code_execute("python", "import os\nos.system('id')",
                                              profile="minimal")  # fmt: skip
        assert result["success"] is False and result["error"].startswith("GuardrailError: ")
        assert result["violations"][0].startswith("Line 1: ")
        assert approver.requests == [] and not docker.containers
        decided = [e for e in events if e["event"] == "guardrail.decided"]
        assert [(e["outcome"], e["stage"]) for e in decided] == [("rejected", "ast_scan")]
        assert decided[0]["violation_count"] == len(result["violations"])


async def test_passing_and_observed_code_runs_with_one_event_each() -> None:
    """Clean code passes; under observe the finding is a warning and the code runs."""
    async with running() as (_, manager):
        tools = tools_on(manager)
        with capture_events() as events:
            clean = await tools.code_execute("python", "print(1)", profile="minimal")
            seen = await tools.code_execute("python", "import os", profile="watch")
        assert clean["success"] and clean["warnings"] == []
        assert seen["success"] and seen["warnings"][0].startswith("guardrail ast_scan (observe")
        outcomes = [e["outcome"] for e in events if e["event"] == "guardrail.decided"]
        assert outcomes == ["passed", "observed"]
        assert manager.get(seen["sandbox_id"]).profile is PROFILES["watch"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param({"profile": "nope"}, "unknown profile 'nope'; use one of data-science, "
                     "minimal, watch", id="unknown"),
        pytest.param({"profile": "Bad Name"}, "profile must be a profile's name", id="malformed"),
        pytest.param({"profile": "minimal", "language": "shell", "code": "id"},
                     "applies to Python only", id="shell"),
        pytest.param({"profile": "minimal", "fresh": True}, "fresh=True cannot be used",
                     id="fresh"),
    ],
)  # fmt: skip
async def test_bad_profile_calls_are_refused_before_anything(
    call: dict[str, Any], message: str
) -> None:
    """An unknown or malformed name, a non-Python language or fresh=True: refused, no sandbox."""
    async with running() as (docker, manager):
        result = await tools_on(manager).code_execute(**{"language": "python", "code": "1", **call})
        assert result["success"] is False and message in result["error"], result
        assert not docker.containers


async def test_a_sandbox_keeps_its_profile_across_calls() -> None:
    """Later calls may repeat its profile or leave it out, not change or add one."""
    async with running() as (_, manager):
        tools = tools_on(manager)
        made = await tools.code_execute("python", "x = 1", profile="minimal")
        sid = made["sandbox_id"]
        assert (await tools.code_execute("python", "1", sid, profile="minimal"))["success"]
        scanned = await tools.code_execute("python", "import os", sid)
        assert scanned["violations"], scanned  # its own profile, with profile left out
        other = await tools.code_execute("python", "1", sid, profile="data-science")
        assert "created with profile 'minimal'" in other["error"]
        plain = await tools.code_execute("python", "y = 2")
        added = await tools.code_execute("python", "1", plain["sandbox_id"], profile="minimal")
        assert "created with no profile" in added["error"]


def test_the_profile_parameter_is_described_for_the_llm() -> None:
    """code_execute's schema documents profile; the stream shares the signature."""
    field = CodeExecuteArgs.model_json_schema()["properties"]["profile"]
    assert "violations" in field["description"] and "'minimal'" in field["description"]
    stream = inspect.signature(CodeExecutionTools.code_execute_stream).parameters
    assert stream["profile"].kind is inspect.Parameter.KEYWORD_ONLY


def test_profiles_are_loaded_once_and_lazily() -> None:
    """The tools read the configured profiles on first use and keep them."""
    table = ProfileTable(config())
    assert table._set is None
    first = table.profiles
    assert set(first) >= {"minimal", "data-science"} and table.profiles is first
    assert isinstance(table.get("minimal"), Profile)

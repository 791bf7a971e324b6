"""Argument probes against real gVisor: the gate must judge exactly what the manager does.

Every probe sends a value that a careless reader could take two ways (``"false"`` is truthy,
``run.py `` trims to ``run.py``, ``.env/`` is not ``.env`` to a regular expression, NaN compares
false with every cap) and asserts the attack is held: the call is refused with an error naming
the parameter before any human is asked and before any container exists, or the gate is shown
the very value the manager acts on and rates it as it rates the plain spelling.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.config import LANGUAGES, load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import ApprovalResponse, HITLGate, gate_from_config
from harombe.security.runtime.sandbox import LABEL_MANAGER, LABEL_SANDBOX
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import ScriptedApprover
from harombe.tools.code_execution import CodeExecutionTools

REPO = Path(__file__).resolve().parents[2]
Call = Callable[[CodeExecutionTools, str], Awaitable[dict[str, Any]]]


async def containers(manager: SandboxManager) -> set[str]:
    """Sandbox ids of every container this manager owns, once its pool has settled."""
    await manager.wait_pool_settled()
    found = await manager.docker.list_containers({LABEL_MANAGER: manager.manager_id})
    return {c.labels.get(LABEL_SANDBOX, c.id) for c in found}


@pytest.fixture(scope="module")
async def target(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A Python sandbox of this module's own, with no network."""
    created = await tools.code_execute(language="python", code="print('ready')")
    assert created["success"], created
    yield created["sandbox_id"]
    await tools.code_destroy_sandbox(created["sandbox_id"])


def nfd(text: str) -> str:
    return text.replace("é", "e\u0301")


REFUSED: list[tuple[str, Call, str]] = [
    ("network-string-false",
     lambda t, s: t.code_execute("python", "print(1)", network_enabled="false"),
     "InvalidArgumentError: network_enabled must be true or false (got 'false', a string)"),
    ("network-string-False",
     lambda t, s: t.code_execute("python", "print(1)", network_enabled="False"),
     "network_enabled must be true or false"),
    ("network-string-true",
     lambda t, s: t.code_execute("python", "print(1)", network_enabled="true"),
     "network_enabled must be true or false"),
    ("network-int-0", lambda t, s: t.code_execute("python", "1", network_enabled=0),
     "network_enabled must be true or false"),
    ("fresh-none", lambda t, s: t.code_execute("python", "1", sandbox_id=s, fresh=None),
     "fresh must be true or false"),
    ("network-on-offline-sandbox",
     lambda t, s: t.code_execute("python", "1", sandbox_id=s, network_enabled=True),
     "created without network"),
    ("domains-as-string",
     lambda t, s: t.code_execute("python", "1", network_enabled=True,
                                 allowed_domains="example.com"),
     "allowed_domains must be a list"),
    ("domains-without-network",
     lambda t, s: t.code_execute("python", "1", allowed_domains=["example.com"]),
     "network_enabled is false"),
    ("fresh-string", lambda t, s: t.code_execute("python", "1", sandbox_id=s, fresh="false"),
     "fresh must be true or false"),
    ("timeout-nan", lambda t, s: t.code_execute("python", "1", timeout=math.nan),
     "timeout must be a finite number of seconds above 0"),
    ("timeout-inf", lambda t, s: t.code_execute("python", "1", sandbox_id=s, timeout=math.inf),
     "finite number"),
    ("timeout-negative", lambda t, s: t.code_execute("python", "1", timeout=-5), "above 0"),
    ("timeout-string", lambda t, s: t.code_execute("python", "1", timeout="5"),
     "timeout must be a number of seconds (got '5', a string)"),
    ("timeout-bool", lambda t, s: t.code_execute("python", "1", timeout=True),
     "timeout must be a number"),
    ("code-none", lambda t, s: t.code_execute("python", None), "code is required"),
    ("code-lone-surrogate", lambda t, s: t.code_execute("python", "print('\ud800')"),
     "lone surrogate U+D800"),
    ("code-escape-surrogate", lambda t, s: t.code_execute("shell", "echo \udcff", sandbox_id=s),
     "lone surrogate U+DCFF"),
    ("shell-code-nul-hides-a-word", lambda t, s: t.code_execute("shell", "r\x00m -rf ~",
                                                                sandbox_id=s),
     "NUL character"),
    ("shell-code-over-argv-limit",
     lambda t, s: t.code_execute("shell", "#" * 200_000 + "\necho hi", sandbox_id=s),
     "at most 131071 bytes"),
    ("language-10MB", lambda t, s: t.code_execute("p" * 10_000_000, "1"),
     "language must be one of python, javascript, shell"),
    ("language-capitalised", lambda t, s: t.code_execute("Python", "1"), "lower case"),
    ("sandbox-id-int", lambda t, s: t.code_execute("python", "1", sandbox_id=123),
     "sandbox_id must be a string"),
    ("package-10MB", lambda t, s: t.code_install_package(s, "a" * 10_000_000),
     "over the limit of 1024"),
    ("package-option", lambda t, s: t.code_install_package(s, "--index-url=http://127.0.0.1/"),
     "PackageSpecError"),
    ("package-url-dependency", lambda t, s: t.code_install_package(s, "x @ http://127.0.0.1/x"),
     "PackageSpecError"),
    ("registry-unknown", lambda t, s: t.code_install_package(s, "six", "cargo"),
     "unknown registry"),
    ("write-trailing-space", lambda t, s: t.code_write_file(s, "run.py ", "print(1)"),
     "WorkspacePathError"),
    ("write-trailing-slash", lambda t, s: t.code_write_file(s, "run.py/", "print(1)"),
     "names a directory"),
    ("write-trailing-dot", lambda t, s: t.code_write_file(s, "run.py.", "print(1)"),
     "ends with '.'"),
    ("write-backslash", lambda t, s: t.code_write_file(s, "bin\\run.py", "x"), "backslash"),
    ("write-zero-width", lambda t, s: t.code_write_file(s, "run\u200b.py", "x"), "U+200B"),
    ("write-bidi-override", lambda t, s: t.code_write_file(s, "fdp.\u202eyp.txt", "x"), "U+202E"),
    ("write-not-nfc", lambda t, s: t.code_write_file(s, nfd("café.py"), "x"), "NFC"),
    ("write-content-none", lambda t, s: t.code_write_file(s, "a.txt", None), "content is required"),
    ("write-content-surrogate", lambda t, s: t.code_write_file(s, "a.txt", "\ud83d"),
     "lone surrogate"),
    ("write-content-over-cap", lambda t, s: t.code_write_file(s, "a.txt", "x" * (64 * 2**20 + 1)),
     "over the limit of 67108864 bytes"),
    ("read-env-as-directory", lambda t, s: t.code_read_file(s, ".env/"), "names a directory"),
    ("read-1000-levels", lambda t, s: t.code_read_file(s, "a/" * 1000 + "b"), "deep"),
    ("list-escape", lambda t, s: t.code_list_files(s, "data/../.."), "'..'"),
    ("destroy-list-id", lambda t, s: t.code_destroy_sandbox([s]), "sandbox_id must be a string"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "needle"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
async def test_ambiguous_arguments_are_refused_before_anyone_is_asked(
    sandbox_manager: SandboxManager, target: str, call: Call, needle: str
) -> None:
    """Refused with the parameter named; no approver call, no container, the sandbox untouched."""
    approver = ScriptedApprover(default=True)  # would approve anything it were asked
    tools = CodeExecutionTools(sandbox_manager, hitl_gate=HITLGate(approver=approver))
    before = await containers(sandbox_manager)
    result = await call(tools, target)
    assert result["success"] is False and needle in result["error"], result["error"][:300]
    assert len(result["error"]) < 1200, "a huge value was echoed back"
    assert approver.requests == [], "a human was asked about arguments that cannot run"
    assert await containers(sandbox_manager) == before
    listed = await tools.code_list_files(target)
    assert listed["files"] == [], "the refused call changed the workspace"


#: The shipped config's rules, with HIGH asked too (by default it runs at once).
DOTENV_RULES = load_config(
    REPO / "config" / "harombe.yaml",
    environ={"HAROMBE__SECURITY__HITL__AUTO_APPROVE_UP_TO": "medium"},
)

SAME_AS: list[tuple[str, Call, str, str]] = [
    ("dotenv-dot-slash", lambda t, s: t.code_read_file(s, "./.env"), ".env", "CRITICAL"),
    ("dotenv-workspace", lambda t, s: t.code_read_file(s, "/workspace/.env"), ".env", "CRITICAL"),
    ("dotenv-double-slash", lambda t, s: t.code_read_file(s, "//workspace//.env"), ".env",
     "CRITICAL"),
    ("dotenv-nested", lambda t, s: t.code_read_file(s, "cfg/./.env"), "cfg/.env", "CRITICAL"),
    ("script-dot-slash", lambda t, s: t.code_write_file(s, "./run.py", "print(1)"), "run.py",
     "HIGH"),
    ("script-workspace", lambda t, s: t.code_write_file(s, "/workspace//bin/run.sh", "echo"),
     "bin/run.sh", "HIGH"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "canonical", "risk"), [r[1:] for r in SAME_AS], ids=[r[0] for r in SAME_AS]
)
async def test_path_spellings_are_rated_as_the_file_they_name(
    sandbox_manager: SandboxManager, target: str, call: Call, canonical: str, risk: str
) -> None:
    """The gate is shown the normalised path the manager would use, and rates it the same."""
    approver = ScriptedApprover(default=False)
    gate = gate_from_config(DOTENV_RULES, approver=approver)
    assert gate is not None
    result = await call(CodeExecutionTools(sandbox_manager, hitl_gate=gate), target)
    assert result["success"] is False and result["approval"]["risk"] == risk, result
    (request,) = approver.requests
    assert request.operation.params["file_path"] == canonical
    assert result["file_path"] == canonical


async def test_code_in_a_sandbox_with_network_is_rated_as_network(
    sandbox_manager: SandboxManager,
) -> None:
    """A call on a network-enabled sandbox that does not repeat network_enabled is CRITICAL."""
    approver = ScriptedApprover([True], default=False)
    tools = CodeExecutionTools(sandbox_manager, hitl_gate=HITLGate(approver=approver))
    created = await tools.code_execute(
        "python", "print(1)", network_enabled=True, allowed_domains=["example.test"]
    )
    assert created["success"], created
    try:
        again = await tools.code_execute("python", "print(2)", sandbox_id=created["sandbox_id"])
        assert again["success"] is False and again["approval"]["risk"] == "CRITICAL"
        assert approver.requests[1].operation.params["network_enabled"] is True
        assert approver.requests[1].operation.params["allowed_domains"] == ["example.test"]
    finally:
        await tools.code_destroy_sandbox(created["sandbox_id"])


async def test_a_lost_sandbox_does_not_pass_its_grants_on(
    sandbox_manager: SandboxManager,
) -> None:
    """A sandbox removed from outside comes back lost; neither id keeps its 'for this sandbox'
    grant, so the same code on the replacement is asked about again."""
    approver = ScriptedApprover([ApprovalResponse(True, scope="sandbox")], default=False)
    tools = CodeExecutionTools(sandbox_manager, hitl_gate=HITLGate(approver=approver))
    created = await tools.code_execute("python", "print(1)")
    sid = created["sandbox_id"]
    box = sandbox_manager.get(sid)
    await sandbox_manager.docker.remove_container(box.container_id)
    lost = await tools.code_execute("python", "print(1)", sandbox_id=sid)
    assert lost["status"] == "lost" and lost["replaced_sandbox_id"] == sid, lost
    replacement = lost["sandbox_id"]
    try:
        again = await tools.code_execute("python", "print(1)", sandbox_id=replacement)
        assert again["success"] is False and again["approval"]["status"] == "denied"
        assert len(approver.requests) == 2
    finally:
        await tools.code_destroy_sandbox(replacement)


def short_limits(default_s: float, ceiling_s: float) -> Any:
    data = load_config(environ={}).model_dump()
    data["security"]["sandbox"]["pool"]["size"] = 0
    data["security"]["sandbox"]["limits"].update(
        max_execution_time=default_s, max_timeout_s=ceiling_s
    )
    return parse_config(data)


@pytest.fixture(scope="module")
async def short_manager(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    """Default timeout 1 s, ceiling 4 s, no pool."""
    manager = SandboxManager(docker_manager, config=short_limits(1, 4))
    await manager.start()
    yield manager
    await manager.stop()


async def test_a_longer_timeout_than_the_default_is_honoured(short_manager: SandboxManager) -> None:
    """timeout above max_execution_time (up to the ceiling) lets the code finish."""
    tools = CodeExecutionTools(short_manager, hitl_gate=None)
    result = await tools.code_execute("python", "import time; time.sleep(2); print('done')",
                                      timeout=3.5)  # fmt: skip
    assert result["success"] and result["stdout"] == "done\n", result
    assert result["timeout_s"] == 3.5 and result["warnings"] == []
    await tools.code_destroy_sandbox(result["sandbox_id"])


async def test_a_timeout_above_the_ceiling_is_capped_and_said(
    short_manager: SandboxManager,
) -> None:
    """timeout=1e9 runs for the ceiling only, and the result says it was capped."""
    tools = CodeExecutionTools(short_manager, hitl_gate=None)
    result = await tools.code_execute("shell", "sleep 30", timeout=1e9)
    assert result["status"] == "timeout" and result["timeout_s"] == 4, result
    assert any("capped to max_timeout_s 4s" in w for w in result["warnings"])
    await tools.code_destroy_sandbox(result["sandbox_id"])


async def test_no_container_is_left_by_refused_calls_without_a_sandbox(
    sandbox_manager: SandboxManager,
) -> None:
    """Bad arguments and no sandbox id create no sandbox: live sandboxes and pool unchanged."""
    tools = CodeExecutionTools(sandbox_manager, hitl_gate=None)
    before = set(sandbox_manager.sandboxes)
    for language in LANGUAGES:
        for bad in ({"timeout": math.nan}, {"network_enabled": "false"}, {"fresh": 1}):
            result = await tools.code_execute(language, "print(1)", **bad)
            assert result["success"] is False and result["sandbox_id"] is None
    assert set(sandbox_manager.sandboxes) == before

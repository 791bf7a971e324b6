"""Every tool result has the keys of the tool's success, whatever ended the call: a real
SandboxManager on FakeDocker, the tools over it, and every way a call can fail."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.errors import PackageFetchError
from harombe.security.approval.approvers import approve_up_to, deny_all
from harombe.security.approval.gate import HITLGate
from harombe.security.runtime.sandbox import ExecutionResult
from harombe.security.sandbox_manager import SandboxManager
from harombe.service import mcp_content
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.http import clients
from harombe.tools import dispatch
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.shapes import TEMPLATES, keys_of, shaped
from tests.unit.fake_manager import Hold, container_of, running

UNKNOWN = "sandbox-0123456789ab"
TOOLS = sorted(TEMPLATES)


@dataclass
class Rig:
    """The fake Docker, a started manager, ungated and gated tools, and a live sandbox."""

    docker: FakeDocker
    manager: SandboxManager
    tools: CodeExecutionTools
    denying: CodeExecutionTools
    approving: CodeExecutionTools
    sid: str


def _installed(success: bool = True) -> Callable[..., Awaitable[ExecutionResult]]:
    """A stand-in for the manager's install (the fake guest has no pip): its result."""

    async def install(
        sandbox_id: str, package: str, registry: str = "pypi", *, on_progress: object = None
    ) -> ExecutionResult:
        return ExecutionResult(
            success=success, sandbox_id=sandbox_id, stdout="Successfully installed\n",
            stderr="", exit_code=0 if success else 1, execution_time=0.1,
            error=None if success else "pip failed", status="ok" if success else "error",
            language="shell", runtime="runsc",
        )  # fmt: skip

    return install


@asynccontextmanager
async def rig(docker: FakeDocker | None = None) -> AsyncIterator[Rig]:
    async with running(docker) as (fake, manager):
        tools = CodeExecutionTools(manager)
        first = await tools.code_execute(language="python", code="print('hi')")
        await tools.code_write_file(first["sandbox_id"], "a.txt", "text")
        manager.install_package = _installed()  # type: ignore[method-assign]
        yield Rig(
            fake, manager, tools,
            CodeExecutionTools(manager, hitl_gate=HITLGate(approver=deny_all)),
            CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approve_up_to("critical"))),
            first["sandbox_id"],
        )  # fmt: skip


Call = Callable[[Rig], Awaitable[dict[str, Any]]]

#: One call of each tool that succeeds, ungated and gated.
SUCCESSES: dict[str, Call] = {
    "code_execute": lambda r: r.tools.code_execute("python", "print(1)", sandbox_id=r.sid),
    "code_install_package": lambda r: r.tools.code_install_package(r.sid, "six==1.16.0"),
    "code_write_file": lambda r: r.tools.code_write_file(r.sid, "b.txt", "x"),
    "code_read_file": lambda r: r.tools.code_read_file(r.sid, "a.txt"),
    "code_list_files": lambda r: r.tools.code_list_files(r.sid),
    "code_destroy_sandbox": lambda r: r.tools.code_destroy_sandbox(r.sid),
}
GATED_SUCCESSES: dict[str, Call] = {
    "code_execute": lambda r: r.approving.code_execute("python", "print(1)"),
    "code_read_file": lambda r: r.approving.code_read_file(r.sid, "a.txt", encoding="base64"),
    "code_destroy_sandbox": lambda r: r.approving.code_destroy_sandbox(r.sid),
}


async def _lose(r: Rig) -> None:
    """The sandbox dies from outside: its next call finds it lost."""
    r.docker.kill(str(container_of(r.docker, r.sid)))


async def _lost_then(r: Rig, call: Call) -> dict[str, Any]:
    await _lose(r)
    return await call(r)


async def _docker_away(r: Rig) -> dict[str, Any]:
    r.docker.away("create_container", times=5)
    return await r.tools.code_execute("python", "print(1)")


async def _install_fetch_fails(r: Rig) -> dict[str, Any]:
    async def fails(*_: Any, **__: Any) -> ExecutionResult:
        raise PackageFetchError("the index could not be reached (fake)")

    r.manager.install_package = fails  # type: ignore[method-assign]
    return await r.tools.code_install_package(r.sid, "six")


async def _install_fails(r: Rig) -> dict[str, Any]:
    r.manager.install_package = _installed(success=False)  # type: ignore[method-assign]
    return await r.tools.code_install_package(r.sid, "six")


async def _stream_result(r: Rig, tools: CodeExecutionTools, **kwargs: Any) -> dict[str, Any]:
    items = [i async for i in tools.code_execute_stream(**kwargs)]
    final = items[-1]
    assert final.pop("type") == "result"
    return final


async def _timed_out(r: Rig) -> dict[str, Any]:
    return await r.tools.code_execute("python", "hold", sandbox_id=r.sid, timeout=0.2)


def _ex(r: Rig, gated: bool = False, **kwargs: Any) -> Awaitable[dict[str, Any]]:
    """code_execute of ``print(1)`` in Python, with ``kwargs`` changing any argument."""
    tools = r.denying if gated else r.tools
    return tools.code_execute(**{"language": "python", "code": "print(1)", **kwargs})


def _on(r: Rig, tool: str, *args: Any, gated: bool = False) -> Awaitable[dict[str, Any]]:
    """``tool`` of the ungated (or denying) tools, called with ``args``."""
    method: Callable[..., Awaitable[dict[str, Any]]] = getattr(
        r.denying if gated else r.tools, tool
    )
    return method(*args)


EX, INSTALL, WRITE = "code_execute", "code_install_package", "code_write_file"
READ, LIST, DESTROY = "code_read_file", "code_list_files", "code_destroy_sandbox"
URL = "git+https://x.example.org/y"

# (tool, id, the failing call) — every way a call can end without success.
FAILURES: list[tuple[str, str, Call]] = [
    (EX, "bad-language", lambda r: _ex(r, language="cobol")),
    (EX, "bad-type", lambda r: _ex(r, code=3)),
    (EX, "bad-network", lambda r: _ex(r, network_enabled="yes")),
    (EX, "malformed-id", lambda r: _ex(r, sandbox_id="nope")),
    (EX, "unknown-sandbox", lambda r: _ex(r, sandbox_id=UNKNOWN)),
    (EX, "denied", lambda r: _ex(r, gated=True)),
    (EX, "denied-existing", lambda r: _ex(r, gated=True, sandbox_id=r.sid)),
    (EX, "unknown-profile", lambda r: _ex(r, profile="nope")),
    (EX, "profile-refused", lambda r: _ex(r, code="import os", profile="minimal")),
    (EX, "unknown-environment", lambda r: _ex(r, environment="nope")),
    (EX, "network-change", lambda r: _ex(r, sandbox_id=r.sid, network_enabled=True)),
    (EX, "docker-away", _docker_away),
    (EX, "lost", lambda r: _lost_then(r, SUCCESSES[EX])),
    (EX, "exit-code", lambda r: _ex(r, language="shell", code="exit 3", sandbox_id=r.sid)),
    (EX, "run-timeout", _timed_out),
    (EX, "stream-denied", lambda r: _stream_result(r, r.denying, language="python", code="1")),
    (EX, "stream-invalid", lambda r: _stream_result(r, r.tools, language="cobol", code="1")),
    (INSTALL, "bad-registry", lambda r: _on(r, INSTALL, r.sid, "six", "cargo")),
    (INSTALL, "bad-spec", lambda r: _on(r, INSTALL, r.sid, URL)),
    (INSTALL, "missing-id", lambda r: _on(r, INSTALL, None, "six")),
    (INSTALL, "unknown-sandbox", lambda r: _on(r, INSTALL, UNKNOWN, "six")),
    (INSTALL, "denied", lambda r: _on(r, INSTALL, r.sid, "six", gated=True)),
    (INSTALL, "fetch-fails", _install_fetch_fails),
    (INSTALL, "pip-fails", _install_fails),
    (WRITE, "escape", lambda r: _on(r, WRITE, r.sid, "../etc/x", "x")),
    (WRITE, "bad-content", lambda r: _on(r, WRITE, r.sid, "a", b"x")),
    (WRITE, "unknown-sandbox", lambda r: _on(r, WRITE, UNKNOWN, "a", "x")),
    (WRITE, "denied", lambda r: _on(r, WRITE, r.sid, "a", "x", gated=True)),
    (WRITE, "lost", lambda r: _lost_then(r, SUCCESSES[WRITE])),
    (READ, "missing", lambda r: _on(r, READ, r.sid, "none.txt")),
    (READ, "escape", lambda r: _on(r, READ, r.sid, "/etc/passwd")),
    (READ, "bad-encoding", lambda r: _on(r, READ, r.sid, "a.txt", "latin-1")),
    (READ, "unknown-sandbox", lambda r: _on(r, READ, UNKNOWN, "a.txt")),
    (READ, "denied", lambda r: _on(r, READ, r.sid, "a.txt", gated=True)),
    (READ, "lost", lambda r: _lost_then(r, SUCCESSES[READ])),
    (LIST, "missing-dir", lambda r: _on(r, LIST, r.sid, "nope")),
    (LIST, "escape", lambda r: _on(r, LIST, r.sid, "..")),
    (LIST, "unknown-sandbox", lambda r: _on(r, LIST, UNKNOWN)),
    (LIST, "denied", lambda r: _on(r, LIST, r.sid, gated=True)),
    (LIST, "lost", lambda r: _lost_then(r, SUCCESSES[LIST])),
    (DESTROY, "malformed-id", lambda r: _on(r, DESTROY, "nope")),
    (DESTROY, "missing-id", lambda r: _on(r, DESTROY, None)),
    (DESTROY, "unknown-sandbox", lambda r: _on(r, DESTROY, UNKNOWN)),
]


@pytest.mark.parametrize("tool", TOOLS)
async def test_a_success_has_exactly_the_template_keys(tool: str) -> None:
    """Each tool's successful result has the keys its template lists, no more, no fewer."""
    async with rig() as r:
        result = await SUCCESSES[tool](r)
    assert result["success"] is True, result
    assert set(result) == keys_of(tool), set(result) ^ keys_of(tool)


@pytest.mark.parametrize("tool", sorted(GATED_SUCCESSES))
async def test_a_gated_success_has_the_same_keys(tool: str) -> None:
    """With a gate the decision fills ``approval``; the key set does not change (a binary
    read included)."""
    async with rig() as r:
        result = await GATED_SUCCESSES[tool](r)
    assert result["success"] is True and result["approval"]["status"] in (
        "approved",
        "auto_approved",
    ), result
    assert set(result) == keys_of(tool)


@pytest.mark.parametrize(
    ("tool", "call"), [(t, c) for t, _, c in FAILURES], ids=[f"{t}-{i}" for t, i, _ in FAILURES]
)
async def test_every_failure_has_the_keys_of_a_success(tool: str, call: Call) -> None:
    """A call that fails — refused, denied, unknown sandbox, Docker away, lost, timed out,
    failing code — has every key of its tool's success; the usage guide's reads work."""
    async with rig(FakeDocker(handler=Hold())) as r:
        result = await call(r)
    assert result["success"] is False and result["error"], result
    assert set(result) == keys_of(tool), set(result) ^ keys_of(tool)
    if tool == "code_execute":
        assert isinstance(result["stdout"], str) and isinstance(result["stderr"], str)


async def test_a_failure_before_the_run_reads_as_nothing_ran() -> None:
    """Refused before it ran: empty output, no exit code or status, and the scan's findings
    under ``violations``."""
    async with rig() as r:
        refused = await r.tools.code_execute("python", "import os", profile="minimal")
    assert (refused["stdout"], refused["stderr"], refused["exit_code"]) == ("", "", None)
    assert refused["status"] is None and refused["result"] is None
    assert refused["violations"] and refused["error"].startswith("GuardrailError:")


@pytest.mark.parametrize("tool", TOOLS)
async def test_dispatch_refusals_of_a_known_tool_have_its_shape(tool: str) -> None:
    """A model's call whose arguments are not an object of the tool's parameters comes back
    in the tool's full shape; an unknown tool name keeps the short form."""
    async with rig() as r:
        result = await dispatch(r.tools, tool, "[not json")
        unknown = await dispatch(r.tools, "python", {})
    assert result["error"].startswith("InvalidArgumentError:")
    assert set(result) == keys_of(tool)
    assert set(unknown) == {"success", "tool", "error"}


@pytest.mark.parametrize("tool", TOOLS)
def test_mcp_error_results_of_a_known_tool_have_its_shape(tool: str) -> None:
    """An MCP call refused before the tool ran still carries the tool's keys, as JSON text and
    as structured content."""
    answer = mcp_content.error_result("UsageError", "no", tool)
    assert answer.is_error and set(answer.structured_content or {}) == keys_of(tool)
    assert set(json.loads(answer.content[0].text)) == keys_of(tool)  # type: ignore[union-attr]


def test_shaped_keeps_values_and_copies_the_template() -> None:
    """The result's values win; a list filled in one result is not another's default."""
    first = shaped("code_list_files", {"success": True, "path": "."})
    first["files"].append("x")
    assert shaped("code_list_files", {})["files"] == [] and first["path"] == "."


# The service serialises these results: /v1 gives the whole shape, the fips sidecar its own.

#: Code containing this marker is held for approval with a 0.3 s timeout, then denied.
HOLD_SHORT = {"tools": ["code_execute"], "risk": "critical", "timeout": 0.3,
              "conditions": [{"param": "code", "matches": "HOLD_SHORT"}]}  # fmt: skip


@asynccontextmanager
async def service(docker: FakeDocker, *, hitl: bool) -> AsyncIterator[Any]:
    """A client of a token-less service over FakeDocker, with the short-hold rule."""
    hitl_config = {"enabled": hitl, "rules": [HOLD_SHORT]}
    cfg = parse_config({"security": {"sandbox": {"pool": {"size": 0}}, "hitl": hitl_config}})
    svc = Service(cfg, docker_manager=docker, environ={})
    await svc.start()
    try:
        async with clients(create_app(service=svc))() as client:
            yield client
    finally:
        await svc.stop()


async def test_v1_answers_a_run_with_every_key(docker: FakeDocker) -> None:
    """POST /v1/sandboxes/{id}/execute: the JSON answer has the library result's keys."""
    async with service(docker, hitl=False) as c:
        sid = (await c.post("/v1/sandboxes", json={})).json()["sandbox_id"]
        ran = await c.post(f"/v1/sandboxes/{sid}/execute", json={"code": "print('hi')"})
    assert ran.status_code == 200 and set(ran.json()) == keys_of("code_execute")


@pytest.mark.parametrize(
    ("hitl", "code", "status", "keys"),
    [(True, "print('HOLD_SHORT')", 403, {"error"}),
     (False, "import os", 400, {"error", "violations"}),
     (False, "print('hi')", 200, {"stdout", "stderr", "exit_code", "timed_out", "result"})],
    ids=["denied", "refused-by-scan", "ran"],
)  # fmt: skip
async def test_fips_execute_keeps_its_own_shapes(
    docker: FakeDocker, hitl: bool, code: str, status: int, keys: set[str]
) -> None:
    """The sidecar's /execute answers its fixed shapes: a call refused before it ran is not
    mistaken for a run now that the result carries ``status: None``."""
    async with service(docker, hitl=hitl) as c:
        answer = await c.post("/execute", json={"code": code})
    assert (answer.status_code, set(answer.json())) == (status, keys), answer.text

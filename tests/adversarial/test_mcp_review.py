"""Adversarial probes of the MCP server (no Docker, or FakeDocker): results that cannot be sent
as JSON, forged and missing elicitation answers, progress to a stuck client, tool names that are
not tools, odd arguments, and tenants over ``/mcp`` (sessions, sandboxes, the session table).

Failing tests here are defects; the passing ones guard the server's key claims."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client

from harombe.config import parse_config
from harombe.security.approval.gate import HITLGate, HITLRule, Operation, RiskClassifier, RiskLevel
from harombe.service import mcp as mcp_server
from harombe.service.app import create_app
from harombe.service.mcp import ProgressRelay, build_server
from harombe.service.mcp_approval import ElicitingApprover, answer_of
from harombe.service.mcp_content import to_call_result
from harombe.service.mcp_http import MAX_SESSIONS_PER_TENANT, McpEndpoint
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.http import serving
from harombe.tools import schemas

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "probe", "version": "0"}},
}  # fmt: skip
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _no_nan(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ---- results that cannot be sent as they are ----------------------------------------------


#: Where a lone surrogate (e.g. in an image note the sandbox's code wrote) can sit in a result.
SURROGATE_RESULTS = {
    "warning": {"success": True, "warnings": ["rendering failed (ValueError: bad \udcff)"]},
    "key": {"success": True, "entries": {"a\ud800": 1}},
    "artifact-source": {"success": True, "artifacts": [
        {"kind": "image", "mime_type": "image/png", "data": "iVBORw0KGgo=", "source": "f\udcff"}]},
    "error": {"success": False, "error": "InvalidArgumentError: \udfff"},
}  # fmt: skip


@pytest.mark.parametrize("result", list(SURROGATE_RESULTS.values()), ids=list(SURROGATE_RESULTS))
def test_a_result_with_a_lone_surrogate_still_serialises(result: dict[str, Any]) -> None:
    """A lone surrogate in a result (user code can put one in an image note) must not make
    the transport's JSON encoding fail: over stdio that ended the server and all sandboxes."""
    mapped = to_call_result(result)
    wire = mapped.model_dump_json(by_alias=True, exclude_unset=True)  # what the transports do
    text = json.loads(wire)["content"][0]["text"]
    assert json.loads(text) == json.loads(wire)["structuredContent"]
    assert "\\ud" in text or "\\ud" in json.dumps(json.loads(text), ensure_ascii=False)


@pytest.mark.parametrize("result", list(SURROGATE_RESULTS.values()), ids=list(SURROGATE_RESULTS))
def test_tool_result_text_is_strict_utf8_json(result: dict[str, Any]) -> None:
    """The text sent back to a model is valid UTF-8 (an HTTP client must be able to send it)
    and strict JSON."""
    text = schemas.tool_result_text({**result, "execution_time": float("nan")})
    text.encode("utf-8")
    json.loads(text, parse_constant=_no_nan)
    block = schemas.anthropic_tool_result("t1", result)
    json.dumps(block, allow_nan=False).encode("utf-8")


# ---- elicitation answers ------------------------------------------------------------------


FORGED_ANSWERS = {
    "upper-case": types.ElicitResult(action="accept", content={"decision": "APPROVE"}),
    "padded": types.ElicitResult(action="accept", content={"decision": "approve "}),
    "list": types.ElicitResult(action="accept", content={"decision": ["approve"]}),
    "bool": types.ElicitResult(action="accept", content={"decision": True}),
    "number": types.ElicitResult(action="accept", content={"decision": 1}),
    "missing": types.ElicitResult(action="accept", content={}),
    "no-content": types.ElicitResult(action="accept"),
    "other-field": types.ElicitResult(action="accept", content={"approve": "approve"}),
    "decline-with-approve": types.ElicitResult(action="decline", content={"decision": "approve"}),
    "cancel-with-approve": types.ElicitResult(action="cancel", content={"decision": "approve"}),
}


@pytest.mark.parametrize("answer", list(FORGED_ANSWERS.values()), ids=list(FORGED_ANSWERS))
def test_odd_elicitation_answers_deny(answer: types.ElicitResult) -> None:
    """Only an accepted, exact ``approve`` / ``approve_sandbox`` approves: nothing else does."""
    assert answer_of(answer).approved is False


def test_a_huge_elicitation_answer_is_not_echoed_whole() -> None:
    """A client's megabyte-long 'decision' is not copied into the result, the audit feed and
    the log (it is the client's text, and a denial says enough with its start)."""
    answer = types.ElicitResult(action="accept", content={"decision": "x" * 1_000_000})
    response = answer_of(answer)
    assert response.approved is False and len(response.comment or "") < 300


class ScriptedHost:
    """Asks ``gate`` about each call, as the tools do, and says whether it ran."""

    def __init__(self, gate: HITLGate) -> None:
        self.gate = gate

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, *, on_output: Any, request: Any
    ) -> dict[str, Any]:
        decision = await self.gate.check_approval(Operation(name, dict(arguments or {})))
        if not decision.approved:
            return {"success": False, "error": str(decision.error())}
        return {"success": True, "ran": True}


async def test_an_elicitation_never_answered_is_denied_at_the_rules_timeout() -> None:
    """A client that never answers the form cannot hold the call: the rule's timeout denies."""
    rule = HITLRule(tools=["code_execute"], risk=RiskLevel.HIGH, require_approval=True,
                    timeout=0.5)  # fmt: skip
    gate = HITLGate(RiskClassifier([rule]), ElicitingApprover())

    async def silent(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    server = build_server(ScriptedHost(gate))
    with anyio.fail_after(30):
        async with Client(server, mode="legacy", elicitation_callback=silent) as client:
            result = await client.call_tool("code_execute", {"language": "python", "code": "1"})
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    assert result.is_error and "ran" not in json.loads(first.text)
    assert "0.5 s" in json.loads(first.text)["error"]


# ---- progress to a client that does not read ----------------------------------------------


class StuckSession:
    """A client whose progress notifications never go out."""

    def __init__(self) -> None:
        self.attempts = 0

    async def report_progress(self, progress: float, total: float | None, message: str) -> None:
        self.attempts += 1
        await asyncio.Event().wait()


async def test_a_stuck_client_neither_stalls_the_output_nor_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Output keeps flowing from the sandbox (on_output never waits) and the call ends after
    the flush wait, its sender task cancelled, even when the client never reads."""
    monkeypatch.setattr(mcp_server, "FLUSH_WAIT_S", 0.2)
    session = StuckSession()
    relay = ProgressRelay(session)
    async with relay:
        for _ in range(2000):
            assert relay.on_output("stdout", b"x" * 1024) is None  # a sync callback: no wait
        await asyncio.sleep(0.05)
    assert session.attempts == 1  # one notification pending, the rest queued, then dropped
    assert relay._task is not None and relay._task.done()


# ---- names and arguments a model can send -------------------------------------------------


class Untouchable:
    """Tools that fail the test when anything on them is used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"dispatch touched tools.{name}")


@pytest.mark.parametrize(
    "name",
    ["__init__", "code_execute_stream", "sandbox_manager", "hitl_gate", "_call", "_audit",
     "CODE_EXECUTE", "code_execute\x00", " code_execute", "__class__", "profiles", ""],
)  # fmt: skip
async def test_names_that_are_not_tools_reach_nothing(name: str) -> None:
    """Only the six tool names are dispatched: an attribute of the tools object is not a tool."""
    result = await schemas.dispatch(Untouchable(), name, {"language": "python", "code": "1"})  # type: ignore[arg-type]
    assert result["success"] is False and result["error"].startswith("UnknownToolError")


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
async def fake() -> AsyncIterator[FakeDocker]:
    docker = FakeDocker()
    await docker.start()
    yield docker
    for container in docker.containers.values():
        container.guest.stop()


@pytest.mark.parametrize(
    "arguments",
    [{"language": "python", "code": _deep(50_000)},
     {"language": "python", "code": "1", "extra": _deep(50_000)},
     {"language": "python", "code": "1", "timeout": _deep(50_000)},
     {"language": "python", "code": "x" * 2_000_000, "sandbox_id": "sb" * 100_000}],
    ids=["deep-code", "deep-unknown-key", "deep-timeout", "huge"],
)  # fmt: skip
async def test_deep_or_huge_arguments_are_a_tool_error(
    fake: FakeDocker, arguments: dict[str, Any]
) -> None:
    """Arguments nested 50 000 deep or megabytes long come back as an error, never raised."""
    from harombe.security.runtime.manager import SandboxManager
    from harombe.tools.code_execution import CodeExecutionTools

    config = parse_config({"security": {"sandbox": {"pool": {"size": 0}},
                                        "hitl": {"enabled": False}}})  # fmt: skip
    manager = SandboxManager(docker_manager=fake, config=config)
    await manager.start()
    try:
        result = await schemas.dispatch(
            CodeExecutionTools(manager, hitl_gate=None), "code_execute", arguments
        )
        mapped = to_call_result(result).model_dump_json()
    finally:
        await manager.stop()
    assert result["success"] is False and len(mapped) < 100_000
    assert result["error"].split(":", 1)[0] in {"InvalidArgumentError", "SandboxNotFoundError"}


# ---- /mcp over HTTP: tenants and sessions -------------------------------------------------


def _config(*, tokens: bool = True) -> Any:
    entries = [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB},
               {"name": "judge", "token": JUDGE, "role": "approver"}]  # fmt: skip
    return parse_config({
        "security": {"sandbox": {"pool": {"size": 0}}, "hitl": {"enabled": False}},
        "service": {"tokens": entries if tokens else []},
    })  # fmt: skip


def _endpoint(app: Any) -> McpEndpoint:
    for route in app.router.routes:
        if getattr(route, "path", None) == "/mcp":
            endpoint = route.endpoint
            assert isinstance(endpoint, McpEndpoint)
            return endpoint
    raise AssertionError("no /mcp route")


async def _open(http: httpx.AsyncClient, token: str | None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth})


async def _call(
    http: httpx.AsyncClient, token: str, session_id: str, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """One tools/call in an initialised session; the tool's result dict."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}", "mcp-session-id": session_id,
               "mcp-protocol-version": "2025-11-25"}  # fmt: skip
    await http.post("/mcp", headers=headers,
                    json={"jsonrpc": "2.0", "method": "notifications/initialized"})  # fmt: skip
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}  # fmt: skip
    answer = await http.post("/mcp", json=call, headers=headers)
    assert answer.status_code == 200, answer.text
    for line in answer.text.splitlines():
        if line.startswith("data:") and '"id":7' in line.replace(" ", ""):
            return dict(json.loads(json.loads(line[5:])["result"]["content"][0]["text"]))
    raise AssertionError(f"no result in {answer.text[:300]!r}")


@pytest.fixture
async def api(fake: FakeDocker) -> AsyncIterator[tuple[str, Any]]:
    """A live service with tokens over FakeDocker; its base URL and app."""
    app = create_app(service=Service(_config(), docker_manager=fake, environ={}))
    async with serving(app) as base:
        yield base, app


@pytest.mark.parametrize(
    ("tool", "extra"),
    [("code_execute", {"language": "python", "code": "print(1)"}),
     ("code_read_file", {"file_path": "a.txt"}), ("code_list_files", {}),
     ("code_write_file", {"file_path": "a.txt", "content": "owned"}),
     ("code_install_package", {"package": "six", "registry": "pypi"}),
     ("code_destroy_sandbox", {})],
    ids=["execute", "read", "list", "write", "install", "destroy"],
)  # fmt: skip
async def test_no_tool_reaches_another_tenants_sandbox(
    api: tuple[str, Any], tool: str, extra: dict[str, Any]
) -> None:
    """Bob naming Alice's sandbox in any tool gets SandboxNotFoundError; hers is untouched."""
    base, app = api
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        alice_session = (await _open(http, ALICE)).headers["mcp-session-id"]
        made = await _call(http, ALICE, alice_session, "code_execute",
                           {"language": "python", "code": "print(1)"})  # fmt: skip
        sid = made["sandbox_id"]
        bob_session = (await _open(http, BOB)).headers["mcp-session-id"]
        refused = await _call(http, BOB, bob_session, tool, {"sandbox_id": sid, **extra})
    assert refused["success"] is False and refused["error"].startswith("SandboxNotFoundError")
    assert sid in app.state.service.manager.sandboxes


async def test_expired_sessions_are_forgotten(api: tuple[str, Any]) -> None:
    """Sessions the SDK ended (idle timeout) leave nothing in the session→tenant table."""
    base, app = api
    endpoint = _endpoint(app)
    endpoint.sessions.session_idle_timeout = 0.2
    async with httpx.AsyncClient(base_url=base) as http:
        for _ in range(20):
            assert (await _open(http, ALICE)).status_code == 200
        for _ in range(200):
            if not endpoint.sessions._server_instances:
                break
            await asyncio.sleep(0.05)
        assert not endpoint.sessions._server_instances
        assert (await _open(http, BOB)).status_code == 200
    assert len(endpoint._owners) <= 1


async def test_one_tenant_cannot_take_every_mcp_session(api: tuple[str, Any]) -> None:
    """A tenant opening sessions without end is refused (429) past its share, and another
    tenant can still connect: one client cannot fill the server's session table."""
    base, _ = api
    async with httpx.AsyncClient(base_url=base) as http:
        opened = [await _open(http, ALICE) for _ in range(MAX_SESSIONS_PER_TENANT)]
        over = await _open(http, ALICE)
        bob = await _open(http, BOB)
    assert all(r.status_code == 200 for r in opened)
    assert over.status_code == 429 and "mcp-session-id" not in over.headers
    assert "DELETE" in over.json()["message"]
    assert bob.status_code == 200


async def test_a_burst_of_opens_cannot_pass_the_session_share(api: tuple[str, Any]) -> None:
    """Opening requests sent all at once count while they are served: the share still holds."""
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        answers = await asyncio.gather(
            *(_open(http, ALICE) for _ in range(MAX_SESSIONS_PER_TENANT + 16))
        )
    opened = [r for r in answers if r.status_code == 200]
    assert 0 < len(opened) <= MAX_SESSIONS_PER_TENANT
    assert {r.status_code for r in answers} <= {200, 429}


@pytest.mark.parametrize(
    ("host", "origin"),
    [("127.0.0.1", "http://attacker.example"), ("localhost:8000", "https://evil.example:8000"),
     ("attacker.example", "http://attacker.example"), ("127.0.0.1.nip.io", None)],
    ids=["foreign-origin", "foreign-origin-tls", "rebound-host", "look-alike-host"],
)  # fmt: skip
async def test_without_tokens_a_web_page_cannot_reach_mcp(
    fake: FakeDocker, host: str, origin: str | None
) -> None:
    """Without tokens, a browser page (a foreign Origin, or a host name rebound to loopback)
    opens no MCP session."""
    app = create_app(service=Service(_config(tokens=False), docker_manager=fake, environ={}))
    async with serving(app) as base, httpx.AsyncClient(base_url=base) as http:
        headers = {**MCP_HEADERS, "Host": host, **({"Origin": origin} if origin else {})}
        refused = await http.post("/mcp", json=INITIALIZE, headers=headers)
        fine = await _open(http, None)
    assert refused.status_code in (400, 403) and "mcp-session-id" not in refused.headers
    assert fine.status_code == 200

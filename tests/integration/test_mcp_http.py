"""MCP over streamable HTTP at ``/mcp`` of a live ``harombe serve`` (real gVisor), driven by
the MCP SDK's own client: calls per tenant, progress, elicitation, and the service's auth."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harombe.security.runtime.docker import DockerManager
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing.http import clients
from tests.integration.service_support import live_service, service_config

pytestmark = pytest.mark.integration

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
#: Alice is a person at a desktop client (human: her elicitation answers count); Bob is an
#: agent, whose own answers never approve his calls.
TOKENS = [
    {"name": "alice", "token": ALICE, "human": True},
    {"name": "bob", "token": BOB},
    {"name": "judge", "token": JUDGE, "role": "approver"},
]
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
async def api(docker_manager: DockerManager) -> AsyncIterator[tuple[Service, str]]:
    """A service with tokens and the HITL gate on."""
    config = service_config({"service": {"tokens": TOKENS}}, hitl=True)
    async with live_service(docker_manager, config) as running:
        yield running


@contextlib.asynccontextmanager
async def session_as(
    base_url: str, token: str | None, *, elicit: Any = None
) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{base_url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=elicit) as session,
    ):
        await session.initialize()
        yield session


async def approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "approve"})


async def first_held(service: Service) -> dict[str, Any]:
    """The first approval the audit feed shows requested and still pending."""
    async for event in service.feed.follow():
        pending = {p["id"] for p in service.broker.pending()}
        if event["type"] == "approval.requested" and event["approval"]["id"] in pending:
            return dict(event["approval"])
    raise AssertionError("the feed ended before any approval was requested")


def body(result: types.CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return dict(json.loads(first.text))


async def test_a_tenant_runs_code_with_state_and_progress(api: tuple[Service, str]) -> None:
    """Over HTTP: a call approved by elicitation runs, state persists on the sandbox, output
    streams as progress, and the sandbox is the tenant's."""
    service, base = api
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async with session_as(base, ALICE, elicit=approve) as session:
        args = {"language": "python", "code": "x = 6\nprint('one')\nprint('two')"}
        first = await session.call_tool("code_execute", args, progress_callback=on_progress)
        sid = body(first)["sandbox_id"]
        again = await session.call_tool(
            "code_execute", {"language": "python", "code": "x * 7", "sandbox_id": sid}
        )
        owner = service.owners[sid].name
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": sid})
    assert body(first)["stdout"] == "one\ntwo\n" == "".join(messages)
    assert body(again)["result"] == "42" and owner == "alice"
    assert sid not in service.owners


async def test_another_tenants_sandbox_is_not_found(api: tuple[Service, str]) -> None:
    """Bob cannot reach Alice's sandbox through MCP: it is SandboxNotFoundError, as on /v1."""
    _, base = api
    async with session_as(base, ALICE, elicit=approve) as alice:
        sid = body(await alice.call_tool("code_execute", {"language": "python", "code": "1"}))[
            "sandbox_id"
        ]
        async with session_as(base, BOB, elicit=approve) as bob:
            stolen = await bob.call_tool("code_list_files", {"sandbox_id": sid})
        await alice.call_tool("code_destroy_sandbox", {"sandbox_id": sid})
    assert stolen.is_error and body(stolen)["error"].startswith("SandboxNotFoundError")


async def test_without_elicitation_the_approvals_page_decides(api: tuple[Service, str]) -> None:
    """A client without elicitation waits on the approvals page, where an approver decides."""
    service, base = api
    async with session_as(base, ALICE) as session:
        call = asyncio.ensure_future(
            session.call_tool("code_execute", {"language": "python", "code": "print('paged')"})
        )
        held = await first_held(service)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {JUDGE}"}
        ) as judge:
            decided = await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
        result = body(await call)
        await session.call_tool("code_destroy_sandbox", {"sandbox_id": result["sandbox_id"]})
    assert decided.status_code == 200 and held["tenant"] == "alice"
    assert result["stdout"] == "paged\n" and result["approval"]["decided_by"] == "judge"


async def test_an_agent_token_cannot_approve_its_own_call(api: tuple[Service, str]) -> None:
    """Bob's token is not marked human: his client's elicitation is never asked, his own
    approval over /v1 is refused (403), and the held call waits on the approvals page until
    the approver decides it."""
    service, base = api
    asked: list[str] = []

    async def self_approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async with session_as(base, BOB, elicit=self_approve) as session:
        call = asyncio.ensure_future(
            session.call_tool("code_execute", {"language": "python", "code": "print('held')"})
        )
        held = await first_held(service)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {BOB}"}
        ) as bob:
            own = await bob.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
            still = await bob.get("/v1/approvals")
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {JUDGE}"}
        ) as judge:
            decided = await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
        result = body(await call)
    assert asked == [] and held["tenant"] == "bob"
    assert own.status_code == 403 and [a["id"] for a in still.json()["approvals"]] == [held["id"]]
    assert decided.status_code == 200
    assert result["success"] is False and result["approval"]["decided_by"] == "judge"
    assert result["error"].startswith("ApprovalDeniedError")


async def test_a_human_token_is_asked_through_elicitation(api: tuple[Service, str]) -> None:
    """Alice's token is marked human: her client is asked, and her answer decides."""
    service, base = api
    asked: list[str] = []

    async def deny(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "deny"})

    async with session_as(base, ALICE, elicit=deny) as session:
        result = body(
            await session.call_tool("code_execute", {"language": "python", "code": "print(1)"})
        )
    assert len(asked) == 1 and "print(1)" in asked[0]
    assert result["success"] is False and result["approval"]["decided_by"] == "mcp_elicitation"
    assert service.broker.pending() == []


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, 401), ("not-a-known-token-000000", 401), (JUDGE, 403)],
    ids=["no-token", "bad-token", "approver-token"],
)
async def test_mcp_needs_a_client_token(
    api: tuple[Service, str], token: str | None, status: int
) -> None:
    """With tokens configured, /mcp refuses a missing or unknown token (401) and an
    approver's (403), before the MCP session exists."""
    _, base = api
    headers = {**MCP_HEADERS, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with httpx.AsyncClient(base_url=base, headers=headers) as http:
        refused = await http.post("/mcp", json=INITIALIZE)
    assert refused.status_code == status
    assert "mcp-session-id" not in refused.headers


async def test_a_session_is_bound_to_its_tenant(api: tuple[Service, str]) -> None:
    """Another tenant presenting an MCP session id gets 404, as for an unknown session."""
    _, base = api
    async with httpx.AsyncClient(base_url=base, headers=MCP_HEADERS) as http:
        opened = await http.post(
            "/mcp", json=INITIALIZE, headers={"Authorization": f"Bearer {ALICE}"}
        )
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        hijack = await http.post(
            "/mcp",
            json=listing,
            headers={"Authorization": f"Bearer {BOB}", "mcp-session-id": session_id,
                     "mcp-protocol-version": "2025-11-25"},
        )  # fmt: skip
        await http.delete("/mcp", headers={"Authorization": f"Bearer {ALICE}",
                                           "mcp-session-id": session_id})  # fmt: skip
    assert opened.status_code == 200 and hijack.status_code == 404


@pytest.mark.parametrize(
    ("peer", "host", "status"),
    [("203.0.113.9", "127.0.0.1", 403), ("127.0.0.1", "attacker.example", 403)],
    ids=["remote-peer", "rebound-host"],
)
async def test_without_tokens_mcp_answers_loopback_only(
    docker_manager: DockerManager, peer: str, host: str, status: int
) -> None:
    """Without tokens /mcp answers this machine only, by a loopback name, as /v1 does."""
    app = create_app(service=Service(service_config(), docker_manager=docker_manager, environ={}))
    async with clients(app, peer=peer)(None) as http:
        refused = await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": host})
    assert refused.status_code == status and refused.json()["kind"] == "Forbidden"

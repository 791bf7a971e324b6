"""The service's app over FakeDocker (no Docker): routes, auth, tenancy, limits, errors and
approvals decided over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing import FakeDocker, capture_events
from harombe.testing.http import clients, serving

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
KEY = "approval-key-0123456789abcdef"
TOKENS = [
    {"name": "alice", "token": ALICE, "max_sandboxes": 1},
    {"name": "bob", "token": BOB},
    {"name": "judge", "token": JUDGE, "role": "approver"},
]
#: Code containing this marker is held for approval with a 0.3 s timeout.
HOLD_SHORT = {"tools": ["code_execute"], "risk": "critical", "timeout": 0.3,
              "conditions": [{"param": "code", "matches": "HOLD_SHORT"}]}  # fmt: skip


def config(*, tokens: bool = True, hitl: bool = False) -> Any:
    return parse_config({
        "security": {"sandbox": {"pool": {"size": 1}},
                     "hitl": {"enabled": hitl, "auto_approve_up_to": "medium",
                              "rules": [HOLD_SHORT]}},
        "service": {"tokens": TOKENS if tokens else [], "max_request_bytes": 4096},
    })  # fmt: skip


@pytest.fixture
async def make(docker: FakeDocker) -> AsyncIterator[Any]:
    """Start a service over FakeDocker; yields a factory of (service, client for a token)."""
    started: list[Service] = []

    async def build(cfg: Any, peer: str = "127.0.0.1") -> tuple[Service, Any]:
        svc = Service(cfg, docker_manager=docker, environ={}, approval_key=KEY)
        await svc.start()
        started.append(svc)
        return svc, clients(create_app(service=svc), peer=peer)

    yield build
    for svc in started:
        await svc.stop()


async def test_fips_routes_over_fakes(make: Any) -> None:
    """healthz, profile and execute answer the sidecar's shapes."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/profile")).json()["name"] == "minimal"
        ran = await c.post("/execute", json={"code": "print('hi')"})
        assert ran.status_code == 200
        assert ran.json() == {"stdout": "hi\n", "stderr": "", "exit_code": 0,
                              "timed_out": False, "result": None}  # fmt: skip


async def test_fips_sandboxes_are_removed_after_each_request(make: Any) -> None:
    """Each /execute runs in its own sandbox, which is gone after the answer."""
    svc, http = await make(config(tokens=False))
    async with http() as c:
        for _ in range(3):
            assert (await c.post("/execute", json={"code": "print(1)"})).status_code == 200
    await asyncio.gather(*svc._removals)
    assert svc.manager.sandboxes == {}


async def test_without_tokens_only_loopback_is_answered(make: Any) -> None:
    """No tokens configured: a caller from another address gets 403 naming service.tokens."""
    _, http = await make(config(tokens=False), peer="10.1.2.3")
    async with http() as c:
        response = await c.post("/execute", json={"code": "print(1)"})
    assert response.status_code == 403 and "service.tokens" in response.json()["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/execute", {"code": "print(1)", "timeout": 0}), ("/v1/sandboxes", {"language": 7})],
    ids=["fips", "v1"],
)
async def test_validation_errors_keep_each_faces_shape(
    make: Any, path: str, body: dict[str, Any]
) -> None:
    """fips answers FastAPI's 422 shape (its contract); /v1 answers {kind, message}."""
    _, http = await make(config())
    async with http(BOB) as c:
        response = await c.post(path, json=body)
    assert response.status_code == 422
    if path == "/execute":
        assert response.json()["detail"][0]["loc"] == ["body", "timeout"]
    else:
        assert response.json()["kind"] == "InvalidRequest"
        assert "language" in response.json()["message"]


async def test_tenancy_and_limits(make: Any) -> None:
    """Alice's sandbox is 404 to Bob; Alice's second sandbox is 429 with Retry-After."""
    _, http = await make(config())
    async with http(ALICE) as alice, http(BOB) as bob:
        made = await alice.post("/v1/sandboxes", json={})
        assert made.status_code == 201, made.text
        sid = made.json()["sandbox_id"]
        assert (await bob.get(f"/v1/sandboxes/{sid}")).status_code == 404
        assert (await bob.delete(f"/v1/sandboxes/{sid}")).status_code == 404
        full = await alice.post("/v1/sandboxes", json={})
        assert full.status_code == 429 and full.headers["retry-after"] == "5"
        assert (await alice.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        assert (await alice.post("/v1/sandboxes", json={})).status_code == 201


async def test_request_bodies_past_the_limit_are_413(make: Any) -> None:
    """Bodies over max_request_bytes are refused, declared or streamed."""
    _, http = await make(config())

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    async with http(BOB) as c:
        declared = await c.post("/execute", content=b"{" + b" " * 5000 + b"}")
        streamed = await c.post("/execute", content=chunks())
    assert declared.status_code == 413 and declared.json()["kind"] == "RequestTooLarge"
    assert streamed.status_code == 413


async def test_approvals_decided_over_http(make: Any) -> None:
    """A held call is listed to its owner and the approver; the client cannot decide it; the
    approver's approve lets it run, a deny makes it 403."""
    svc, http = await make(config(hitl=True))
    async with http(BOB) as bob, http(ALICE) as alice, http(JUDGE) as judge:
        sid = await _approved_sandbox(svc, bob, judge)
        for decision, status in (("approve", 200), ("deny", 403)):
            call = asyncio.ensure_future(
                bob.post(f"/v1/sandboxes/{sid}/execute", json={"code": "print('ok')"})
            )
            held = await _held(bob)
            assert (await alice.get("/v1/approvals")).json()["approvals"] == []
            refused = await bob.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
            assert refused.status_code == 403
            decided = await judge.post(f"/v1/approvals/{held['id']}", json={"decision": decision})
            assert decided.status_code == 200
            assert (await call).status_code == status
        kinds = [e["type"] for e in svc.feed.recent]
        assert "approval.requested" in kinds and "approval.decided" in kinds
        assert "tool.called" in kinds


async def test_an_unanswered_approval_times_out_and_is_denied(make: Any) -> None:
    """Left alone past its rule's timeout, a held call is denied (403) and leaves the list."""
    svc, http = await make(config(hitl=True))
    async with http(BOB) as bob, http(JUDGE) as judge:
        sid = await _approved_sandbox(svc, bob, judge)
        response = await bob.post(f"/v1/sandboxes/{sid}/execute",
                                  json={"code": "print('HOLD_SHORT')"})  # fmt: skip
        assert response.status_code == 403 and response.json()["kind"] == "ApprovalDeniedError"
        assert (await bob.get("/v1/approvals")).json()["approvals"] == []
    assert any(e["type"] == "approval.expired" for e in svc.feed.recent)


async def test_the_approval_key_decides_and_unknown_ids_are_404(make: Any) -> None:
    """The service's approval key may decide; an id that is not held is 404."""
    _, http = await make(config(hitl=True))
    async with http(KEY) as page:
        gone = await page.post("/v1/approvals/abc", json={"decision": "deny"})
    assert gone.status_code == 404 and gone.json()["kind"] == "ApprovalNotFound"


async def test_openapi_describes_every_route(make: Any) -> None:
    """/openapi.json lists the fips and /v1 routes."""
    _, http = await make(config())
    async with http() as c:
        paths = set((await c.get("/openapi.json")).json()["paths"])
    assert {"/healthz", "/profile", "/execute", "/v1/sandboxes", "/v1/sandboxes/{sandbox_id}",
            "/v1/sandboxes/{sandbox_id}/execute", "/v1/sandboxes/{sandbox_id}/execute/stream",
            "/v1/sandboxes/{sandbox_id}/packages", "/v1/sandboxes/{sandbox_id}/packages/stream",
            "/v1/sandboxes/{sandbox_id}/files",
            "/v1/sandboxes/{sandbox_id}/files/{file_path}", "/v1/approvals",
            "/v1/approvals/{approval_id}", "/v1/health", "/v1/version"} <= paths  # fmt: skip


async def test_stop_removes_every_sandbox(make: Any, docker: FakeDocker) -> None:
    """Stopping the service removes every container it made."""
    svc, http = await make(config())
    async with http(BOB) as bob:
        for _ in range(2):
            assert (await bob.post("/v1/sandboxes", json={})).status_code == 201
    await svc.stop()
    assert docker.containers == {}


async def _approved_sandbox(svc: Service, bob: Any, judge: Any) -> str:
    """A sandbox made through the gate (its empty first run approved by the judge)."""
    made = asyncio.ensure_future(bob.post("/v1/sandboxes", json={}))
    held = await _held(bob)
    await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
    response = await made
    assert response.status_code == 201, response.text
    return str(response.json()["sandbox_id"])


async def _held(c: Any) -> dict[str, Any]:
    for _ in range(200):
        held = (await c.get("/v1/approvals")).json()["approvals"]
        if held:
            return dict(held[0])
        await asyncio.sleep(0.01)
    raise AssertionError("nothing was held for approval")


async def test_a_failed_start_says_what_to_fix(docker: FakeDocker) -> None:
    """A service that cannot start logs one service.start_failed event naming the fix."""
    cfg = parse_config({"security": {"sandbox": {"enabled": False}}})
    svc = Service(cfg, docker_manager=docker, environ={})
    with capture_events() as events, pytest.raises(RuntimeError, match="before it started"):
        async with serving(create_app(service=svc)):
            pass
    failed = [e for e in events if e["event"] == "service.start_failed"]
    assert len(failed) == 1 and "security.sandbox.enabled" in failed[0]["error"]


async def test_a_request_is_identified_once(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token is looked up once per request (by the gatekeeper), not again by the route."""
    svc, http = await make(config())
    lookups: list[str] = []
    real = svc.tokens.lookup

    def counted(presented: str) -> Any:
        lookups.append(presented)
        return real(presented)

    monkeypatch.setattr(svc.tokens, "lookup", counted)
    async with http(BOB) as bob:
        assert (await bob.get("/v1/sandboxes")).status_code == 200
    assert lookups == [BOB]

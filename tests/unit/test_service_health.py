"""``/v1/health`` over FakeDocker: a client tenant sees only its own live sandboxes and running
calls; an approver's token or the approval key sees the whole service's."""

from __future__ import annotations

import asyncio

from harombe.config import parse_config
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.http import approved_once, clients

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
KEY = "approval-key-0123456789abcdef"
HOLD = {"tools": ["code_execute"], "risk": "critical", "timeout": 30,
        "conditions": [{"param": "code", "matches": "HOLD"}]}  # fmt: skip


async def test_health_shows_a_tenant_only_its_own_counts(docker: FakeDocker) -> None:
    """Alice sees her sandbox and no runs; Bob, whose call is held, sees one run and no
    sandbox; the approver's token and the approval key see the totals."""
    config = parse_config({
        "security": {"sandbox": {"pool": {"size": 0}}, "hitl": {"enabled": True, "rules": [HOLD]}},
        "service": {"tokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB},
                               {"name": "judge", "token": JUDGE, "role": "approver"}]},
    })  # fmt: skip
    svc = Service(config, docker_manager=docker, environ={}, approval_key=KEY)
    await svc.start()
    try:
        http = clients(create_app(service=svc))
        async with http(ALICE) as alice, http(BOB) as bob, http(JUDGE) as judge, http(KEY) as key:
            made = await approved_once(judge, alice.post("/v1/sandboxes", json={}))
            assert made.status_code == 201, made.text
            held = asyncio.ensure_future(bob.post("/execute", json={"code": "'HOLD'"}))
            for _ in range(500):  # until Bob's call is held
                if (await judge.get("/v1/approvals")).json()["approvals"]:
                    break
                await asyncio.sleep(0.01)
            counts = {}
            for name, client in (("alice", alice), ("bob", bob), ("judge", judge), ("key", key)):
                body = (await client.get("/v1/health")).json()
                counts[name] = (body["scope"], body["sandboxes"], body["runs"])
            assert counts == {
                "alice": ("tenant", 1, 0),
                "bob": ("tenant", 0, 1),
                "judge": ("service", 1, 1),
                "key": ("service", 1, 1),
            }
            for approval in (await judge.get("/v1/approvals")).json()["approvals"]:
                await judge.post(f"/v1/approvals/{approval['id']}", json={"decision": "deny"})
            assert (await held).status_code == 403
            after = (await bob.get("/v1/health")).json()
            assert (after["sandboxes"], after["runs"]) == (0, 0)
    finally:
        await svc.stop()


async def test_without_tokens_health_counts_the_anonymous_callers_own(docker: FakeDocker) -> None:
    """No tokens: the one anonymous tenant sees its own counts, with scope tenant."""
    config = parse_config(
        {"security": {"sandbox": {"pool": {"size": 0}}, "hitl": {"enabled": False}}}
    )
    svc = Service(config, docker_manager=docker, environ={}, approval_key=KEY)
    await svc.start()
    try:
        async with clients(create_app(service=svc))() as anonymous:
            assert (await anonymous.post("/v1/sandboxes", json={})).status_code == 201
            body = (await anonymous.get("/v1/health")).json()
        assert (body["status"], body["scope"], body["sandboxes"], body["runs"]) == (
            "ok", "tenant", 1, 0,
        )  # fmt: skip
    finally:
        await svc.stop()

"""Adversarial probes of ``harombe serve`` over FakeDocker (no Docker): auth and tenancy,
limits, the fips contract's odd inputs, approvals, and the service's lifecycle.

Failing tests here are defects; the passing ones guard the service's key claims."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from harombe.config import parse_config
from harombe.errors import ConfigError
from harombe.service.app import create_app
from harombe.service.approvals_routes import CSP
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.echo import RunOutcome, code_of, echo_handler
from harombe.testing.http import clients, serving

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
KEY = "approval-key-0123456789abcdef"
STRANGER = "not-a-token-0123456789"
JSON = {"content-type": "application/json"}
#: Code containing this marker is held for approval (CRITICAL, 5 s).
HOLD = {"tools": ["code_execute"], "risk": "critical", "timeout": 5,
        "conditions": [{"param": "code", "matches": "HOLD"}]}  # fmt: skip


def config(*, tokens: bool = True, hitl: bool = False, **alice: Any) -> Any:
    """A service config: alice (limits from ``alice``), bob, and the approver judge."""
    entries = [{"name": "alice", "token": ALICE, **alice}, {"name": "bob", "token": BOB},
               {"name": "judge", "token": JUDGE, "role": "approver"}]  # fmt: skip
    return parse_config({
        # With the gate on, every call that needs approval is held (no automatic level).
        "security": {"sandbox": {"pool": {"size": 1}},
                     "hitl": {"enabled": hitl, "auto_approve_up_to": "none", "rules": [HOLD]}},
        "service": {"tokens": entries if tokens else [], "max_request_bytes": 65536},
    })  # fmt: skip


def handler(docker: FakeDocker) -> Any:
    """The echo handler, plus: ``DIE`` kills every running container (the sandbox is lost),
    ``HANG`` waits 20 s, ``BYTES`` prints 30000 bytes that are not UTF-8."""

    async def run(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        code = code_of(msg, stdin)
        if "DIE" in code:
            for box in list(docker.containers.values()):
                if box.status == "running":
                    docker.kill(box.id)
            await asyncio.sleep(5)
        if "HANG" in code:
            await asyncio.sleep(20)
        if "BYTES" in code:
            return RunOutcome(stdout=b"\xff" * 30000)
        return echo_handler(msg, stdin)

    return run


@pytest.fixture
async def docker() -> AsyncIterator[FakeDocker]:
    """A started FakeDocker with the probes' handler; its guests are stopped afterwards."""
    fake = FakeDocker()
    fake.handler = handler(fake)
    await fake.start()
    yield fake
    for container in fake.containers.values():
        container.guest.stop()


@pytest.fixture
async def make(docker: FakeDocker) -> AsyncIterator[Any]:
    """Start a service over FakeDocker; yields a factory of (service, client for a token).
    Server errors come back as 500 answers, as uvicorn would send them."""
    started: list[Service] = []

    async def build(cfg: Any, peer: str = "127.0.0.1") -> tuple[Service, Any]:
        svc = Service(cfg, docker_manager=docker, environ={}, approval_key=KEY)
        await svc.start()
        started.append(svc)
        app = create_app(service=svc)
        return svc, clients(app, peer=peer, raise_app_exceptions=False)

    yield build
    for svc in started:
        await svc.stop()


async def _held(client: httpx.AsyncClient, count: int = 1) -> list[dict[str, Any]]:
    """The held approvals ``client`` sees, once there are ``count`` of them (or after ~3 s)."""
    held: list[dict[str, Any]] = []
    for _ in range(300):
        held = (await client.get("/v1/approvals")).json()["approvals"]
        if len(held) >= count:
            return held
        await asyncio.sleep(0.01)
    return held


async def _approved(judge: httpx.AsyncClient, call: Any, decision: str = "approve") -> Any:
    """Run ``call`` (a request coroutine), deciding its held approval with ``decision``."""
    task = asyncio.ensure_future(call)
    held = await _held(judge)
    assert held, "nothing was held for approval"
    await judge.post(f"/v1/approvals/{held[0]['id']}", json={"decision": decision})
    return await task


# ---- the fips contract: never a 500, the sidecar's shapes ----------------------------------


@pytest.mark.parametrize(
    "body",
    [b'{"code": "print(1)", "timeout": NaN}', b'{"code": "print(1)", "timeout": 1e400}',
     b'{"code": "print(1)", "timeout": "\\ud800"}'],
    ids=["timeout-nan", "timeout-overflows-to-infinity", "timeout-lone-surrogate"],
)  # fmt: skip
async def test_fips_bad_timeouts_are_422_never_500(make: Any, body: bytes) -> None:
    """A bad timeout is 422 whatever its JSON spelling; echoing it back must not crash."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        response = await c.post("/execute", content=body, headers=JSON)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    ("body", "status"),
    [({"code": "print(1)", "timeout": "5"}, 200), ({"code": "print(1)", "timeout": True}, 200),
     ({"code": "print(1)", "timeout": 30}, 200), ({"code": "print(1)", "timeout": 30.001}, 422),
     ({"code": 5}, 422), ([{"code": "print(1)"}], 422), ({"code": "  \n"}, 400),
     ({"code": "print(1)", "extra": [1, 2]}, 200)],
    ids=["timeout-string", "timeout-bool", "timeout-30", "timeout-over-30", "code-number",
         "json-array", "blank-code", "extra-field"],
)  # fmt: skip
async def test_fips_odd_inputs_answer_the_sidecars_status(
    make: Any, body: Any, status: int
) -> None:
    """Odd /execute bodies answer what the sidecar's own model answers."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        assert (await c.post("/execute", json=body)).status_code == status


async def test_fips_request_cannot_choose_a_looser_profile(make: Any) -> None:
    """With the operator's profile `minimal`, a caller naming `data-science` is still held to
    `minimal` (the sidecar ignores unknown fields): numpy is refused."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        response = await c.post(
            "/execute", json={"code": "import numpy\nprint(1)", "profile": "data-science"}
        )
    assert response.status_code == 400, response.text


async def test_fips_lost_sandbox_says_why(make: Any) -> None:
    """A run whose sandbox dies answers the killed exit code and says why in stderr."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        body = (await c.post("/execute", json={"code": "print('DIE')"})).json()
    assert body["exit_code"] == -9 and "lost" in body["stderr"], body


async def test_fips_cut_counts_the_raw_bytes(make: Any) -> None:
    """30000 bytes of output are under 50 KB: not cut, as the sidecar cuts raw bytes."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        body = (await c.post("/execute", json={"code": "print('BYTES')"})).json()
    assert "[output truncated at 50 KB]" not in body["stdout"]


# ---- /v1: every error is {kind, message} ----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "content"),
    [("GET", "/v1/no-such-route", None), ("DELETE", "/v1/health", None),
     ("POST", "/v1/sandboxes", b"[" * 3000 + b"]" * 3000),
     ("POST", "/v1/sandboxes", b'{"language": ' + b"9" * 5000 + b"}")],
    ids=["unknown-route", "wrong-method", "deeply-nested-json", "huge-integer"],
)  # fmt: skip
async def test_v1_errors_have_a_kind_and_a_message(
    make: Any, method: str, path: str, content: bytes | None
) -> None:
    """Every /v1 error answer is JSON with `kind` and `message`, never FastAPI's `detail`."""
    _, http = await make(config())
    async with http(BOB) as c:
        response = await c.request(method, path, content=content, headers=JSON)
    assert response.status_code < 500
    assert {"kind", "message"} <= set(response.json()), response.text


# ---- auth and tenancy ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["attacker.example:8000", "rebound.attacker.example"], ids=["port", "bare"]
)
async def test_anonymous_service_refuses_foreign_host_names(make: Any, host: str) -> None:
    """Without tokens, a request naming a foreign Host (a DNS-rebinding page in a browser on
    this machine) is refused: loopback-only must mean this machine's callers only."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        response = await c.post("/execute", json={"code": "print(1)"}, headers={"host": host})
    assert response.status_code in (400, 403, 421), response.text


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000"],
                         ids=["ipv4", "localhost", "ipv6"])  # fmt: skip
async def test_anonymous_service_answers_loopback_host_names(make: Any, host: str) -> None:
    """Without tokens, a loopback caller naming a loopback Host runs code."""
    _, http = await make(config(tokens=False))
    async with http() as c:
        response = await c.post("/execute", json={"code": "print(1)"}, headers={"host": host})
    assert response.status_code == 200


@pytest.mark.parametrize("peer", ["10.0.0.7", "::ffff:127.0.0.1", "192.168.1.2"],
                         ids=["private", "v4-mapped-loopback", "lan"])  # fmt: skip
async def test_anonymous_service_refuses_other_peers(make: Any, peer: str) -> None:
    """Without tokens, any peer that is not plainly loopback is refused (fails closed)."""
    _, http = await make(config(tokens=False), peer=peer)
    async with http() as c:
        assert (await c.post("/execute", json={"code": "print(1)"})).status_code == 403


@pytest.mark.parametrize(
    "token",
    ["tökén-0123456789abcdef", "token-0123456789abcdef ", "\ttoken-0123456789abcdef"],
    ids=["non-ascii", "trailing-space", "leading-tab"],
)
async def test_a_configured_token_can_authenticate(make: Any, token: str) -> None:
    """A token the config accepts works as a bearer token; else the config refuses it."""
    try:
        cfg = parse_config({"service": {"tokens": [{"name": "odd", "token": token}]},
                            "security": {"sandbox": {"pool": {"size": 1}}}})  # fmt: skip
    except (ValidationError, ConfigError):
        return
    _, http = await make(cfg)
    async with http() as c:
        header = {"Authorization": b"Bearer " + token.encode()}
        response = await c.get("/v1/sandboxes", headers=header)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/sandboxes", {"language": 7}), ("/execute", {"timeout": "x"}),
     ("/v1/approvals/abc", {"decision": "maybe"})],
    ids=["v1-create", "fips-execute", "decide"],
)  # fmt: skip
async def test_strangers_are_refused_before_their_body_is_judged(
    make: Any, path: str, body: dict[str, Any]
) -> None:
    """Without a token, a bad body is 401 (not a validation answer about the body)."""
    _, http = await make(config())
    async with http() as c:
        assert (await c.post(path, json=body)).status_code == 401


async def _sandbox_of(http: Any, token: str) -> str:
    async with http(token) as c:
        made = await c.post("/v1/sandboxes", json={})
    assert made.status_code == 201, made.text
    return str(made.json()["sandbox_id"])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "", None), ("DELETE", "", None), ("POST", "/execute", {"code": "print(1)"}),
     ("POST", "/execute/stream", {"code": "print(1)"}), ("POST", "/packages", {"package": "six"}),
     ("GET", "/files", None), ("POST", "/files", {"path": "a.txt", "content": "x"}),
     ("PUT", "/files/a.txt", None), ("GET", "/files/a.txt", None)],
    ids=["get", "delete", "execute", "stream", "install", "list", "write", "upload", "download"],
)  # fmt: skip
async def test_another_tenants_sandbox_is_404_on_every_route(
    make: Any, method: str, path: str, body: Any
) -> None:
    """Bob gets 404 for Alice's sandbox on every route, and nothing reaches it."""
    svc, http = await make(config())
    sid = await _sandbox_of(http, ALICE)
    async with http(BOB) as bob:
        response = await bob.request(method, f"/v1/sandboxes/{sid}{path}", json=body)
    assert response.status_code == 404 and sid in svc.manager.sandboxes


async def test_ownership_follows_a_lost_sandboxs_replacement(make: Any) -> None:
    """A sandbox lost under a run is replaced; the replacement is Alice's, and 404 to Bob."""
    _, http = await make(config())
    sid = await _sandbox_of(http, ALICE)
    async with http(ALICE) as alice, http(BOB) as bob:
        lost = (await alice.post(f"/v1/sandboxes/{sid}/execute", json={"code": "'DIE'"})).json()
        new = lost["sandbox_id"]
        assert lost["status"] == "lost" and new != sid
        assert (await alice.get(f"/v1/sandboxes/{new}")).status_code == 200
        assert (await bob.get(f"/v1/sandboxes/{new}")).status_code == 404


# ---- limits -------------------------------------------------------------------------------


async def test_parallel_creates_never_pass_max_sandboxes(make: Any) -> None:
    """Six creates at once with max_sandboxes 2: two 201, four 429."""
    _, http = await make(config(max_sandboxes=2))
    async with http(ALICE) as c:
        answers = await asyncio.gather(*[c.post("/v1/sandboxes", json={}) for _ in range(6)])
    assert sorted(a.status_code for a in answers) == [201, 201, 429, 429, 429, 429]


async def test_a_lost_sandbox_stops_counting_against_the_limit(
    make: Any, docker: FakeDocker
) -> None:
    """Alice (max 1) whose sandbox died can create another at once, without first listing."""
    svc, http = await make(config(max_sandboxes=1))
    sid = await _sandbox_of(http, ALICE)
    docker.kill(svc.manager.sandboxes[sid].container_id)
    async with http(ALICE) as alice:
        gone = await alice.get(f"/v1/sandboxes/{sid}/files")
        assert gone.status_code in (404, 503)
        again = await alice.post("/v1/sandboxes", json={})
    assert again.status_code == 201, again.text


async def test_held_file_calls_count_against_concurrent_runs(make: Any) -> None:
    """Alice (max_concurrent_runs 1) cannot park five file calls in the approval queue."""
    _, http = await make(config(hitl=True, max_concurrent_runs=1))
    async with http(ALICE) as alice, http(JUDGE) as judge:
        sid = (await _approved(judge, alice.post("/v1/sandboxes", json={}))).json()["sandbox_id"]
        calls = [asyncio.ensure_future(alice.get(f"/v1/sandboxes/{sid}/files")) for _ in range(5)]
        held = await _held(judge, count=5)
        for item in held:
            await judge.post(f"/v1/approvals/{item['id']}", json={"decision": "deny"})
        await asyncio.gather(*calls)
    assert len(held) <= 1, f"{len(held)} file calls of one tenant were held at once"


async def test_chunked_upload_past_the_limit_is_413(make: Any) -> None:
    """A chunked upload larger than max_request_bytes is 413 and nothing is written."""
    _, http = await make(config())
    sid = await _sandbox_of(http, ALICE)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b"x" * 1024

    async with http(ALICE) as alice:
        response = await alice.put(f"/v1/sandboxes/{sid}/files/big.bin", content=chunks())
        listed = (await alice.get(f"/v1/sandboxes/{sid}/files")).json()
    assert response.status_code == 413 and "big.bin" not in listed["files"]


# ---- approvals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "method", "path", "status"),
    [(ALICE, "POST", "/v1/approvals/{id}", 403), (ALICE, "GET", "/v1/approvals/events", 403),
     (BOB, "GET", "/v1/approvals/{id}", 404), (JUDGE, "POST", "/v1/sandboxes", 403),
     (JUDGE, "POST", "/execute", 403), (STRANGER, "POST", "/v1/approvals/{id}", 401)],
    ids=["client-decides", "client-follows-feed", "other-tenant-reads", "approver-creates",
         "approver-runs-fips", "unknown-token-decides"],
)  # fmt: skip
async def test_roles_and_tenants_around_a_held_call(
    make: Any, token: str, method: str, path: str, status: int
) -> None:
    """Alice's held call cannot be decided by a client, read by Bob, and an approver's token
    runs nothing."""
    _, http = await make(config(hitl=True))
    async with http(ALICE) as alice, http(token) as caller:
        call = asyncio.ensure_future(alice.post("/v1/sandboxes", json={}))
        (held,) = await _held(alice)
        bodies = {"/v1/approvals/{id}": {"decision": "approve"}, "/v1/sandboxes": {},
                  "/execute": {"code": "print(1)"}}  # fmt: skip
        body = bodies.get(path) if method == "POST" else None
        response = await caller.request(method, path.format(id=held["id"]), json=body)
        call.cancel()
    assert response.status_code == status, response.text


async def test_a_held_call_is_decided_once(make: Any) -> None:
    """The first decision wins; a second one is 404 and changes nothing."""
    _, http = await make(config(hitl=True))
    async with http(ALICE) as alice, http(JUDGE) as judge:
        call = asyncio.ensure_future(alice.post("/v1/sandboxes", json={}))
        (held,) = await _held(judge)
        first = await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
        second = await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
        answer = await call
    assert (first.status_code, second.status_code, answer.status_code) == (200, 404, 403)


async def test_a_streamed_calls_approval_names_its_tenant(make: Any) -> None:
    """A call held from the SSE route is listed to its owner, with its tenant's name."""
    _, http = await make(config(hitl=True))
    async with http(ALICE) as alice, http(JUDGE) as judge:
        sid = (await _approved(judge, alice.post("/v1/sandboxes", json={}))).json()["sandbox_id"]
        stream = alice.post(f"/v1/sandboxes/{sid}/execute/stream", json={"code": "'HOLD'"})
        task = asyncio.ensure_future(stream)
        (held,) = await _held(judge)
        mine = await alice.get("/v1/approvals")
        await judge.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
        assert "event: result" in (await task).text
    assert held["tenant"] == "alice" and [a["id"] for a in mine.json()["approvals"]] == [held["id"]]


async def test_fips_sandbox_grants_die_with_the_sandbox(make: Any) -> None:
    """ "Approve for this sandbox" on a fips call leaves no grant once its sandbox is removed."""
    svc, http = await make(config(tokens=False, hitl=True))
    async with http() as c, http(KEY) as page:
        ran = await _approved(page, c.post("/execute", json={"code": "'HOLD'"}), "approve_sandbox")
    assert ran.status_code == 200
    await asyncio.gather(*svc._removals)
    used = [e["sandbox_id"] for e in svc.feed.recent if e.get("type") == "tool.called"]
    assert used and used[-1] not in svc.manager.sandboxes
    assert svc.gate is not None and svc.gate.grants(used[-1]) == frozenset()


def test_the_page_never_parses_served_text_as_html() -> None:
    """The approvals page builds nodes from text only (no innerHTML, no document.write)."""
    html = resources.files("harombe.service").joinpath("static/approvals.html").read_text()
    script = html[html.index("<script") :]
    assert not re.search(
        r"\.(innerHTML|outerHTML)\b|insertAdjacentHTML|document\.write|\beval\(", script
    )


def test_the_pages_csp_allows_no_inline_script() -> None:
    """The page's CSP runs only its own script (a hash or nonce), never any inline script."""
    script_src = next(p for p in CSP.split(";") if p.strip().startswith("script-src"))
    assert "'unsafe-inline'" not in script_src


# ---- lifecycle ----------------------------------------------------------------------------


async def test_shutdown_ends_open_feed_streams(docker: FakeDocker) -> None:
    """Stopping a served service with the approvals feed open still finishes, and removes
    every sandbox (the feed must not hold the graceful shutdown forever)."""
    svc = Service(config(), docker_manager=docker, environ={}, approval_key=KEY)
    server = serving(create_app(service=svc))
    base_url = await server.__aenter__()
    judge = httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {JUDGE}"}, timeout=60
    )
    alice = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {ALICE}"})
    assert (await alice.post("/v1/sandboxes", json={})).status_code == 201
    opened = asyncio.Event()

    async def follow() -> None:
        async with judge.stream("GET", "/v1/approvals/events") as events:
            opened.set()
            async for _ in events.aiter_lines():
                pass

    reader = asyncio.ensure_future(follow())
    await asyncio.wait_for(opened.wait(), 10)
    stopping = asyncio.ensure_future(server.__aexit__(None, None, None))
    done, _ = await asyncio.wait({stopping}, timeout=10)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    if not done:  # unstick it for the next test: the reader has gone now
        await asyncio.wait_for(stopping, 10)
    await alice.aclose()
    await judge.aclose()
    assert done and docker.containers == {}, "shutdown waited on the open feed"


async def test_closing_a_stream_cancels_its_run_and_frees_the_slot(
    docker: FakeDocker,
) -> None:
    """A client that drops an SSE run gets its run cancelled and its slot back."""
    svc = Service(config(max_concurrent_runs=1), docker_manager=docker, environ={})
    async with serving(create_app(service=svc)) as base_url:
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
            sid = (await c.post("/v1/sandboxes", json={})).json()["sandbox_id"]
            async with c.stream("POST", f"/v1/sandboxes/{sid}/execute/stream",
                                json={"code": "'HANG'", "timeout": 60}) as events:  # fmt: skip
                assert events.status_code == 200
        tenant = svc.tokens.lookup(ALICE)
        assert tenant is not None
        for _ in range(300):
            if tenant.running == 0:
                break
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
            again = await c.post(f"/v1/sandboxes/{sid}/execute", json={"code": "print(1)"})
    assert again.status_code == 200, again.text

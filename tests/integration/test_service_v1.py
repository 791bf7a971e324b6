"""The ``/v1`` REST API against a live service on real gVisor: sandboxes, execute (JSON and
server-sent events), files (text and binary), tenancy, limits and errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.security.runtime.docker import DockerManager
from harombe.service.state import Service
from tests.integration.service_support import client, live_service, service_config

ALICE, BOB, JUDGE = "alice-token-0123456789", "bob-token-0123456789ab", "judge-token-0123456789"
TOKENS = [
    {"name": "alice", "token": ALICE, "max_sandboxes": 2, "max_concurrent_runs": 1},
    {"name": "bob", "token": BOB},
    {"name": "judge", "token": JUDGE, "role": "approver"},
]


@pytest.fixture(scope="module")
async def api(docker_manager: DockerManager) -> AsyncIterator[tuple[Service, str]]:
    config = service_config({"service": {"tokens": TOKENS, "max_request_bytes": 2_000_000}})
    async with live_service(docker_manager, config) as running:
        yield running


async def create(base_url: str, token: str, **body: Any) -> dict[str, Any]:
    async with client(base_url, token) as http:
        response = await http.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_sandbox_lifecycle(api: tuple[Service, str]) -> None:
    """Create, list, get, execute in, and delete a sandbox; then it is 404."""
    base = api[1]
    made = await create(base, BOB)
    sid = made["sandbox_id"]
    assert made["language"] == "python" and made["network_enabled"] is False
    async with client(base, BOB) as http:
        listed = (await http.get("/v1/sandboxes")).json()["sandboxes"]
        assert sid in [s["sandbox_id"] for s in listed]
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["sandbox_id"] == sid
        run = await http.post(f"/v1/sandboxes/{sid}/execute", json={"code": "x = 6\nx * 7"})
        assert run.status_code == 200 and run.json()["result"] == "42"
        again = await http.post(f"/v1/sandboxes/{sid}/execute", json={"code": "x + 1"})
        assert again.json()["result"] == "7"
        assert (await http.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        gone = await http.get(f"/v1/sandboxes/{sid}")
        assert gone.status_code == 404 and gone.json()["kind"] == "SandboxNotFoundError"


async def test_failed_code_is_200_with_the_result(api: tuple[Service, str]) -> None:
    """Code that raises answers 200 with success false and its traceback."""
    sid = (await create(api[1], BOB))["sandbox_id"]
    async with client(api[1], BOB) as http:
        run = await http.post(f"/v1/sandboxes/{sid}/execute", json={"code": "1/0"})
        await http.delete(f"/v1/sandboxes/{sid}")
    body = run.json()
    assert run.status_code == 200 and body["success"] is False
    assert "ZeroDivisionError" in body["stderr"]


async def test_execute_streams_server_sent_events(api: tuple[Service, str]) -> None:
    """The stream route sends stdout events as the code prints, then one result event."""
    sid = (await create(api[1], BOB))["sandbox_id"]
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)"
    events: list[tuple[str, dict[str, Any]]] = []
    async with client(api[1], BOB) as http:
        url = f"/v1/sandboxes/{sid}/execute/stream"
        async with http.stream("POST", url, json={"code": code}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kind = None
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind:
                    events.append((kind, json.loads(line[6:])))
        await http.delete(f"/v1/sandboxes/{sid}")
    printed = "".join(e["text"] for k, e in events if k == "stdout")
    assert printed == "0\n1\n2\n"
    assert events[-1][0] == "result" and events[-1][1]["success"] is True


async def test_files_text_and_binary(api: tuple[Service, str]) -> None:
    """Text written as JSON and bytes uploaded raw come back byte for byte; listings show both."""
    sid = (await create(api[1], BOB))["sandbox_id"]
    blob = bytes(range(256)) * 40
    async with client(api[1], BOB) as http:
        wrote = await http.post(f"/v1/sandboxes/{sid}/files",
                                json={"path": "notes/a.txt", "content": "héllo"})  # fmt: skip
        assert wrote.status_code == 200 and wrote.json()["success"] is True
        up = await http.put(f"/v1/sandboxes/{sid}/files/data/blob.bin", content=blob)
        assert up.status_code == 200 and up.json()["written_bytes"] == len(blob)
        down = await http.get(f"/v1/sandboxes/{sid}/files/data/blob.bin")
        assert down.status_code == 200 and down.content == blob
        text = await http.get(f"/v1/sandboxes/{sid}/files/notes/a.txt")
        assert text.content == "héllo".encode()
        listing = (await http.get(f"/v1/sandboxes/{sid}/files", params={"path": "."})).json()
        assert {"notes", "data"} <= set(listing["files"])
        seen = await http.post(f"/v1/sandboxes/{sid}/execute",
                               json={"code": "len(open('data/blob.bin','rb').read())"})  # fmt: skip
        assert seen.json()["result"] == str(len(blob))
        escape = await http.get(f"/v1/sandboxes/{sid}/files/..%2F..%2Fetc%2Fpasswd")
        assert escape.status_code == 403 and escape.json()["kind"] == "WorkspacePathError"
        missing = await http.get(f"/v1/sandboxes/{sid}/files/nope.txt")
        assert missing.status_code == 400 and missing.json()["kind"] == "FileError"
        await http.delete(f"/v1/sandboxes/{sid}")


async def test_bodies_over_the_limit_are_413(api: tuple[Service, str]) -> None:
    """An upload past service.max_request_bytes is refused with 413, declared or chunked."""
    sid = (await create(api[1], BOB))["sandbox_id"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 100_000

    async with client(api[1], BOB) as http:
        url = f"/v1/sandboxes/{sid}/files/big.bin"
        declared = await http.put(url, content=b"x" * 3_000_000)
        chunked = await http.put(url, content=chunks())
        await http.delete(f"/v1/sandboxes/{sid}")
    assert declared.status_code == 413 and declared.json()["kind"] == "RequestTooLarge"
    assert chunked.status_code == 413


async def test_another_tenants_sandbox_is_404(api: tuple[Service, str]) -> None:
    """Bob cannot see, run in, read from or delete Alice's sandbox: 404 as if it did not exist."""
    sid = (await create(api[1], ALICE))["sandbox_id"]
    async with client(api[1], BOB) as http:
        answers = [
            await http.get(f"/v1/sandboxes/{sid}"),
            await http.post(f"/v1/sandboxes/{sid}/execute", json={"code": "print(1)"}),
            await http.get(f"/v1/sandboxes/{sid}/files/x"),
            await http.delete(f"/v1/sandboxes/{sid}"),
        ]
        listed = (await http.get("/v1/sandboxes")).json()["sandboxes"]
    assert [a.status_code for a in answers] == [404, 404, 404, 404]
    assert sid not in [s["sandbox_id"] for s in listed]
    async with client(api[1], ALICE) as http:
        assert (await http.delete(f"/v1/sandboxes/{sid}")).status_code == 204


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("Bearer wrong-token-0000000000", 401),
        ("Basic YTpi", 401),
        (f"Bearer {JUDGE}", 403),
    ],
    ids=["none", "unknown-token", "not-bearer", "approver-token-runs-nothing"],
)
async def test_callers_without_a_client_token_are_refused(
    api: tuple[Service, str], header: str | None, status: int
) -> None:
    """No token, an unknown one or an approver's cannot use the API."""
    headers = {"Authorization": header} if header else {}
    async with client(api[1]) as http:
        response = await http.get("/v1/sandboxes", headers=headers)
    assert response.status_code == status
    assert response.json()["kind"] in ("Unauthorized", "Forbidden")
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


async def test_limits_answer_429_with_retry_after(api: tuple[Service, str]) -> None:
    """Past max_sandboxes (2) or max_concurrent_runs (1), Alice gets 429 with Retry-After."""
    first = (await create(api[1], ALICE))["sandbox_id"]
    second = (await create(api[1], ALICE))["sandbox_id"]
    async with client(api[1], ALICE) as http:
        third = await http.post("/v1/sandboxes", json={})
        assert third.status_code == 429 and third.headers["retry-after"] == "5"
        nap = {"code": "import time; time.sleep(2)"}
        slow = asyncio.ensure_future(http.post(f"/v1/sandboxes/{first}/execute", json=nap))
        await asyncio.sleep(0.8)
        busy = await http.post(f"/v1/sandboxes/{second}/execute", json={"code": "print(1)"})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert (await slow).status_code == 200
        for sid in (first, second):
            await http.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("post", "/v1/sandboxes", {"language": "cobol"}),
        ("post", "/v1/sandboxes", {"surprise": 1}),
        ("post", "/v1/sandboxes", {"profile": "minimal", "language": "shell"}),
        ("post", "/v1/sandboxes/{sid}/execute", {"code": 5}),
        ("post", "/v1/sandboxes/{sid}/execute", {"code": "1", "timeout": -1}),
        ("post", "/v1/sandboxes/{sid}/packages", {"package": "x; rm -rf /"}),
        ("post", "/v1/sandboxes/{sid}/files", {"path": "/etc/passwd", "content": "x"}),
    ],
    ids=[
        "bad-language",
        "unknown-field",
        "profile-on-shell",
        "code-not-text",
        "negative-timeout",
        "package-injection",
        "write-outside-workspace",
    ],
)
async def test_bad_requests_are_4xx_with_a_kind_and_fix(
    api: tuple[Service, str], method: str, url: str, body: dict[str, Any]
) -> None:
    """What a client sends wrong answers 4xx with {"kind", "message"}, never 500."""
    sid = (await create(api[1], BOB))["sandbox_id"]
    async with client(api[1], BOB) as http:
        response = await getattr(http, method)(url.format(sid=sid), json=body)
        await http.delete(f"/v1/sandboxes/{sid}")
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()) == {"kind", "message"} and response.json()["message"]


async def test_health_and_version(api: tuple[Service, str]) -> None:
    """Health says ok with the sandbox count; version names harombe, the runtime and image."""
    async with client(api[1], BOB) as http:
        health = (await http.get("/v1/health")).json()
        version = (await http.get("/v1/version")).json()
    assert health["status"] == "ok" and health["profile"] == "minimal"
    assert version["runtime"] == "runsc" and version["api"] == "v1"


async def test_execute_takes_output_mode(api: tuple[Service, str]) -> None:
    """output_mode 'llm' answers head, marker and tail with the saved file in output_files;
    a value that is not a mode is 422."""
    sid = (await create(api[1], BOB))["sandbox_id"]
    code = "for i in range(20000):\n    print('line', i)"
    async with client(api[1], BOB) as http:
        run = await http.post(
            f"/v1/sandboxes/{sid}/execute", json={"code": code, "output_mode": "llm"}
        )
        body = run.json()
        assert run.status_code == 200 and body["stdout"].startswith("line 0\n")
        assert body["stdout"].endswith("line 19999\n") and "cut here" in body["stdout"]
        saved = body["output_files"]["stdout"]
        full = await http.get(f"/v1/sandboxes/{sid}/files/{saved}")
        assert full.status_code == 200 and full.content.count(b"\n") == 20000
        bad = await http.post(
            f"/v1/sandboxes/{sid}/execute", json={"code": "1", "output_mode": "LLM"}
        )
        assert bad.status_code == 422
        await http.delete(f"/v1/sandboxes/{sid}")

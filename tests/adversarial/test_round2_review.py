"""Second review round of ``harombe serve`` and the profiles' runtime layer, without Docker:
the gatekeeper (Host names, public paths, requests a web page can send), the graceful
shutdown, the audit hook's path judge, the layer's start and its check after each call, and
the scan budget on an ordinary program.

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harombe.profile_files import read_profile_documents
from harombe.security.guest import load
from harombe.security.policy.guardrails import run_stages
from harombe.security.policy.profiles import resolve_profiles
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing import FakeDocker
from tests.adversarial.test_service_review import ALICE, JUDGE, KEY, _approved, config, handler
from tests.unit.test_profile_layer import BOOT, LAYER_PARTS, SPEC, run_cells

PROFILES = resolve_profiles(read_profile_documents(None))
HOOK = load(("wire.py", "profile_hook.py"), "harombe-worker")


@pytest.fixture
async def docker() -> AsyncIterator[FakeDocker]:
    fake = FakeDocker()
    fake.handler = handler(fake)
    await fake.start()
    yield fake
    for container in fake.containers.values():
        container.guest.stop()


@pytest.fixture
async def service(docker: FakeDocker) -> AsyncIterator[Any]:
    """A factory of started services over FakeDocker, stopped afterwards."""
    made: list[Service] = []

    async def build(cfg: Any) -> Service:
        svc = Service(cfg, docker_manager=docker, environ={}, approval_key=KEY)
        await svc.start()
        made.append(svc)
        return svc

    yield build
    for svc in made:
        await svc.stop()


async def asgi(app: Any, path: str, *, method: str = "GET", headers: Any = (),
               body: bytes = b"", peer: str = "127.0.0.1") -> tuple[int, bytes]:  # fmt: skip
    """One raw HTTP request straight into the app (no client normalises the path or the
    headers): its status and body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": (peer, 50000), "server": ("127.0.0.1", 8000),
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


# ---- the gatekeeper: what a web page in a browser on this machine can send ------------------

#: What a page on any web site can send to 127.0.0.1 without a CORS preflight: a "simple"
#: POST with no Content-Type (``body: new Blob([json])``) or a text/plain one, and a form.
CROSS_SITE = [("host", "127.0.0.1:8000"), ("origin", "http://attacker.example"),
              ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")]  # fmt: skip


@pytest.mark.parametrize("path", ["/execute", "/v1/sandboxes"], ids=["fips-execute", "v1-create"])
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"],
    ids=["none", "text-plain", "form", "multipart"],
)  # fmt: skip
async def test_a_cross_site_page_cannot_drive_an_anonymous_service(
    service: Any, path: str, content_type: str | None
) -> None:
    """Without tokens, a web page on another origin posting JSON as a simple request (which
    the browser sends without asking, with a loopback Host) runs nothing and makes nothing."""
    svc = await service(config(tokens=False))
    app = create_app(service=svc)
    headers = CROSS_SITE + ([("content-type", content_type)] if content_type else [])
    status, body = await asgi(app, path, method="POST", headers=headers,
                              body=b'{"code": "print(6*7)"}')  # fmt: skip
    assert status >= 400 and svc.manager.sandboxes == {}, (status, body)


@pytest.mark.parametrize(
    "host",
    ["LOCALHOST:8000", "Localhost", "localhost.:8000"],
    ids=["upper-case", "mixed-case", "trailing-dot"],
)
async def test_loopback_host_names_are_read_as_dns_reads_them(service: Any, host: str) -> None:
    """A host name is case-insensitive and may end in a dot: these name loopback too."""
    app = create_app(service=await service(config(tokens=False)))
    status, body = await asgi(app, "/profile", headers=[("host", host)])
    assert status == 200, (status, body)


@pytest.mark.parametrize(
    "headers",
    [[], [("host", "")], [("host", "127.0.0.1.attacker.example")],
     [("host", "localhost.attacker.example:8000")], [("host", "127.0.0.1:8000:80")],
     [("host", "[::1].attacker.example")], [("host", "0x7f000001")], [("host", "127.1")],
     [("host", "[::ffff:7f00:1]")], [("host", "127.0.0.1 attacker.example")]],
    ids=["missing-http10", "empty", "suffix", "localhost-suffix", "two-ports", "bracket-suffix",
         "hex", "short-form", "v4-mapped", "space"],
)  # fmt: skip
async def test_odd_host_headers_fail_closed(service: Any, headers: list[tuple[str, str]]) -> None:
    """Host forms that are not plainly a loopback name are refused without tokens."""
    app = create_app(service=await service(config(tokens=False)))
    status, _ = await asgi(app, "/profile", headers=headers)
    assert status == 403


@pytest.mark.parametrize(
    "path",
    ["/healthz/", "//v1/sandboxes", "/v1/../v1/sandboxes", "/v1/./sandboxes", "/v1//sandboxes",
     "/approvals/app.js/../../v1/sandboxes", "/profile", "/profile/", "/v1/health", "/docs/",
     "/openapi.json/", "/approvals/", "/approvals/app.js/x", "/HEALTHZ", "/v1/approvals/events"],
)  # fmt: skip
async def test_no_path_spelling_reaches_a_private_route_without_a_token(
    service: Any, path: str
) -> None:
    """With tokens configured, only the exact public paths answer a stranger; every other
    spelling (slashes, dots, case) is 401, so no private route is reached through them."""
    app = create_app(service=await service(config()))
    status, body = await asgi(app, path, headers=[("host", "127.0.0.1")])
    assert status == 401, (status, body[:200])


# ---- the graceful shutdown ---------------------------------------------------------------


async def test_a_call_reaching_the_gate_after_shutdown_began_is_not_held(service: Any) -> None:
    """A call already past the gatekeeper when the shutdown begins (scanning, claiming a
    sandbox) and held afterwards is denied at once: no held call waits for a person after
    the approvals were denied, holding the shutdown for its rule's timeout."""
    svc = await service(config(hitl=True))
    svc.begin_shutdown()
    call = asyncio.ensure_future(svc.tools.code_execute(language="python", code="'HOLD'"))
    held: list[dict[str, Any]] = []
    for _ in range(100):
        held = svc.broker.pending()
        if held or call.done():
            break
        await asyncio.sleep(0.02)
    result = await call  # the rule denies it after 5 s anyway
    assert held == [] and not result.get("success"), held


async def test_a_feed_followed_after_shutdown_began_ends(service: Any) -> None:
    """Following the approvals feed after it was closed ends at once (a late SSE request
    must not hold the graceful shutdown until the grace period runs out)."""
    svc = await service(config())
    svc.begin_shutdown()

    async def drain() -> int:
        return len([event async for event in svc.feed.follow()])

    try:
        await asyncio.wait_for(drain(), 5)
    except TimeoutError:
        pytest.fail("the closed feed kept a new subscriber waiting")


# ---- the audit hook's path judge ----------------------------------------------------------


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The layer's hook with ``work`` (the working directory) writable and ``lib`` readable;
    ``secret`` is outside both. Called directly (never installed): the caller is library code."""
    for name in ("work", "lib", "secret"):
        (tmp_path / name).mkdir()
    (tmp_path / "secret" / "key").write_text("s3cret")
    monkeypatch.chdir(tmp_path / "work")
    return HOOK.audit_hook({}, [str(tmp_path / "lib")], (), (str(tmp_path / "work"),))


@pytest.mark.parametrize(
    ("event", "args"),
    [("os.mkdir", ("planted", 0o777, "FD")), ("os.remove", ("key", "FD")),
     ("os.rename", ("mine", "key", -1, "FD")), ("os.chmod", ("key", 0o777, "FD")),
     ("os.utime", ("key", None, None, "FD")), ("os.rmdir", ("sub", "FD"))],
    ids=["mkdir", "remove", "rename-into", "chmod", "utime", "rmdir"],
)  # fmt: skip
def test_the_judge_sees_the_directory_a_relative_path_is_for(
    hook: Any, tmp_path: Path, event: str, args: tuple[Any, ...]
) -> None:
    """A relative path given with ``dir_fd`` (the event's last arguments) leads under that
    directory, not under the working directory: outside the roots it is refused."""
    fd = os.open(tmp_path / "secret", os.O_RDONLY)
    try:
        with pytest.raises(PermissionError):
            hook(event, tuple(fd if a == "FD" else a for a in args))
    finally:
        os.close(fd)


def test_a_relative_os_open_is_judged_where_it_may_lead(hook: Any) -> None:
    """``os.open(name, flags, dir_fd=fd)`` audits as ``open(name, None, flags)`` without the
    descriptor, so a relative path with mode ``None`` may lead anywhere fd points (a symlink in
    a read root, a directory the judge only lets be read): it cannot be judged by the working
    directory."""
    with pytest.raises(PermissionError):
        hook("open", ("sitecustomize.py", None, os.O_RDONLY))


@pytest.mark.parametrize(
    "database", ["file:/etc/passwd?mode=ro", "file:///etc/hostname", "file:../x?mode=rwc"],
    ids=["uri-absolute", "uri-authority", "uri-relative-climb"],
)  # fmt: skip
def test_sqlite_uris_are_judged_by_the_file_they_name(hook: Any, database: str) -> None:
    """``sqlite3.connect('file:/etc/passwd?mode=ro', uri=True)`` opens /etc/passwd: the audit
    event carries the URI, which the judge must not read as a relative file name."""
    with pytest.raises(PermissionError):
        hook("sqlite3.connect", (database,))


# ---- the layer: its start and its check after each call ------------------------------------

#: A module in the working directory named like the preimport: it turns the audit hook off
#: for good (the layer installs and probes it through these names after the preimports), then
#: hands over the real module.
SHADOW = """
import sys
def _no_hook(hook):
    pass
def _audit(event, *args):
    if event == "harombe.layer_probe":
        raise RuntimeError("faked")
sys.addaudithook, sys.audit = _no_hook, _audit
sys.path.remove("")
del sys.modules["textwrap"]
import textwrap
"""
#: The worker's own start (pyworker.py): the working directory first on sys.path.
WORKER_PATH = 'import sys\nsys.path[:] = [""] + [p for p in sys.path if p]\n'
READ_OUTSIDE = "real = print.__self__\nprint(len(real.open('/etc/hostname').read()) > 0)"


def test_a_preimport_never_comes_from_the_working_directory(tmp_path: Path) -> None:
    """The preimports run before the layer drops the working directory from sys.path: a
    workspace file named like a preimport (or like a module it imports) must not run there,
    before the audit hook, as the worker does after every restart of a session."""
    (tmp_path / "textwrap.py").write_text(SHADOW, encoding="utf-8")
    runner = __import__("tests.unit.test_profile_layer", fromlist=["RUNNER"]).RUNNER
    spec = {**SPEC, "preimport": ["textwrap"]}
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT, WORKER_PATH + runner, json.dumps(LAYER_PARTS),
         json.dumps(spec), json.dumps([READ_OUTSIDE, READ_OUTSIDE])],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert not any(str(o).startswith("ok: True") for o in outcomes), outcomes


def test_a_call_that_restores_a_blocklisted_member_ends_the_session() -> None:
    """The check after each call sees a blocklist stub put back (profiles.md: code that undoes
    the layer's stubs within a call has its session ended by the check)."""
    cells = ["import json\nimport collections\njson.loads = json.JSONDecoder().decode",
             "import json\nprint(json.loads('[1]'))"]  # fmt: skip
    outcomes = run_cells(sys.executable, SPEC, cells)
    assert outcomes[1] != "ok: [1]", outcomes


# ---- the scan budget on an ordinary program ------------------------------------------------


def _ordinary_program(lines: int) -> str:
    """``lines`` lines of ordinary analysis code: functions, loops, dicts, f-strings."""
    block = [
        "def step_{i}(values, scale={i}):",
        "    total = 0.0",
        "    seen = {{}}",
        "    for index, value in enumerate(values):",
        "        key = f'k{{index % 7}}-{i}'",
        "        seen[key] = seen.get(key, 0) + value * scale",
        "        total += math.sqrt(abs(value)) / (index + 1)",
        "    ranked = sorted(seen.items(), key=lambda kv: -kv[1])[:3]",
        "    return round(total, 6), ranked",
        "",
    ]
    body = ["import math", "import statistics", ""]
    i = 0
    while len(body) < lines - 2:
        body += [line.format(i=i) for line in block]
        i += 1
    body += ["results = [step_0([1, 2, 3])]", "print(statistics.mean(r[0] for r in results))"]
    return "\n".join(body[:lines])


@pytest.mark.parametrize("lines", [5_000, 20_000], ids=["5k-lines", "20k-lines"])
def test_an_ordinary_long_program_passes_the_scan(lines: int) -> None:
    """A legitimate program of thousands of lines is accepted by the shipped profile's scan
    (the budget refuses only the pathological); its time is printed for the report."""
    code = _ordinary_program(lines)
    started = time.perf_counter()
    report = run_stages(code, PROFILES["minimal"])
    print(f"\nscan of {lines} lines: {time.perf_counter() - started:.3f} s")
    assert not report.rejected, report.violations[:3]


# ---- held calls and streams at shutdown, over a real server -------------------------------


async def test_shutdown_with_a_held_fips_execute_and_an_open_stream_finishes(
    docker: FakeDocker,
) -> None:
    """SIGTERM-like shutdown with a held fips /execute and an SSE run in progress: the held
    call is answered (denied), the stream ends, every sandbox is removed."""
    from harombe.testing.http import serving

    svc = Service(config(hitl=True), docker_manager=docker, environ={}, approval_key=KEY)
    server = serving(create_app(service=svc))
    base_url = await server.__aenter__()
    alice = httpx.AsyncClient(base_url=base_url, timeout=60,
                              headers={"Authorization": f"Bearer {ALICE}"})  # fmt: skip
    judge = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {JUDGE}"})
    made = await _approved(judge, alice.post("/v1/sandboxes", json={}), "approve_sandbox")
    sid = made.json()["sandbox_id"]
    held = asyncio.ensure_future(alice.post("/execute", json={"code": "'HOLD'"}))
    lines: list[str] = []
    opened = asyncio.Event()

    async def stream() -> None:
        async with alice.stream("POST", f"/v1/sandboxes/{sid}/execute/stream",
                                json={"code": "'HANG'", "timeout": 30}) as events:  # fmt: skip
            opened.set()
            async for line in events.aiter_lines():
                lines.append(line)

    reader = asyncio.ensure_future(stream())
    await asyncio.wait_for(opened.wait(), 10)
    for _ in range(300):
        if (await judge.get("/v1/approvals")).json()["approvals"]:
            break
        await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(server.__aexit__(None, None, None))
    done, _ = await asyncio.wait({stopping}, timeout=45)
    answer = await asyncio.wait_for(held, 5) if held.done() else None
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    if not done:
        await asyncio.wait_for(stopping, 60)
    await alice.aclose()
    await judge.aclose()
    assert done and docker.containers == {}, "the shutdown did not finish"
    assert answer is not None and answer.status_code == 403, answer

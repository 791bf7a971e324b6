"""Attacks on the egress proxy and sandbox networks; each probe asserts the attack is held.

Parsing, fronting, smuggling, leak and resource probes drive an :class:`EgressProxy` on
127.0.0.1 against a recording origin on 127.0.0.1 (names come from a test resolver). The
cross-sandbox and descriptor-exhaustion probes drive real gVisor sandboxes on their own
networks, against origin containers in a network the tests create (fixtures shared with
``tests/integration/test_network.py``); no other address is contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harombe.security.policy.netpolicy import Allowlist
from harombe.security.runtime import egress
from harombe.security.runtime.egress import EgressProxy
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools
from tests.integration.test_network import (  # noqa: F401 - fixtures used by name
    FETCH,
    certs,
    index,
    net_tools,
    origins,
)

SANDBOX = "sandbox-0123456789ab"
ADDRESS_RE = re.compile(rb"\b\d{1,3}(\.\d{1,3}){3}\b|\b[0-9a-f]{0,4}(:[0-9a-f]{0,4}){2,7}\b")
WAIT_S = 10  # bound on any single wait in these probes


@dataclass
class Origin:
    """An HTTP origin on 127.0.0.1 that answers ``200 ok`` to one request head per connection
    and records every byte each connection carried, until the proxy closes it."""

    port: int = 0
    received: list[bytes] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        with contextlib.suppress(Exception):
            data = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.write_eof()
            data += await asyncio.wait_for(reader.read(), WAIT_S)
        self.received.append(data)
        self.done.set()
        writer.close()


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    record = Origin()
    server = await asyncio.start_server(record.serve, "127.0.0.1", 0)
    record.port = int(server.sockets[0].getsockname()[1])
    yield record
    server.close()


NAMES = {
    "allowed.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "inward.test": ["10.1.2.3", "127.0.0.1", "::ffff:192.168.0.1", "64:ff9b::a00:1"],
}
ALLOWED = ["allowed.test", "inward.test", "*.wild.test"]


def proxy_for(port: int, domains: list[str], names: dict[str, list[str]],
              calls: list[str] | None = None, **kwargs: Any) -> EgressProxy:  # fmt: skip
    """A proxy for :data:`SANDBOX` allowing ``domains`` on ``port``, 80 and 443, resolving by
    ``names`` (every lookup recorded in ``calls``; an unknown name fails with a message that
    names a resolver address), with 1 s header and idle timeouts unless ``kwargs`` say else."""
    allowlist = Allowlist.parse(domains, ports=[port, 80, 443])
    seen = calls if calls is not None else []

    async def resolve(host: str, port: int) -> list[str]:
        seen.append(host)
        if host not in names:
            raise OSError("lookup of that name at resolver 10.9.8.7 failed")
        return names[host]

    options: dict[str, Any] = {"resolver": resolve, "allow_private": True,
                               "header_timeout_s": 1.0, "idle_timeout_s": 1.0}  # fmt: skip
    options.update(kwargs)
    return EgressProxy(lambda client: (SANDBOX, allowlist), **options)


def make_proxy(origin: Origin, calls: list[str] | None = None, **kwargs: Any) -> EgressProxy:
    """:func:`proxy_for` the origin's port, :data:`ALLOWED` and :data:`NAMES`."""
    return proxy_for(origin.port, ALLOWED, NAMES, calls, **kwargs)


async def exchange(proxy: EgressProxy, request: bytes) -> bytes:
    """Send ``request`` through a started proxy; everything it answers until it closes."""
    _, port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), WAIT_S)
        writer.close()
        return reply
    finally:
        await proxy.stop()


def o(request: str, origin: Origin) -> bytes:
    """``request`` with ``PORT`` set to the origin's port, as UTF-8 (non-ASCII spellings too)."""
    return request.replace("PORT", str(origin.port)).encode("utf-8")


# --- fronting and request parsing: refused before anything reaches the origin --------------

MALFORMED = [
    ("host-mismatch", "GET http://allowed.test:PORT/ HTTP/1.1\r\nHost: other.test\r\n\r\n", 400),
    ("host-port-mismatch", "GET http://allowed.test:PORT/ HTTP/1.1\r\nHost: allowed.test:81\r\n"
     "\r\n", 400),
    ("duplicate-host", "GET http://allowed.test:PORT/ HTTP/1.1\r\nHost: allowed.test:PORT\r\n"
     "Host: other.test\r\n\r\n", 400),
    ("obs-fold-host", "GET http://allowed.test:PORT/ HTTP/1.1\r\nHost: allowed.test:PORT\r\n"
     " other.test\r\n\r\n", 400),
    ("space-before-colon", "GET http://allowed.test:PORT/ HTTP/1.1\r\nHost : other.test\r\n\r\n",
     400),
    ("userinfo", "GET http://allowed.test:PORT@other.test/ HTTP/1.1\r\n\r\n", 400),
    ("userinfo-reversed", "GET http://other.test@allowed.test:PORT/ HTTP/1.1\r\n\r\n", 400),
    ("backslash-userinfo", "GET http://allowed.test\\@other.test/ HTTP/1.1\r\n\r\n", 400),
    ("fragment", "GET http://allowed.test:PORT/#@other.test HTTP/1.1\r\n\r\n", 400),
    ("bare-lf", "GET http://allowed.test:PORT/ HTTP/1.1\nHost: other.test\r\n\r\n", 400),
    ("bare-cr", "GET http://allowed.test:PORT/ HTTP/1.1\r\nX: a\rHost: other.test\r\n\r\n", 400),
    ("nul-byte", "GET http://allowed.test:PORT/ HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", 400),
    ("cl-and-te", "POST http://allowed.test:PORT/ HTTP/1.1\r\nContent-Length: 4\r\n"
     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("two-content-lengths", "POST http://allowed.test:PORT/ HTTP/1.1\r\nContent-Length: 0\r\n"
     "Content-Length: 40\r\n\r\n", 400),
    ("content-length-sign", "POST http://allowed.test:PORT/ HTTP/1.1\r\nContent-Length: +0\r\n"
     "\r\n", 400),
    ("content-length-list", "POST http://allowed.test:PORT/ HTTP/1.1\r\nContent-Length: 0, 0\r\n"
     "\r\n", 400),
    ("te-not-chunked", "POST http://allowed.test:PORT/ HTTP/1.1\r\nTransfer-Encoding: "
     "chunked, identity\r\n\r\n", 501),
    ("te-two-headers", "POST http://allowed.test:PORT/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
     "Transfer-Encoding: chunked\r\n\r\n", 400),
    ("te-http10", "POST http://allowed.test:PORT/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
     501),
    ("origin-form", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400),
    ("http2-preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("http09", "GET http://allowed.test:PORT/\r\n\r\n", 400),
    ("double-space", "GET  http://allowed.test:PORT/ HTTP/1.1\r\n\r\n", 400),
    ("connect-no-port", "CONNECT allowed.test HTTP/1.1\r\n\r\n", 400),
    ("connect-port-range", "CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n", 400),
    ("connect-host-header-other", "CONNECT allowed.test:PORT HTTP/1.1\r\nHost: other.test:PORT\r\n"
     "\r\n", 400),
    ("connect-with-body", "CONNECT allowed.test:PORT HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 400),
    ("connect-userinfo", "CONNECT user@allowed.test:PORT HTTP/1.1\r\n\r\n", 400),
    ("too-many-headers", "GET http://allowed.test:PORT/ HTTP/1.1\r\n" + "X: y\r\n" * 150 + "\r\n",
     431),
    ("head-too-large", "GET http://allowed.test:PORT/ HTTP/1.1\r\nX: " + "a" * 40000 + "\r\n\r\n",
     431),
    ("https-absolute", "GET https://allowed.test:PORT/ HTTP/1.1\r\n\r\n", 400),
    ("scheme-ftp", "GET ftp://allowed.test/ HTTP/1.1\r\n\r\n", 400),
    ("scheme-relative", "GET //allowed.test/ HTTP/1.1\r\n\r\n", 400),
    ("asterisk-target", "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400),
    ("port-plus", "CONNECT allowed.test:+443 HTTP/1.1\r\n\r\n", 400),
    ("port-not-allowed", "CONNECT allowed.test:22 HTTP/1.1\r\n\r\n", 403),
    # Names outside the allowlist in any spelling: suffix tricks, percent, brackets, IP forms,
    # non-ASCII. None may widen the allowlist.
    ("suffix-trick", "CONNECT allowed.test.other.test:PORT HTTP/1.1\r\n\r\n", 403),
    ("allowed-as-label", "GET http://allowed.test.evil.test/ HTTP/1.1\r\n\r\n", 403),
    ("allowed-as-prefix", "CONNECT wild.test.evil.test:443 HTTP/1.1\r\n\r\n", 403),
    ("suffix-without-dot", "CONNECT evilwild.test:443 HTTP/1.1\r\n\r\n", 403),
    ("pattern-apex", "CONNECT wild.test:443 HTTP/1.1\r\n\r\n", 403),
    ("dash-suffix", "CONNECT evil-wild.test:443 HTTP/1.1\r\n\r\n", 403),
    ("truncated-name", "CONNECT allowed.tes:443 HTTP/1.1\r\n\r\n", 403),
    ("trailing-dot-other", "CONNECT other.test.:PORT HTTP/1.1\r\n\r\n", 403),
    ("underscore-bypass", "CONNECT allowed_test:PORT HTTP/1.1\r\n\r\n", 403),
    ("localhost", "GET http://localhost/ HTTP/1.1\r\n\r\n", 403),
    ("percent-dot", "GET http://allowed%2Etest:PORT/ HTTP/1.1\r\n\r\n", 403),
    ("percent-nul", "CONNECT allowed.test%00.evil.test:443 HTTP/1.1\r\n\r\n", 403),
    ("bracketed-name", "CONNECT [allowed.test]:443 HTTP/1.1\r\n\r\n", 400),
    ("bracketed-hex-name", "CONNECT [add.bed]:443 HTTP/1.1\r\n\r\n", 403),
    ("backslash-host", "GET http://allowed.test\\.evil.test/ HTTP/1.1\r\n\r\n", 400),
    ("non-ascii-host", "GET http://allowed.t\xe9st/ HTTP/1.1\r\n\r\n", 400),
    ("fullwidth-dot", "GET http://allowed\uff0etest/ HTTP/1.1\r\n\r\n", 400),
    ("ip-literal", "GET http://127.0.0.1:PORT/ HTTP/1.1\r\n\r\n", 403),
    ("ip-trailing-dot", "GET http://127.0.0.1./ HTTP/1.1\r\n\r\n", 403),
    ("integer-ip", "GET http://2130706433:PORT/ HTTP/1.1\r\n\r\n", 403),
    ("short-ip", "CONNECT 127.1:PORT HTTP/1.1\r\n\r\n", 403),
    ("hex-ip", "CONNECT 0x7f.0.0.1:PORT HTTP/1.1\r\n\r\n", 403),
    ("octal-ip", "GET http://0177.0.0.1/ HTTP/1.1\r\n\r\n", 403),
    ("zero-ip", "CONNECT 0:443 HTTP/1.1\r\n\r\n", 403),
    ("ipv6-literal", "CONNECT [::1]:PORT HTTP/1.1\r\n\r\n", 403),
    ("ipv6-mapped-literal", "GET http://[::ffff:127.0.0.1]:PORT/ HTTP/1.1\r\n\r\n", 403),
    ("ipv6-full-mapped", "CONNECT [0:0:0:0:0:ffff:7f00:1]:443 HTTP/1.1\r\n\r\n", 403),
    ("ipv6-zone", "GET http://[fe80::1%25lo]/ HTTP/1.1\r\n\r\n", 400),
]  # fmt: skip


@pytest.mark.parametrize(("request_text", "status"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])  # fmt: skip
async def test_malformed_or_fronting_requests_never_reach_the_origin(
    origin: Origin, request_text: str, status: int
) -> None:
    """Ambiguous, fronting or forbidden requests, and names outside the allowlist in any
    spelling, are refused with a status before any lookup, and reach nothing."""
    calls: list[str] = []
    reply = await exchange(make_proxy(origin, calls), o(request_text, origin))
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:200]
    assert calls == [] and origin.received == []


# --- what reaches the origin is exactly one checked request -------------------------------

FORWARDED = [
    ("host-forced", "GET http://allowed.test:PORT/a HTTP/1.1\r\n\r\n",
     [b"GET /a HTTP/1.1\r\nHost: allowed.test:PORT\r\n"], [b"other"]),
    ("pipelined-second-host", "GET http://allowed.test:PORT/a HTTP/1.1\r\nHost: allowed.test:PORT"
     "\r\n\r\nGET /b HTTP/1.1\r\nHost: other.test\r\n\r\n", [b"GET /a "], [b"other.test", b"/b"]),
    ("smuggled-after-content-length", "POST http://allowed.test:PORT/ HTTP/1.1\r\n"
     "Content-Length: 3\r\n\r\nabcGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n",
     [b"Content-Length: 3\r\n", b"\r\n\r\nabc"], [b"other.test", b"/s"]),
    ("smuggled-after-chunked", "POST http://allowed.test:PORT/ HTTP/1.1\r\nTransfer-Encoding: "
     "chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n",
     [b"3\r\nabc\r\n0\r\n\r\n"], [b"other.test", b"/s"]),
    ("h2c-upgrade-stripped", "GET http://allowed.test:PORT/ HTTP/1.1\r\nUpgrade: h2c\r\n"
     "HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n",
     [b"Connection: close"], [b"Upgrade", b"h2c", b"HTTP2-Settings"]),
    ("proxy-credentials-stripped", "GET http://allowed.test:PORT/ HTTP/1.1\r\n"
     "Proxy-Authorization: Basic c2VjcmV0\r\nX-Hop: 1\r\nConnection: X-Hop\r\n\r\n",
     [b"GET / HTTP/1.1"], [b"c2VjcmV0", b"X-Hop"]),
]  # fmt: skip


@pytest.mark.parametrize(("request_text", "present", "absent"),
                         [f[1:] for f in FORWARDED], ids=[f[0] for f in FORWARDED])  # fmt: skip
async def test_only_the_checked_request_reaches_the_origin(
    origin: Origin, request_text: str, present: list[bytes], absent: list[bytes]
) -> None:
    """The origin sees one request, for the checked host, with hop-by-hop headers gone and
    nothing pipelined or smuggled after its body."""
    reply = await exchange(make_proxy(origin), o(request_text, origin))
    await asyncio.wait_for(origin.done.wait(), WAIT_S)
    assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:200]
    (seen,) = origin.received
    for part in present:
        assert part.replace(b"PORT", str(origin.port).encode()) in seen, seen
    for part in absent:
        assert part not in seen, seen
    assert seen.count(b"HTTP/1.1\r\n") == 1, seen


BAD_CHUNKS = [
    ("chunk-size-not-hex", "zz\r\nGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    ("chunk-size-overflow", "fffffffffffffffff\r\nGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    ("chunk-size-negative", "-1\r\nGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    ("chunk-data-overrun", "3\r\nabcGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n0\r\n\r\n"),
    ("chunk-line-too-long", "1;" + "e" * 5000 + "\r\nx\r\n0\r\n\r\nGET /s HTTP/1.1\r\n\r\n"),
    ("chunk-bare-lf", "3\nabc\r\n0\r\n\r\nGET /s HTTP/1.1\r\nHost: other.test\r\n\r\n"),
]  # fmt: skip


@pytest.mark.parametrize("body", [b[1] for b in BAD_CHUNKS], ids=[b[0] for b in BAD_CHUNKS])
async def test_malformed_chunked_bodies_are_cut_off(origin: Origin, body: str) -> None:
    """A chunked body the proxy cannot frame unambiguously is cut off where it goes wrong: the
    origin never gets its end, nor the request hidden after it."""
    request = "POST http://allowed.test:PORT/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    await exchange(make_proxy(origin), o(request + body, origin))
    await asyncio.wait_for(origin.done.wait(), WAIT_S)
    (seen,) = origin.received
    assert b"GET /s" not in seen and not seen.endswith(b"0\r\n\r\n"), seen


# --- refusals leak no addresses -----------------------------------------------------------

LEAKS = [
    # id, target, allow_private, status
    ("resolves-inward", "inward.test:PORT", False, 403),
    ("does-not-resolve", "unknown.test:PORT", False, 502),
    ("connection-refused", "allowed.test:1", True, 502),
]


@pytest.mark.parametrize(("target", "allow_private", "status"), [x[1:] for x in LEAKS],
                         ids=[x[0] for x in LEAKS])  # fmt: skip
async def test_refusals_name_the_host_and_reason_but_no_address(
    origin: Origin, target: str, allow_private: bool, status: int
) -> None:
    """A refusal body names the requested host and the reason, never a resolved, resolver or
    gateway address (the audit log keeps the detail)."""
    host, _, port = target.replace("PORT", str(origin.port)).partition(":")
    proxy = proxy_for(int(port), [host], NAMES, allow_private=allow_private)
    request_text = f"CONNECT {target} HTTP/1.1\r\n\r\n"
    with capture_events() as events:
        reply = await exchange(proxy, o(request_text, origin))
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), reply
    assert b".test" in body and ADDRESS_RE.search(body) is None, body
    (event,) = [e for e in events if e["event"] == "egress.refused"]
    assert event.get("detail"), "the audit keeps what the client is not told"
    assert proxy.connections == 0


# --- DNS rebinding: one lookup, and the connection goes to the address that was checked ---

REBIND = [
    ("public-then-private", [["93.184.216.34"], ["127.0.0.1"]], "93.184.216.34"),
    ("private-first-public-second", [["10.0.0.1", "93.184.216.34"]], "93.184.216.34"),
    ("mapped-private-and-public", [["::ffff:127.0.0.1", "2606:4700::1"]], "2606:4700::1"),
]


@pytest.mark.parametrize(("answers", "dialled"), [r[1:] for r in REBIND],
                         ids=[r[0] for r in REBIND])  # fmt: skip
async def test_the_connection_goes_to_the_checked_address(
    origin: Origin, monkeypatch: pytest.MonkeyPatch, answers: list[list[str]], dialled: str
) -> None:
    """The proxy resolves once per connection and dials only a public address of that one
    answer, whatever a second lookup would say."""
    calls: list[str] = []
    sequence = iter(answers)

    async def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(sequence)

    async def dial(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        calls.append(f"dial {address}")
        return await asyncio.open_connection("127.0.0.1", origin.port)

    monkeypatch.setattr(egress, "_dial", dial)
    proxy = make_proxy(origin, resolver=rebinding, allow_private=False)
    reply = await exchange(proxy, o("CONNECT allowed.test:PORT HTTP/1.1\r\n\r\n", origin))
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert calls == ["allowed.test", f"dial {dialled}"]


# --- resource exhaustion: caps and timeouts ----------------------------------------------


async def test_slow_header_is_cut_off(origin: Origin) -> None:
    """A client that never finishes its request head is answered 408 and closed."""
    reply = await exchange(make_proxy(origin), b"GET http://allowed.test/ HTTP/1.1\r\nX: ")
    assert reply.startswith(b"HTTP/1.1 408"), reply


async def test_idle_tunnel_is_closed(origin: Origin) -> None:
    """A tunnel that carries nothing is closed after the idle timeout, freeing its slot."""
    proxy = make_proxy(origin)
    _, port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(o("CONNECT allowed.test:PORT HTTP/1.1\r\n\r\n", origin))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        # The origin half-closes after its reply; then nothing moves and the proxy ends it.
        rest = await asyncio.wait_for(reader.read(), WAIT_S)
        assert rest == b"" or rest.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
        for _ in range(100):
            if proxy.connections == 0:
                break
            await asyncio.sleep(0.05)
        assert proxy.connections == 0
    finally:
        await proxy.stop()


async def test_connections_past_the_cap_are_refused(origin: Origin) -> None:
    """Past its connection cap, a sandbox's new connections get 503 at once; the held ones
    are not disturbed, and closing some frees room."""
    proxy = make_proxy(origin, max_connections=8, header_timeout_s=30.0)
    _, port = await proxy.start()
    held = []
    try:
        for _ in range(8):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.1)
        replies = []
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            replies.append(await asyncio.wait_for(reader.read(), WAIT_S))
            writer.close()
        assert all(r.startswith(b"HTTP/1.1 503") for r in replies), replies[:2]
        assert proxy.connections == 8
        for _, writer in held[:4]:
            writer.close()
        held = held[4:]
        for _ in range(100):
            if proxy.connections == 4:
                break
            await asyncio.sleep(0.05)
        assert proxy.connections == 4
    finally:
        for _, writer in held:
            writer.close()
        await proxy.stop()


async def test_foreign_client_is_refused_before_reading(origin: Origin) -> None:
    """A peer that is not the proxy's own sandbox gets 403 and the audit names it, not the
    proxy's sandbox."""
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:  # never a real lookup, even if broken
        lookups.append(host)
        return []

    proxy = EgressProxy(lambda client: None, identify=lambda client: "sandbox-intruder",
                        resolver=resolve)  # fmt: skip
    with capture_events() as events:
        reply = await exchange(proxy, o("CONNECT allowed.test:PORT HTTP/1.1\r\n\r\n", origin))
    assert reply.startswith(b"HTTP/1.1 403") and b"serves another sandbox" in reply
    (event,) = [e for e in events if e["event"] == "egress.refused"]
    assert event["sandbox_id"] == "sandbox-intruder" and event["client"] == "127.0.0.1"
    assert origin.received == []
    assert lookups == []


# --- real sandboxes: one sandbox against another's proxy, and descriptor exhaustion --------

PROBE_CONNECT = (
    "import socket\n"
    "def probe(host, port, request):\n"
    "    s = socket.socket(); s.settimeout(5)\n"
    "    try:\n"
    "        s.connect((host, port)); s.sendall(request)\n"
    "        return s.recv(200).decode(errors='replace').split('\\r\\n')[0]\n"
    "    except OSError as e:\n"
    "        return type(e).__name__\n"
)


@pytest.mark.parametrize(
    "request_text",
    ["CONNECT secure.test:443 HTTP/1.1\r\n\r\n", "GET http://secure.test/ HTTP/1.1\r\n\r\n"],
    ids=["connect", "absolute-get"],
)
async def test_a_sandbox_cannot_use_another_sandboxs_proxy(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
    request_text: str,
) -> None:
    """Sandbox A, allowed plain.test only, asks sandbox B's proxy (allowed secure.test) for
    secure.test: the firewall refuses the connection outright."""
    b = await net_tools.code_execute(language="python", code="1", network_enabled=True,
                                     allowed_domains=["secure.test"])  # fmt: skip
    lease_b = net_tools.sandbox_manager.networks.get(b["sandbox_id"])
    assert lease_b is not None
    b_gateway = lease_b.gateway
    code = PROBE_CONNECT + f"probe({b_gateway!r}, 3128, {request_text.encode()!r})"
    with capture_events() as events:
        a = await net_tools.code_execute(language="python", code=code, network_enabled=True,
                                         allowed_domains=["plain.test"])  # fmt: skip
    assert a["result"] == "'ConnectionRefusedError'", a
    assert not [e for e in events if e["event"] == "egress.allowed"]


async def test_another_sandboxs_proxy_refuses_it_even_through_an_open_firewall(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
) -> None:
    """With the firewall opened by hand from A's bridge to B's proxy, B's proxy still refuses
    A by its address, and the audit names A (its address and sandbox id), not B."""
    networks = net_tools.sandbox_manager.networks
    b = await net_tools.code_execute(language="python", code="1", network_enabled=True,
                                     allowed_domains=["secure.test"])  # fmt: skip
    a = await net_tools.code_execute(language="python", code="1", network_enabled=True,
                                     allowed_domains=["plain.test"])  # fmt: skip
    lease_a, lease_b = networks.get(a["sandbox_id"]), networks.get(b["sandbox_id"])
    assert lease_a is not None and lease_b is not None
    hole = ["INPUT", "-i", lease_a.bridge, "-d", lease_b.gateway, "-p", "tcp", "--dport", "3128",
            "-j", "ACCEPT"]  # fmt: skip
    await asyncio.to_thread(subprocess.run, ["iptables", "-w", "-I", *hole], check=True)
    try:
        request = b"CONNECT secure.test:443 HTTP/1.1\r\n\r\n"
        code = PROBE_CONNECT + f"probe({lease_b.gateway!r}, 3128, {request!r})"
        with capture_events() as events:
            probe = await net_tools.code_execute(language="python", code=code,
                                                 sandbox_id=a["sandbox_id"])  # fmt: skip
    finally:
        await asyncio.to_thread(subprocess.run, ["iptables", "-w", "-D", *hole], check=True)
    assert probe["result"] == "'HTTP/1.1 403 Refused'", probe
    (event,) = [e for e in events if e["event"] == "egress.refused"]
    assert event["sandbox_id"] == a["sandbox_id"] and event["client"] == lease_a.client_ip


HOARD = (
    "import os, socket, time\n"
    "proxy = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0]\n"
    "held, refused, failed = [], 0, 0\n"
    "for _ in range(2000):\n"
    "    s = socket.socket(); s.settimeout(5)\n"
    "    try:\n"
    "        s.connect((proxy, 3128))\n"
    "        s.sendall(b'CONNECT plain.test:80 HTTP/1.1\\r\\n\\r\\n')\n"
    "        if s.recv(12).startswith(b'HTTP/1.1 200'):\n"
    "            held.append(s)\n"
    "        else:\n"
    "            refused += 1; s.close()\n"
    "    except OSError:\n"
    "        failed += 1; s.close()\n"
    "print(f'held={len(held)} refused={refused} failed={failed}', flush=True)\n"
    "print('HOLDING', flush=True)\n"
    "time.sleep(50)\n"
)


async def test_one_sandbox_hoarding_connections_starves_no_other(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
) -> None:
    """A sandbox that opens 2000 proxy connections and holds them gets refusals past its cap,
    while another sandbox's fetch works and new sandboxes (with and without network) are
    still created."""
    stream = net_tools.code_execute_stream(
        language="python", code=HOARD, timeout=120, network_enabled=True,
        allowed_domains=["plain.test"],
    )  # fmt: skip
    counts = ""
    try:
        # Read (without leaving the stream, which would cancel the run) until it holds.
        while "HOLDING" not in counts:
            item = await asyncio.wait_for(stream.__anext__(), 90)
            if item["type"] == "result":
                pytest.fail(f"the hoarding run ended early: {item}")
            if item["type"] == "stdout":
                counts += item["text"]
        held, refused, _failed = (int(v) for v in re.findall(r"=(\d+)", counts))
        assert held == egress.MAX_CONNECTIONS_PER_SANDBOX and refused > 1000, counts
        victim = await net_tools.code_execute(
            language="python", code=FETCH + "[fetch('http://plain.test/') for _ in range(5)]",
            network_enabled=True, allowed_domains=["plain.test"],
        )  # fmt: skip
        assert victim["result"] == "[200, 200, 200, 200, 200]", victim
        offline = await net_tools.code_execute(language="python", code="6 * 7")
        assert offline["result"] == "42", offline
    finally:
        assert isinstance(stream, AsyncGenerator)
        await stream.aclose()  # cancels the hoarding run; its sandbox is cleaned up by stop()

"""The egress proxy against servers on 127.0.0.1, with names resolved by a test resolver."""

import asyncio
import resource
from collections.abc import AsyncIterator

import pytest

from harombe.errors import ConfigError
from harombe.security.policy.netpolicy import Allowlist, address_is_public, is_ip_literal
from harombe.security.runtime.egress import EgressProxy, printable
from harombe.security.runtime.egress_resources import ConnectionBudget, raise_fd_limit
from harombe.testing import capture_events

NAMES = {"allowed.test": "127.0.0.1", "api.allowed.test": "127.0.0.1",
         "other.test": "127.0.0.1"}  # fmt: skip


async def fake_resolver(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError("no such name")
    return [NAMES[host]]


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    """A tiny HTTP server that answers every request with its request line."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(line), line))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()


async def start_proxy(
    origin_port: int, domains: list[str]
) -> tuple[EgressProxy, int, dict[str, Allowlist]]:
    state = {"allowlist": Allowlist.parse(domains, ports=[origin_port])}
    proxy = EgressProxy(
        lambda client: ("sandbox-0123456789ab", state["allowlist"]),
        resolver=fake_resolver,
        allow_private=True,  # the test servers are on 127.0.0.1
    )
    _, port = await proxy.start()
    return proxy, port, state


async def through(proxy_port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def test_allowed_http_request_is_forwarded(origin: int) -> None:
    """A plain HTTP request to an allowed name reaches the origin in origin form."""
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    try:
        request = (
            f"GET http://allowed.test:{origin}/x?y=1 HTTP/1.1\r\n"
            "Host: allowed.test\r\nProxy-Authorization: z\r\n\r\n"
        )
        reply = await through(port, request.encode())
    finally:
        await proxy.stop()
    assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"GET /x?y=1 HTTP/1.1")


async def test_connect_tunnels_to_an_allowed_name(origin: int) -> None:
    """CONNECT to an allowed name opens a byte tunnel (as HTTPS uses it)."""
    proxy, port, _ = await start_proxy(origin, ["*.allowed.test"])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT api.allowed.test:{origin} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(b"GET /inside HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = await reader.read()
        writer.close()
    finally:
        await proxy.stop()
    assert reply.endswith(b"GET /inside HTTP/1.1")


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("other.test", "not in the sandbox's allowed domains"),
        ("127.0.0.1", "IP addresses are never allowed"),
        ("allowed.test.evil", "not in the sandbox's allowed domains"),
        ("xallowed.test", "not in the sandbox's allowed domains"),
    ],
    ids=["other-name", "ip-literal", "suffix-trick", "prefix-trick"],
)
async def test_everything_else_is_refused_and_audited(
    origin: int, target: str, reason: str
) -> None:
    """Other names and IP literals get 403 with the reason, and one egress.refused event."""
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    try:
        with capture_events() as events:
            reply = await through(port, f"CONNECT {target}:{origin} HTTP/1.1\r\n\r\n".encode())
    finally:
        await proxy.stop()
    assert reply.startswith(b"HTTP/1.1 403") and reason.encode() in reply
    (event,) = [e for e in events if e["event"] == "egress.refused"]
    assert event["domain"] == target and event["port"] == origin
    assert event["sandbox_id"] == "sandbox-0123456789ab"


async def test_port_outside_the_allowlist_is_refused(origin: int) -> None:
    """An allowed name on another port is refused."""
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    try:
        reply = await through(port, b"CONNECT allowed.test:22 HTTP/1.1\r\n\r\n")
    finally:
        await proxy.stop()
    assert reply.startswith(b"HTTP/1.1 403") and b"port 22 is not allowed" in reply


async def test_changed_allowlist_applies_to_the_next_connection(origin: int) -> None:
    """Removing a domain refuses the next connection to it."""
    proxy, port, state = await start_proxy(origin, ["allowed.test"])
    request = f"CONNECT allowed.test:{origin} HTTP/1.1\r\n\r\n".encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
        state["allowlist"] = Allowlist.parse(["other.test"], ports=[origin])
        assert (await through(port, request)).startswith(b"HTTP/1.1 403")
    finally:
        await proxy.stop()


async def test_names_resolving_inward_are_refused_by_default(origin: int) -> None:
    """Without allow_private, an allowed name that resolves to 127.0.0.1 is refused."""
    allowlist = Allowlist.parse(["allowed.test"], ports=[origin])
    proxy = EgressProxy(lambda client: ("sandbox-x", allowlist), resolver=fake_resolver)
    _, port = await proxy.start()
    try:
        reply = await through(port, f"CONNECT allowed.test:{origin} HTTP/1.1\r\n\r\n".encode())
    finally:
        await proxy.stop()
    assert reply.startswith(b"HTTP/1.1 403") and b"local or private addresses" in reply


@pytest.mark.parametrize(
    ("entry", "message"),
    [("https://x.com", "bare host name"), ("10.0.0.1", "IP address"), ("*.com", "too broad"),
     ("a*.x.com", "leading"), ("", "empty")],
    ids=["url", "ip", "tld-pattern", "inner-star", "empty"],
)  # fmt: skip
def test_bad_allowlist_entries_are_refused(entry: str, message: str) -> None:
    """Entries that are not host names or sane patterns fail with the fix."""
    with pytest.raises(ConfigError, match=message):
        Allowlist.parse([entry])


ADDRESSES = [
    # ordinary internet addresses
    ("93.184.216.34", True), ("8.8.8.8", True), ("1.1.1.1", True), ("2606:4700::1", True),
    ("2a00:1450:4001::200e", True),
    # IPv4 special ranges
    ("0.0.0.0", False), ("0.1.2.3", False), ("10.1.2.3", False), ("100.64.0.1", False),
    ("100.127.255.254", False), ("127.0.0.1", False), ("127.255.255.255", False),
    ("169.254.169.254", False), ("172.16.0.1", False), ("172.31.255.255", False),
    ("172.17.0.1", False), ("192.0.0.8", False), ("192.0.2.1", False), ("192.88.99.1", False),
    ("192.168.1.1", False), ("198.18.0.1", False), ("198.19.255.255", False),
    ("198.51.100.7", False), ("203.0.113.9", False), ("224.0.0.1", False),
    ("239.255.255.250", False), ("240.0.0.1", False), ("255.255.255.255", False),
    # IPv6 special ranges
    ("::", False), ("::1", False), ("fe80::1", False), ("fe80::1%eth0", False),
    ("fec0::1", False), ("fc00::1", False), ("fd12:3456::1", False), ("ff02::1", False),
    ("ff0e::1", False), ("100::1", False), ("2001:db8::1", False), ("2001:2::1", False),
    ("2001:10::1", False), ("3fff::1", False), ("5f00::1", False), ("4000::1", False),
    # IPv4 wrapped in IPv6: judged by what they wrap
    ("::ffff:10.0.0.1", False), ("::ffff:127.0.0.1", False), ("::ffff:169.254.169.254", False),
    ("::ffff:8.8.8.8", True), ("::ffff:0:10.0.0.1", False), ("::ffff:0:8.8.8.8", True),
    ("64:ff9b::10.0.0.1", False), ("64:ff9b::127.0.0.1", False), ("64:ff9b::a9fe:a9fe", False),
    ("64:ff9b::8.8.8.8", True), ("64:ff9b:1::8.8.8.8", False), ("64:ff9b:1::10.0.0.1", False),
    ("2002:a00:1::", False), ("2002:7f00:1::1", False), ("2002:c0a8:101::1", False),
    ("2002:808:808::1", True),
    ("::10.0.0.1", False), ("::127.0.0.1", False), ("::8.8.8.8", False),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False), ("2001:0:a00:1::", False),
    # not an address at all
    ("not-an-address", False), ("", False),
]  # fmt: skip


@pytest.mark.parametrize(("address", "public"), ADDRESSES, ids=[a or "empty" for a, _ in ADDRESSES])
def test_public_addresses(address: str, public: bool) -> None:
    """Only ordinary internet addresses count as public; IPv6 forms that wrap IPv4 (mapped,
    SIIT, NAT64, 6to4, IPv4-compatible, Teredo) never smuggle a private one through."""
    assert address_is_public(address) is public


@pytest.mark.parametrize(
    ("host", "literal"),
    [("127.0.0.1", True), ("127.1", True), ("2130706433", True), ("0x7f.0.0.1", True),
     ("0x7f000001", True), ("[::1]", True), ("::ffff:127.0.0.1", True), ("1.2.3.4.", True),
     ("example.com", False), ("1e100.net", False), ("a1.b2", False)],
)  # fmt: skip
def test_ip_literals_in_every_spelling(host: str, literal: bool) -> None:
    """Numeric spellings a resolver would read as an address count as IP literals."""
    assert is_ip_literal(host) is literal


def test_fd_limit_is_raised_to_the_hard_limit() -> None:
    """At start the soft open-files limit is raised to the hard one, and the budget of proxied
    connections leaves room for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        with capture_events() as events:
            limit = raise_fd_limit()
        assert limit == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert any(e["event"] == "egress.fd_limit_raised" for e in events)
        assert ConnectionBudget.from_fd_limit(limit).capacity <= (limit - 512) // 2
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_low_fd_limit_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hard limit too low to raise past is logged with the fix."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (512, 512))
    with capture_events() as events:
        assert raise_fd_limit() == 512
    (event,) = [e for e in events if e["event"] == "egress.fd_limit_low"]
    assert "ulimit" in event["fix"]


async def test_request_bodies_are_forwarded_whole() -> None:
    """A body framed by Content-Length or chunked reaches the origin byte for byte, and the
    Host header carries the checked authority."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        writer.write_eof()
        seen.append(data + await reader.read())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = int(server.sockets[0].getsockname()[1])
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    try:
        await through(port, f"POST http://Allowed.Test.:{origin}/u HTTP/1.1\r\n"
                            "Content-Length: 5\r\n\r\nhello".encode())  # fmt: skip
        await through(port, f"POST http://allowed.test:{origin}/u HTTP/1.1\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n"
                            "5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n".encode())  # fmt: skip
        for _ in range(200):  # the origin records a connection once the proxy has closed it
            if len(seen) == 2:
                break
            await asyncio.sleep(0.02)
    finally:
        await proxy.stop()
        server.close()
    assert seen[0].endswith(b"\r\n\r\nhello") and f"Host: allowed.test:{origin}".encode() in seen[0]
    assert seen[1].endswith(b"\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), seen[1]


async def test_stop_ends_open_tunnels(origin: int) -> None:
    """Stopping a proxy (its sandbox is gone) closes the tunnels it still carried."""
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT allowed.test:{origin} HTTP/1.1\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert proxy.connections == 1
    await proxy.stop()
    assert proxy.connections == 0
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_expect_continue_round_trip() -> None:
    """A client that waits for ``100 Continue`` before its body gets it: the response flows
    back while the body is still to come."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await reader.readexactly(5)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + body)
        writer.write_eof()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = int(server.sockets[0].getsockname()[1])
    proxy, port, _ = await start_proxy(origin, ["allowed.test"])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"PUT http://allowed.test:{origin}/ HTTP/1.1\r\nContent-Length: 5\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())  # fmt: skip
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(
            b"HTTP/1.1 100"
        )
        writer.write(b"hello")
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await proxy.stop()
        server.close()
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"hello")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a.test", "a.test"), ("a\r\nb", "a??b"), ("\x1b[31m", "?[31m"), ("\x9b1m", "?1m"),
     ("é", "?"), ("x" * 300, "x" * 253)],
    ids=["plain", "crlf", "ansi", "c1", "non-ascii", "long"],
)  # fmt: skip
def test_printable_keeps_client_text_to_one_plain_line(text: str, expected: str) -> None:
    """Client-written text in logs and refusals is cut and kept to printable ASCII."""
    assert printable(text) == expected

"""The egress proxy against servers on 127.0.0.1, with names resolved by a test resolver."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from harombe.errors import ConfigError
from harombe.security.egress import EgressProxy
from harombe.security.netpolicy import Allowlist, address_is_public
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


async def start_proxy(origin_port: int, domains: list[str]) -> tuple[EgressProxy, int, dict]:
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


@pytest.mark.parametrize(
    ("address", "public"),
    [("93.184.216.34", True), ("10.1.2.3", False), ("127.0.0.1", False), ("169.254.1.1", False),
     ("::1", False), ("::ffff:10.0.0.1", False), ("172.17.0.1", False), ("2606:4700::1", True)],
)  # fmt: skip
def test_public_addresses(address: str, public: bool) -> None:
    """Only ordinary internet addresses count as public."""
    assert address_is_public(address) is public

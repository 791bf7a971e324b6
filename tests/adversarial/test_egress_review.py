"""Second round of attacks on the egress proxy and sandbox networks; each probe asserts the
attack is held.

Parsing, reflection, audit, resolver and resource probes drive an :class:`EgressProxy` on
127.0.0.1 against origins on 127.0.0.1 (names come from test resolvers, or from a stand-in for
the blocking system lookup). The isolation probes drive real gVisor sandboxes on their own
networks, with origins in a network the tests create (fixtures shared with
``tests/integration/test_network.py``); no other address is contacted.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import math
import subprocess
import threading
import time
from typing import cast

import pytest

from harombe.errors import InfrastructureError
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.runtime import egress, egress_resources
from harombe.security.runtime.egress import EgressProxy
from harombe.security.runtime.egress_resources import ConnectionBudget
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools
from tests.adversarial import test_egress
from tests.adversarial.test_egress import Origin, exchange, o, proxy_for
from tests.integration.test_network import (  # noqa: F401 - fixtures used by name
    certs,
    index,
    net_tools,
    origins,
)

WAIT_S = 15  # bound on any single wait in these probes
origin = test_egress.origin  # the recording-origin fixture, shared


def printable_only(value: object) -> bool:
    text = str(value)
    return all(0x20 <= ord(c) < 0x7F for c in text)


# --- names: spellings that must not break the allowlist (those that must not widen it are
# refused in tests/adversarial/test_egress.py) ------------------------------------------------

NORMALISED = [
    ("uppercase-scheme-and-host", "GET HTTP://ALLOWED.TEST:PORT/a HTTP/1.1\r\n\r\n"),
    ("trailing-dot", "GET http://allowed.test.:PORT/a HTTP/1.1\r\n\r\n"),
    ("host-header-case-and-dot", "GET http://allowed.test:PORT/a HTTP/1.1\r\n"
     "Host: Allowed.Test.:PORT\r\n\r\n"),
    ("wildcard-mixed-case", "GET http://A.Wild.TEST:PORT/a HTTP/1.1\r\n\r\n"),
]  # fmt: skip


@pytest.mark.parametrize("request_text", [n[1] for n in NORMALISED],
                         ids=[n[0] for n in NORMALISED])  # fmt: skip
async def test_spellings_of_an_allowed_name_reach_only_that_name(
    origin: Origin, request_text: str
) -> None:
    """Case and a trailing dot are one name: the proxy resolves the normalised name and the
    origin's ``Host`` is that name, never the client's spelling."""
    calls: list[str] = []
    names = {"allowed.test": ["127.0.0.1"], "a.wild.test": ["127.0.0.1"]}
    proxy = proxy_for(origin.port, ["allowed.test", "*.wild.test"], names, calls)
    reply = await exchange(proxy, o(request_text, origin))
    await asyncio.wait_for(origin.done.wait(), WAIT_S)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    (seen,) = origin.received
    (name,) = calls
    assert name in names and f"Host: {name}:{origin.port}\r\n".encode() in seen, seen


# --- reflection and audit: nothing a client writes comes back as markup, a header or a log line

INJECTIONS = [
    ("html-in-host", "GET http://<script>alert(1)<.test/ HTTP/1.1\r\n\r\n"),
    ("crlf-percent-in-host", "CONNECT a%0d%0aSet-Cookie:%20x=1.test:443 HTTP/1.1\r\n\r\n"),
    ("quote-in-host", "GET http://\"onload=x\".test/ HTTP/1.1\r\n\r\n"),
    ("ansi-in-target", "CONNECT a\x1b[31m.test:443 HTTP/1.1\r\n\r\n"),
    ("c1-csi-in-host-header", "GET http://allowed.test/ HTTP/1.1\r\nHost: a\x9b31m.test\r\n\r\n"),
    ("newline-in-host-header", "GET http://allowed.test/ HTTP/1.1\r\nHost: a\nX-Evil: 1\r\n\r\n"),
    ("long-not-allowed-name", "CONNECT " + "a" * 60 + "." + "b" * 60 + ".test:443 HTTP/1.1"
     "\r\n\r\n"),
    ("header-in-reason", "CONNECT notallowed.test:443 HTTP/1.1\r\nX: Set-Cookie: a=1\r\n\r\n"),
]  # fmt: skip

EXPECTED_REFUSAL_HEADERS = {"content-type", "x-content-type-options", "cache-control",
                            "content-length", "connection"}  # fmt: skip


@pytest.mark.parametrize("request_text", [i[1] for i in INJECTIONS],
                         ids=[i[0] for i in INJECTIONS])  # fmt: skip
async def test_refusals_reflect_nothing_executable_and_audit_stays_one_line(
    origin: Origin, request_text: str
) -> None:
    """A refusal has a fixed set of headers, a plain-text printable body without markup, and
    every audit field it logs is printable ASCII (no line breaks or terminal escapes)."""
    proxy = proxy_for(origin.port, ["allowed.test"], {"allowed.test": ["127.0.0.1"]})
    with capture_events() as events:
        reply = await exchange(proxy, request_text.encode("latin-1"))
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0][:12] in (b"HTTP/1.1 400", b"HTTP/1.1 403"), reply[:200]
    names = {line.split(b":", 1)[0].decode().lower() for line in lines[1:]}
    assert names == EXPECTED_REFUSAL_HEADERS, lines
    assert b"nosniff" in head and b"text/plain" in head
    assert printable_only(body.decode("latin-1").rstrip("\n")) and b"<" not in body, body
    refusals = [e for e in events if e["event"] == "egress.refused"]
    assert refusals and all(printable_only(v) for e in refusals for v in e.values()), refusals
    assert origin.received == []


async def test_refusals_cannot_flood_the_log(origin: Origin) -> None:
    """Hundreds of refused requests a second give a bounded number of events, and a count of
    the rest: every refusal is accounted for, none is logged twice."""
    proxy = proxy_for(origin.port, ["allowed.test"], {})
    total = 300
    _, port = await proxy.start()
    started = time.monotonic()
    with capture_events() as events:
        try:
            for _ in range(total):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"CONNECT refused.test:443 HTTP/1.1\r\n\r\n")
                await asyncio.wait_for(reader.read(), WAIT_S)
                writer.close()
        finally:
            await proxy.stop()
    elapsed_s = time.monotonic() - started
    logged = [e for e in events if e["event"] == "egress.refused"]
    suppressed = sum(e["count"] for e in events if e["event"] == "egress.refusals_suppressed")
    assert len(logged) + suppressed == total
    assert len(logged) <= egress.REFUSALS_LOGGED_PER_S * (math.ceil(elapsed_s) + 1), len(logged)


# --- resolved addresses: only public ones are ever dialled --------------------------------

INWARD_ANSWERS = [
    ("nat64-loopback", ["64:ff9b::7f00:1"]),
    ("nat64-local-use", ["64:ff9b:1::a00:1"]),
    ("mapped-private", ["::ffff:10.0.0.1"]),
    ("sixtofour-loopback", ["2002:7f00:1::1"]),
    ("ipv4-compatible", ["::127.0.0.1"]),
    ("teredo", ["2001:0:4136:e378:8000:63bf:3fff:fdd2"]),
    ("link-local-scoped", ["fe80::1%eth0"]),
    ("ula", ["fd00::1"]),
    ("unspecified", ["0.0.0.0", "::"]),
    ("cgnat", ["100.64.0.1"]),
    ("ietf-protocol", ["192.0.0.8"]),
    ("multicast-and-broadcast", ["224.0.0.1", "255.255.255.255", "ff02::1"]),
    ("docker-dns-and-gateway", ["127.0.0.11", "172.17.0.1"]),
    ("garbage", ["not-an-address", ""]),
]  # fmt: skip


@pytest.mark.parametrize("answer", [a[1] for a in INWARD_ANSWERS],
                         ids=[a[0] for a in INWARD_ANSWERS])  # fmt: skip
async def test_names_resolving_inward_are_never_dialled(
    origin: Origin, monkeypatch: pytest.MonkeyPatch, answer: list[str]
) -> None:
    """An allowed name whose every address is local or special (in any wrapping) is refused
    with 403 and nothing is dialled; the refusal names none of the addresses."""
    dialled: list[str] = []

    async def dial(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        dialled.append(address)
        raise OSError("not dialled in this test")

    monkeypatch.setattr(egress, "_dial", dial)
    proxy = proxy_for(origin.port, ["allowed.test"], {"allowed.test": answer}, allow_private=False)
    reply = await exchange(proxy, b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert dialled == []
    assert not any(a and a.encode() in reply for a in answer if len(a) > 3), reply


# --- resources: slow names, slow readers, stalled uploads, leaked slots -------------------


async def test_slow_names_hold_few_resolver_threads_and_starve_no_one(
    origin: Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox asking for names whose lookup hangs holds at most its lookup cap of resolver
    threads, however many requests time out; another sandbox still resolves, and harombe's
    default executor stays free."""
    release = threading.Event()
    blocked = [0, 0]  # now, most at once
    lock = threading.Lock()

    def getaddrinfo(host: str, port: int) -> list[str]:
        if host == "slow.test":
            with lock:
                blocked[0] += 1
                blocked[1] = max(blocked)
            release.wait(60)
            with lock:
                blocked[0] -= 1
        return ["127.0.0.1"]

    monkeypatch.setattr(egress_resources, "_getaddrinfo", getaddrinfo)
    slow_list = Allowlist.parse(["slow.test"])
    fast_list = Allowlist.parse(["fast.test"], ports=[origin.port])
    slow = EgressProxy(lambda c: ("sandbox-slow", slow_list), allow_private=True,
                       connect_timeout_s=0.3)  # fmt: skip
    fast = EgressProxy(lambda c: ("sandbox-fast", fast_list), allow_private=True)
    _, slow_port = await slow.start()
    try:

        async def ask_slow() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", slow_port)
            writer.write(b"CONNECT slow.test:443 HTTP/1.1\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), WAIT_S)
            writer.close()
            return reply

        replies = []
        for _ in range(4):  # waves of requests, each timing out while the lookups hang
            replies += await asyncio.gather(*(ask_slow() for _ in range(10)))
        assert all(r.startswith(b"HTTP/1.1 504") for r in replies), replies[:2]
        assert blocked[1] <= egress.MAX_LOOKUPS_IN_FLIGHT, blocked
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), WAIT_S) == "free"
        reply = await exchange(fast, o("GET http://fast.test:PORT/ HTTP/1.1\r\n\r\n", origin))
        assert reply.startswith(b"HTTP/1.1 200"), reply
    finally:
        release.set()
        await slow.stop()


async def streaming_origin(pushed: list[int]) -> tuple[asyncio.Server, int]:
    """An origin that answers any connection with an endless body, counting what it pushed
    (at most 256 MiB)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = b"x" * (1 << 20)
        with contextlib.suppress(Exception):
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
            for _ in range(256):
                writer.write(chunk)
                await writer.drain()
                pushed[0] += len(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


@pytest.mark.parametrize("form", ["connect-trickling-upstream", "absolute-get"])
async def test_a_client_that_never_reads_cannot_make_the_proxy_buffer(form: str) -> None:
    """A client that never reads the response (while keeping the other direction busy, in a
    tunnel) has its connection ended after the idle timeout; the proxy never read more than a
    bounded amount from the origin for it."""
    pushed = [0]
    server, port = await streaming_origin(pushed)
    proxy = proxy_for(port, ["stream.test"], {"stream.test": ["127.0.0.1"]})
    _, proxy_port = await proxy.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy_port, limit=1024)
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            import socket as socket_module

            sock.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF, 4096)
        if form == "absolute-get":
            writer.write(f"GET http://stream.test:{port}/ HTTP/1.1\r\n\r\n".encode())
        else:
            writer.write(f"CONNECT stream.test:{port} HTTP/1.1\r\n\r\n".encode())
        cast(asyncio.Transport, writer.transport).pause_reading()  # never read the answer
        for _ in range(int(WAIT_S / 0.2)):
            if form != "absolute-get":
                with contextlib.suppress(OSError, RuntimeError):
                    writer.write(b"k")  # keep the upstream direction busy
            await asyncio.sleep(0.2)
            if proxy.connections == 0:
                break
        assert proxy.connections == 0, "the stalled connection was ended"
        assert pushed[0] < 64 << 20, f"the origin pushed {pushed[0]} bytes for one connection"
        writer.close()
    finally:
        await proxy.stop()
        server.close()


async def test_an_origin_that_never_reads_an_upload_frees_the_connection() -> None:
    """An upload to an origin that stops reading ends after the idle timeout instead of
    holding the connection (and its slot) for ever."""
    hold = asyncio.Event()

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            await hold.wait()  # never read the body
        writer.close()

    server = await asyncio.start_server(deaf, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    proxy = proxy_for(port, ["deaf.test"], {"deaf.test": ["127.0.0.1"]})
    _, proxy_port = await proxy.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"POST http://deaf.test:{port}/ HTTP/1.1\r\nContent-Length: "
                     f"{1 << 30}\r\n\r\n".encode())  # fmt: skip
        chunk = b"u" * 65536
        for _ in range(int(WAIT_S / 0.05)):
            writer.write(chunk)  # the client keeps sending; the proxy must still give up
            await asyncio.sleep(0.05)
            if proxy.connections == 0:
                break
        assert proxy.connections == 0
        writer.close()
    finally:
        hold.set()
        await proxy.stop()
        server.close()


RESOLVER_FAILURES = [  # an OSError naming an address: test_egress.py's LEAKS
    ("unicode-error", UnicodeError("label too long")),
    ("timeout-from-resolver", TimeoutError()),
]


@pytest.mark.parametrize("failure", [f[1] for f in RESOLVER_FAILURES],
                         ids=[f[0] for f in RESOLVER_FAILURES])  # fmt: skip
async def test_a_failing_resolver_gives_a_refusal_not_a_crash(
    origin: Origin, failure: Exception
) -> None:
    """Whatever the resolver raises, the client gets a 5xx refusal naming no address, and the
    connection's slots are given back."""

    async def resolve(host: str, port: int) -> list[str]:
        raise failure

    proxy = proxy_for(origin.port, ["allowed.test"], {}, resolver=resolve)
    reply = await exchange(proxy, b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
    assert reply[:10] == b"HTTP/1.1 5" and b"10.9.8.7" not in reply, reply
    assert proxy.connections == 0


async def test_every_path_returns_its_connection_budget(origin: Origin) -> None:
    """Allowed, refused, malformed, over-cap and half-open connections all give their slot of
    the process-wide budget back; two proxies share it and neither leaks into it."""
    budget = ConnectionBudget(6)
    names = {"allowed.test": ["127.0.0.1"]}
    first = proxy_for(origin.port, ["allowed.test"], names, budget=budget, max_connections=4)
    second = proxy_for(origin.port, ["allowed.test"], names, budget=budget, max_connections=4)
    ports = [(await first.start())[1], (await second.start())[1]]
    requests = [o("GET http://allowed.test:PORT/ HTTP/1.1\r\n\r\n", origin),
                b"CONNECT refused.test:443 HTTP/1.1\r\n\r\n", b"GARBAGE\r\n\r\n", b"",
                b"GET http://allowed.test/ HTTP/1.1\r\nX: "]  # fmt: skip
    try:

        async def one(port: int, request: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            if not request:
                writer.write_eof()
            reply = await asyncio.wait_for(reader.read(), WAIT_S)
            writer.close()
            return reply

        replies = await asyncio.gather(
            *(one(port, r) for port in ports for r in requests for _ in range(3))
        )
        assert any(r.startswith(b"HTTP/1.1 503") for r in replies), "the caps bind"
        for _ in range(100):
            if budget.in_use == 0 and first.connections == second.connections == 0:
                break
            await asyncio.sleep(0.05)
        assert budget.in_use == 0 and first.connections == second.connections == 0
    finally:
        await first.stop()
        await second.stop()


# --- real sandboxes: other ways into the host, forged addresses, stale rules -------------

ESCAPES = [
    ("own-gateway-ssh", "tcp(GATEWAY, 22)", "'ConnectionRefusedError'"),
    ("own-gateway-docker-api", "tcp(GATEWAY, 2375)", "'ConnectionRefusedError'"),
    ("own-gateway-dns-tcp", "tcp(GATEWAY, 53)", "'ConnectionRefusedError'"),
    ("docker0-proxy-port", "tcp(DOCKER0, 3128)", "'ConnectionRefusedError'"),
    ("origins-gateway-proxy-port", "tcp(ORIGINS_GW, 3128)", "'ConnectionRefusedError'"),
    ("loopback-proxy-port", "tcp('127.0.0.1', 3128)", "'ConnectionRefusedError'"),
    ("udp-to-gateway", "udp(GATEWAY, 53)", "'no answer'"),
    ("raw-socket", "sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
     "'refused'"),
    ("packet-socket", "sock(socket.AF_PACKET, socket.SOCK_RAW, 0)", "'refused'"),
    ("add-address", "add_address()", "'refused'"),
    ("forged-freebind-neighbour", "forged(GATEWAY, 200, 15)", "'refused'"),
    ("forged-transparent-neighbour", "forged(GATEWAY, 201, 19)", "'refused'"),
    ("forged-transparent-gateway", "forged(GATEWAY, 1, 19)", "'refused'"),
    ("ipv6-link-local", "ipv6()", "'no ipv6'"),
    ("docker-dns-allowed-name", "dns('127.0.0.11', 'plain.test')", "'no answer'"),
    ("docker-dns-origin-gateway-name", "dns('127.0.0.11', 'host.docker.internal')",
     "'no answer'"),
    ("icmp-echo-gateway", "ping(GATEWAY)", "'no echo'"),
    ("icmp-echo-other-network", "ping(ORIGINS_GW)", "'no echo'"),
    ("broadcast-to-host", "udp('255.255.255.255', 53, broadcast=True)", "'no answer'"),
]  # fmt: skip

ESCAPE_HELPERS = """
import fcntl, os, socket, struct
def tcp(host, port):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, port)); return 'CONNECTED'
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
def udp(host, port, broadcast=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    try:
        if broadcast:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x01a\\x04test\\x00'
                 b'\\x00\\x01\\x00\\x01', (host, port))
        s.recvfrom(512); return 'ANSWERED'
    except OSError:
        return 'no answer'
def sock(*args):
    try:
        socket.socket(*args).close(); return 'OPENED'
    except OSError as e:
        return 'refused'
def add_address():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    req = struct.pack('16sH2s4s8s', b'eth0', socket.AF_INET, b'\\x00\\x00',
                      socket.inet_aton('10.123.0.9'), b'\\x00' * 8)
    try:
        fcntl.ioctl(s.fileno(), 0x8916, req); return 'ADDED'
    except OSError as e:
        return 'refused'
def forged(gateway, last_octet, option):
    # Claim another address of the sandbox's own network as the source (IP_FREEBIND=15, or
    # IP_TRANSPARENT=19, which gVisor lets an unprivileged process set): the proxy's way in
    # names the sandbox's true address only.
    other = gateway.rsplit('.', 1)[0] + '.' + str(last_octet)
    s = socket.socket(); s.settimeout(5)
    try:
        s.setsockopt(socket.SOL_IP, option, 1)
        s.bind((other, 0)); s.connect((gateway, 3128))
        s.sendall(b'CONNECT plain.test:80 HTTP/1.1\\r\\n\\r\\n')
        return 'SERVED' if s.recv(12).startswith(b'HTTP/1.1 200') else 'refused'
    except OSError:
        return 'refused'
def dns(server, name):
    # A query to Docker's embedded resolver (or any other): no address comes back for a name
    # (it forwards only to 127.0.0.1 inside the sandbox, where nothing answers).
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    query = b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00'
    query += b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\\x00'
    try:
        s.sendto(query + b'\\x00\\x01\\x00\\x01', (server, 53))
        reply = s.recv(512)
    except OSError:
        return 'no answer'
    return 'ANSWERED' if reply[3] & 15 == 0 and reply[6:8] != b'\\x00\\x00' else 'no answer'
def ping(host):
    # An ICMP echo, if gVisor offers unprivileged ping sockets at all: nothing answers it.
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError:
        return 'no echo'
    s.settimeout(2)
    try:
        s.sendto(b'\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00', (host, 0))
        reply = s.recv(64)
    except OSError:
        return 'no echo'
    return 'ECHO' if reply[:1] == b'\\x00' else 'no echo'
def ipv6():
    path = '/proc/net/if_inet6'
    addrs = open(path).read().split() if os.path.exists(path) else []
    if any(not a.startswith('0000') for a in addrs[::6]):
        return 'HAS IPV6 ' + ' '.join(addrs[::6])
    s = socket.socket(socket.AF_INET6); s.settimeout(5)
    try:
        s.connect(('fe80::1%eth0', 3128)); return 'CONNECTED'
    except OSError:
        return 'no ipv6'
"""


def _docker0() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True,
                         text=True).stdout.split()  # fmt: skip
    return out[out.index("inet") + 1].split("/")[0] if "inet" in out else "172.17.0.1"


@pytest.mark.parametrize(("call", "expected"), [e[1:] for e in ESCAPES],
                         ids=[e[0] for e in ESCAPES])  # fmt: skip
async def test_a_sandbox_reaches_nothing_on_the_host_but_its_proxy(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
    origins: dict[str, str],  # noqa: F811 - the fixture
    call: str,
    expected: str,
) -> None:
    """From a network-enabled gVisor sandbox: no other host port or address (own gateway,
    docker0, another network's gateway, loopback), no UDP, broadcast or IPv6 path, no raw or
    packet socket, no new or forged source address reaches anything."""
    first = await net_tools.code_execute(language="python", code="1", network_enabled=True,
                                         allowed_domains=["plain.test"])  # fmt: skip
    lease = net_tools.sandbox_manager.networks.get(first["sandbox_id"])
    assert lease is not None
    origins_gw = origins["plain.test"].rsplit(".", 1)[0] + ".1"
    expression = (
        call.replace("GATEWAY", repr(lease.gateway))
        .replace("DOCKER0", repr(_docker0()))
        .replace("ORIGINS_GW", repr(origins_gw))
    )
    with capture_events() as events:
        result = await net_tools.code_execute(language="python",
                                              code=ESCAPE_HELPERS + expression,
                                              sandbox_id=first["sandbox_id"])  # fmt: skip
    assert result["result"] == expected, result
    assert not [e for e in events if e["event"] == "egress.allowed"]


PROXY_PROBE = (
    "import os, socket\n"
    "proxy = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0]\n"
    "s = socket.socket(); s.settimeout(5)\n"
    "try:\n"
    "    s.connect((proxy, 3128)); s.sendall(b'CONNECT plain.test:80 HTTP/1.1\\r\\n\\r\\n')\n"
    "    out = s.recv(12).decode()\n"
    "except OSError as e:\n"
    "    out = type(e).__name__\n"
    "out\n"
)


async def test_a_rebound_sandbox_address_replaces_the_old_admission(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When a sandbox's network is bound to a new address (a container started again), the
    old address loses its firewall admission and the proxy's service at once: exactly one
    ACCEPT rule remains, naming the new address."""
    result = await net_tools.code_execute(language="python", code=PROXY_PROBE,
                                          network_enabled=True,
                                          allowed_domains=["plain.test"])  # fmt: skip
    assert result["result"] == "'HTTP/1.1 200'", result
    networks = net_tools.sandbox_manager.networks
    lease = networks.get(result["sandbox_id"])
    assert lease is not None and lease.client_ip
    new_address = lease.client_ip.rsplit(".", 1)[0] + ".250"

    async def moved(container_id: str, network: str) -> str:
        return new_address

    monkeypatch.setattr(networks.docker, "container_address", moved)
    box = net_tools.sandbox_manager.get(result["sandbox_id"])
    await networks.bind(result["sandbox_id"], box.container_id)
    rules = await asyncio.to_thread(subprocess.run, ["iptables", "-S", "INPUT"],
                                    capture_output=True, text=True, check=True)  # fmt: skip
    accepts = [line for line in rules.stdout.splitlines()
               if lease.bridge in line and "ACCEPT" in line]  # fmt: skip
    assert len(accepts) == 1 and f"{new_address}/32" in accepts[0], accepts
    again = await net_tools.code_execute(language="python", code=PROXY_PROBE,
                                         sandbox_id=result["sandbox_id"])  # fmt: skip
    assert again["result"] == "'ConnectionRefusedError'", again


async def test_a_network_that_cannot_be_removed_keeps_its_fence(
    net_tools: CodeExecutionTools,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the network of a sandbox whose container is still there cannot be removed (Docker
    away, endpoint still attached), its proxy stops but the bridge keeps the rules that fence
    it off the host: a host service on the gateway stays unreachable until the sweep."""
    result = await net_tools.code_execute(language="python", code="1", network_enabled=True,
                                          allowed_domains=["plain.test"])  # fmt: skip
    sandbox_id = result["sandbox_id"]
    networks = net_tools.sandbox_manager.networks
    lease = networks.get(sandbox_id)
    assert lease is not None

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    service = await asyncio.start_server(serve, lease.gateway, 0)  # a host service
    service_port = int(service.sockets[0].getsockname()[1])

    async def docker_away(network_id: str) -> None:
        raise InfrastructureError("Docker is not answering")

    try:
        with monkeypatch.context() as patch:
            patch.setattr(networks.docker, "remove_network", docker_away)
            with pytest.raises(InfrastructureError):
                await networks.detach(sandbox_id)
        code = (ESCAPE_HELPERS + f"[tcp({lease.gateway!r}, {service_port}), "
                f"tcp({lease.gateway!r}, 3128)]")  # fmt: skip
        probe = await net_tools.code_execute(language="python", code=code, sandbox_id=sandbox_id)
        assert ast.literal_eval(probe["result"]) == ["ConnectionRefusedError"] * 2, probe
    finally:
        service.close()

"""Strict HTTP/1.x request heads and bodies for the egress proxy, and the byte pump it moves
them with: no policy.

The proxy forwards exactly one request per connection, so it must agree with the origin on
where that request ends and on which host it is for. Anything two parsers could read in two
ways is refused rather than guessed at:

* lines end in CRLF only; no bare CR or LF, no NUL or other control characters, no obs-fold
  (a header line that starts with white space), no white space before a header's colon;
* the request line is exactly ``METHOD SP target SP HTTP/1.0|1.1``;
* ``CONNECT`` takes ``host:port``; everything else takes an absolute ``http://`` URL without
  user info or fragment;
* at most one ``Host`` header, and it must name the target's host and port;
* ``Transfer-Encoding`` and ``Content-Length`` together, several ``Content-Length`` headers,
  a ``Content-Length`` that is not plain digits, or any transfer coding but ``chunked``;
* heads over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADER_LINES`.

Every refusal is a :class:`BadRequest` whose text names only what was wrong, never an address.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from harombe.security.policy.netpolicy import normalize_host

#: Largest request head (request line and headers) the proxy reads; larger gets 431.
MAX_HEAD_BYTES = 32 * 1024
#: Most header lines in one request head.
MAX_HEADER_LINES = 100
#: Longest chunk-size line (with extensions) or trailer line in a chunked body.
MAX_CHUNK_LINE_BYTES = 1024

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # controls but HTAB (CR/LF split already)
_TARGET_BYTES = re.compile(rb"[\x21-\x7e]+")
_AUTHORITY = re.compile(r"(?P<host>[^:\[\]@/\\]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
#: Hop-by-hop headers: meant for the proxy, never forwarded (``Upgrade``/``HTTP2-Settings``
#: would turn the connection into something the proxy no longer reads: h2c smuggling).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                        "proxy-authenticate", "te", "trailer", "upgrade", "http2-settings",
                        "host"})  # fmt: skip


class BadRequest(Exception):
    """A request the proxy will not forward; ``str()`` is safe to show the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class RequestHead:
    """One parsed request head. ``host``/``port`` are the authority the policy checks."""

    method: str
    version: str
    host: str
    port: int
    path: str  # origin-form target for forwarded requests; "" for CONNECT
    headers: tuple[tuple[str, str], ...]
    body_length: int | None = None  # Content-Length, when given
    chunked: bool = False

    @property
    def connect(self) -> bool:
        return self.method == "CONNECT"

    def origin_request(self, host: str) -> bytes:
        """The head to send the origin: origin-form target, ``Host`` set to the checked
        authority (``host``, normalised, and the port), hop-by-hop headers removed,
        ``Connection: close``."""
        named: set[str] = set()  # headers the client marked hop-by-hop in Connection
        for name, value in self.headers:
            if name.lower() == "connection":
                named |= {part.strip().lower() for part in value.split(",")}
        drop = HOP_BY_HOP | (named - {"transfer-encoding", "content-length"})
        authority = host if self.port == 80 else f"{host}:{self.port}"
        lines = [f"{self.method} {self.path} {self.version}", f"Host: {authority}"]
        lines += [f"{n}: {v}" for n, v in self.headers if n.lower() not in drop]
        lines += ["Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1")


def parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` → (host, port). The host is returned as written (brackets removed);
    whether it is a usable name is the policy's question."""
    match = _AUTHORITY.fullmatch(text)
    if match is None:
        raise BadRequest(400, "malformed host or port in the request target")
    port_text = match["port"]
    if port_text is None:
        if default_port is None:
            raise BadRequest(400, "CONNECT needs host:port")
        port = default_port
    else:
        port = int(port_text)
    if not 0 < port < 65536:
        raise BadRequest(400, "port out of range")
    return match["host"].strip("[]"), port


def parse_head(data: bytes) -> RequestHead:
    """Parse a request head that ends in an empty line; see the module docstring."""
    if len(data) > MAX_HEAD_BYTES:
        raise BadRequest(431, "request head too large")
    if not data.endswith(b"\r\n\r\n"):
        raise BadRequest(400, "request head does not end with an empty line")
    lines = data[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADER_LINES:
        raise BadRequest(431, "too many header lines")
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise BadRequest(400, "bare CR or LF in the request head")
        if _BAD_BYTES.search(line):
            raise BadRequest(400, "control character in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET_BYTES.fullmatch(parts[1]):
        raise BadRequest(400, "malformed request line")
    method, target, version = (p.decode("ascii", "replace") for p in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are proxied")
    headers = _headers(lines[1:])
    if method == "CONNECT":
        host, port = parse_authority(target, None)
        path = ""
    else:
        host, port, path = _absolute_http(target)
    _check_host_headers(headers, host, port)
    length, chunked = _framing(headers, version, connect=method == "CONNECT")
    return RequestHead(method, version, host, port, path, headers, length, chunked)


def _headers(lines: list[bytes]) -> tuple[tuple[str, str], ...]:
    out = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise BadRequest(400, "folded header line (obs-fold) refused")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "malformed header line")
        out.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
    return tuple(out)


def _absolute_http(target: str) -> tuple[str, int, str]:
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise BadRequest(400, "only absolute http:// URLs and CONNECT are proxied")
    end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            end = min(end, index)
    authority, path = rest[:end], rest[end:]
    if "@" in authority:
        raise BadRequest(400, "user info in the URL is refused")
    if "#" in path:
        raise BadRequest(400, "fragment in the request target is refused")
    host, port = parse_authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def _same_host(a: str, b: str) -> bool:
    try:
        return normalize_host(a) == normalize_host(b)
    except ValueError:
        return False


def _check_host_headers(headers: tuple[tuple[str, str], ...], host: str, port: int) -> None:
    values = [v for n, v in headers if n.lower() == "host"]
    if len(values) > 1:
        raise BadRequest(400, "more than one Host header")
    if values:
        try:
            given_host, given_port = parse_authority(values[0], port)
        except BadRequest:
            raise BadRequest(400, "malformed Host header") from None
        if not _same_host(given_host, host) or given_port != port:
            raise BadRequest(400, "the Host header names another host than the request target")


def _framing(
    headers: tuple[tuple[str, str], ...], version: str, *, connect: bool
) -> tuple[int | None, bool]:
    lengths = [v for n, v in headers if n.lower() == "content-length"]
    codings = [v for n, v in headers if n.lower() == "transfer-encoding"]
    if connect and (lengths or codings):
        raise BadRequest(400, "CONNECT with a body is refused")
    if lengths and codings:
        raise BadRequest(400, "both Content-Length and Transfer-Encoding (request smuggling)")
    if len(lengths) > 1:
        raise BadRequest(400, "more than one Content-Length header")
    if len(codings) > 1:
        raise BadRequest(400, "more than one Transfer-Encoding header")
    if codings:
        if version == "HTTP/1.0" or codings[0].strip().lower() != "chunked":
            raise BadRequest(501, "only Transfer-Encoding: chunked is supported")
        return None, True
    if lengths:
        if not re.fullmatch(r"[0-9]{1,15}", lengths[0]):
            raise BadRequest(400, "Content-Length must be plain digits")
        return int(lengths[0]), False
    return None, False


async def copy_body(
    head: RequestHead,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    idle_timeout_s: float,
) -> None:
    """Copy exactly the request's body (by Content-Length or chunked framing) from ``reader``
    to ``writer``; nothing after it. Malformed chunking raises :class:`BadRequest`; a side
    that moves no byte for ``idle_timeout_s`` raises TimeoutError."""
    body = _Body(reader, writer, idle_timeout_s)
    if head.body_length is not None:
        await body.copy(head.body_length)
    elif head.chunked:
        await body.copy_chunked()


class _Body:
    """One request body on its way from client to origin (see :func:`copy_body`)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle_timeout_s: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_timeout_s = idle_timeout_s

    async def copy(self, n: int) -> None:
        """Copy exactly ``n`` bytes."""
        while n > 0:
            data = await asyncio.wait_for(self.reader.read(min(n, 65536)), self.idle_timeout_s)
            if not data:
                raise BadRequest(400, "request body ended early")
            self.writer.write(data)
            # An origin that stops reading the upload ends it (TimeoutError) rather than
            # holding the connection, or more of the body in memory, indefinitely.
            await asyncio.wait_for(self.writer.drain(), self.idle_timeout_s)
            n -= len(data)

    async def line(self) -> bytes:
        """One CRLF-terminated chunk-size or trailer line, CRLF included."""
        try:
            data = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), self.idle_timeout_s)
        except asyncio.LimitOverrunError:
            raise BadRequest(400, "chunk line too long") from None
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "request body ended early") from None
        if len(data) > MAX_CHUNK_LINE_BYTES or b"\r" in data[:-2] or b"\n" in data[:-2]:
            raise BadRequest(400, "malformed chunk line")
        return data

    async def copy_chunked(self) -> None:
        """Copy chunks up to and including the last one, its trailers and the empty line."""
        while True:
            size_line = await self.line()
            size_text = size_line[:-2].split(b";", 1)[0]
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", size_text):
                raise BadRequest(400, "malformed chunk size")
            self.writer.write(size_line)
            size = int(size_text, 16)
            if size == 0:
                break
            await self.copy(size)
            if await self.line() != b"\r\n":
                raise BadRequest(400, "chunk data not followed by CRLF")
            self.writer.write(b"\r\n")
        for _ in range(MAX_HEADER_LINES + 1):  # trailers, then the empty line
            trailer = await self.line()
            self.writer.write(trailer)
            if trailer == b"\r\n":
                await asyncio.wait_for(self.writer.drain(), self.idle_timeout_s)
                return
        raise BadRequest(431, "too many trailer lines")


def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a connection; one whose peer left data unread is aborted, since a plain close
    would keep its socket open until the peer reads (possibly never)."""
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()
    else:
        writer.close()


async def pipe(
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    idle_timeout_s: float,
    *,
    busy: Callable[[], bool] = lambda: False,
) -> None:
    """Copy each reader to its writer until EOF, or until no byte has moved in any direction
    for ``idle_timeout_s`` while ``busy()`` (other work on the connection, such as an upload)
    is false. A receiver that takes no byte for ``idle_timeout_s`` ends the whole connection:
    nothing more is read for it, so what the proxy holds for a connection stays bounded (one
    read and the writer's buffer) however long a client leaves a response unread while it
    keeps the other direction busy."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_timeout_s):
                        data = await src.read(65536)
                except TimeoutError:
                    if loop.time() - last[0] >= idle_timeout_s and not busy():
                        return
                    continue
                if not data:
                    break
                dst.write(data)
                try:
                    async with asyncio.timeout(idle_timeout_s):
                        await dst.drain()
                except TimeoutError:
                    raise _Stalled from None
                last[0] = loop.time()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.write_eof()

    tasks = [asyncio.ensure_future(pump(src, dst)) for src, dst in pairs]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if any(not t.cancelled() and t.exception() is not None for t in done):
            for _src, dst in pairs:  # a stalled receiver: end both directions at once
                dst.transport.abort()
        if pending:
            await asyncio.wait(pending)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class _Stalled(Exception):
    """A receiver took no byte for the idle timeout."""

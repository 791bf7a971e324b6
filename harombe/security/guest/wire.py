"""The supervisor protocol's frames: one codec for the host, the supervisor and the Python worker.

A frame is ``[u32 json_len][u32 blob_len][json object][blob bytes]`` with big-endian lengths.
The JSON is compact ASCII; the blob is raw bytes (code, file contents, output). The host
imports this module (``harombe.security.runtime.channel``), and it is the first part of the
supervisor's and of the Python worker's sources (see ``__init__.py``), so it is standard
library only, runs on Python 3.8+, and imports nothing costly: under gVisor every module a
fresh interpreter imports is read through the gofer, and the ``json`` package (which pulls in
``re``, ``enum``, ``functools``…) would cost a cold sandbox tens of milliseconds. The C halves
suffice: ``_json``'s scanner parses and a dozen lines encode the few types the protocol uses.
The JavaScript worker (``jsworker.js``) writes the same frames with code of its own.

Whoever reads frames from a less trusted side caps them: :class:`FrameDecoder` checks both
lengths as soon as a header is in, before buffering the body, and raises
:class:`ProtocolError` for a frame over the caps, not JSON, or not a JSON object.
"""

import struct

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it; other Pythons use json
    _json = None  # type: ignore[assignment]

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations stay strings: the sandbox never imports typing (costly there)
    from typing import Any

HEADER = struct.Struct(">II")
#: Default cap on a frame's JSON: replies are a few fields, a result's repr, a listing.
MAX_JSON_BYTES = 8 * 1024 * 1024
#: Default cap on a frame's blob: a 64 MiB file or output, and room for the rest.
MAX_BLOB_BYTES = 65 * 1024 * 1024
#: Cap on the images one Python call sends back (PNG bytes, all images together); past it an
#: image is dropped with a warning. The host's cap on a ``done`` frame's blob counts it.
MAX_ARTIFACT_BYTES = 10 * 1024 * 1024


#: Objects and arrays one capped frame may open: a 10,000-entry listing opens 10,002. Each
#: costs the decoding side 56-64 bytes from 2 bytes of JSON, so without a count a frame of
#: ``[{},{},…]`` within the byte cap would cost it a few hundred megabytes.
MAX_CONTAINERS = 50000


def containers(text: bytes) -> int:
    """How many objects and arrays the JSON ``text`` opens (brackets inside strings aside).

    Counted with ``bytes.count`` first; only a text over :data:`MAX_CONTAINERS` that way is
    walked string by string, which is linear in its quotes."""
    total = text.count(b"{") + text.count(b"[")
    if total <= MAX_CONTAINERS:
        return total
    find, pos = text.find, 0
    while True:
        start = find(b'"', pos)
        if start < 0:
            return total
        end = start
        while True:  # the closing quote: one preceded by an even run of backslashes
            end = find(b'"', end + 1)
            if end < 0:
                return total  # unterminated: the JSON decoder refuses it anyway
            run = end - 1
            while text[run] == 0x5C:
                run -= 1
            if (end - 1 - run) % 2 == 0:
                break
        total -= text.count(b"{", start, end) + text.count(b"[", start, end)
        pos = end + 1


class ProtocolError(Exception):
    """The other side sent something outside the protocol (too large, or not a JSON object)."""


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # "NaN", "Infinity", "-Infinity", as json.loads reads them
    memo = None


if _json is not None:
    _scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
    _quote = _json.encode_basestring_ascii
else:  # pragma: no cover
    import json as _stdjson

    _scan = None
    _quote = _stdjson.encoder.encode_basestring_ascii


def loads(data: "bytes | str") -> "Any":
    """Parse one JSON document (UTF-8 bytes or str); raises on anything else."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if _scan is None:  # pragma: no cover
        return _stdjson.loads(text)
    value, end = _scan(text, 0)
    if text[end:].strip():
        raise ValueError("extra data after JSON value")
    return value


def _encode(obj: object, out: "list[str]") -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_quote(obj))
    elif isinstance(obj, int):
        out.append(int.__repr__(obj))
    elif isinstance(obj, float):
        finite = obj == obj and obj not in (float("inf"), float("-inf"))
        out.append(float.__repr__(obj) if finite else "null")
    elif isinstance(obj, dict):
        out.append("{")
        for i, (key, value) in enumerate(obj.items()):
            if i:
                out.append(",")
            out.append(_quote(str(key)))
            out.append(":")
            _encode(value, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, value in enumerate(obj):
            if i:
                out.append(",")
            _encode(value, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(obj)!r}")


def dumps(obj: object) -> bytes:
    """Compact ASCII JSON of dicts, lists, strings, numbers, booleans and None, as bytes.

    A NaN or infinite float is written as ``null``: the output is always strict JSON."""
    out: list[str] = []
    _encode(obj, out)
    return "".join(out).encode("ascii")


def encode(msg: "dict[str, Any]", blob: bytes = b"") -> bytes:
    """One frame: ``msg`` as JSON, then ``blob``."""
    data = dumps(msg)
    return HEADER.pack(len(data), len(blob)) + data + blob


class FrameDecoder:
    """Turns a byte stream into ``(message, blob)`` frames, refusing any frame over the caps.

    The lengths are checked as soon as the header is in, so a header that claims gigabytes
    costs nothing: the buffer never holds more than one capped frame plus one read. A cap of
    ``None`` is no cap (for a side that reads only the host, which is trusted).
    """

    def __init__(
        self,
        *,
        max_json_bytes: "int | None" = MAX_JSON_BYTES,
        max_blob_bytes: "int | None" = MAX_BLOB_BYTES,
    ) -> None:
        self._buf = bytearray()
        self._max_json_bytes = max_json_bytes
        self._max_blob_bytes = max_blob_bytes

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buf)

    def add(self, data: bytes) -> None:
        """Buffer ``data``; :meth:`next_frame` returns the frames it completes."""
        self._buf += data

    def next_frame(self) -> "tuple[dict[str, Any], bytes] | None":
        """The next complete frame, or None until more bytes arrive.

        Raises :class:`ProtocolError` for a frame over the caps (as soon as its header is
        in), not JSON, or not a JSON object; the decoder is of no further use then."""
        buf = self._buf
        if len(buf) < HEADER.size:
            return None
        jlen, blen = HEADER.unpack_from(buf)
        max_json, max_blob = self._max_json_bytes, self._max_blob_bytes
        if (max_json is not None and jlen > max_json) or (max_blob is not None and blen > max_blob):
            raise ProtocolError(
                f"a frame of {jlen} + {blen} bytes, over the caps of {max_json} (JSON) and "
                f"{max_blob} (blob)"
            )
        end = HEADER.size + jlen + blen
        if len(buf) < end:
            return None
        text = bytes(buf[HEADER.size : HEADER.size + jlen])
        if max_json is not None and containers(text) > MAX_CONTAINERS:
            raise ProtocolError(f"a frame that opens over {MAX_CONTAINERS} objects and arrays")
        try:
            msg = loads(text)
        except Exception as exc:  # noqa: BLE001 - _json raises StopIteration or SystemError too
            raise ProtocolError(f"a frame that is not JSON ({exc})") from None
        if type(msg) is not dict:
            raise ProtocolError(f"a frame that is not a JSON object ({type(msg).__name__})")
        blob = bytes(buf[HEADER.size + jlen : end])
        del buf[:end]
        return msg, blob

    def feed(self, data: bytes) -> "list[tuple[dict[str, Any], bytes]]":
        """The frames completed by ``data``; raises :class:`ProtocolError` on a bad one."""
        self.add(data)
        frames: list[tuple[dict[str, Any], bytes]] = []
        while True:
            frame = self.next_frame()
            if frame is None:
                return frames
            frames.append(frame)

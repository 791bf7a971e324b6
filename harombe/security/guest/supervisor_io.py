"""JSON frames and an epoll selector for the in-sandbox supervisor, without costly imports.

The first part of the supervisor's source (see ``supervisor.py``). Under gVisor every module a
fresh interpreter imports is read through the gofer, so the ``json`` package (which pulls in
``re``, ``enum``, ``functools``…) and ``selectors`` (``collections.abc``) cost a cold sandbox
tens of milliseconds. The C halves suffice: ``_json``'s scanner parses, a dozen lines encode
the few types the protocol uses, and ``select.epoll`` does the waiting.
"""

import select

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it; other Pythons use json
    _json = None

EVENT_READ = 1
EVENT_WRITE = 2


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float
    memo = None


if _json is not None:
    _scan = _json.make_scanner(_ScanContext())
    _quote = _json.encode_basestring_ascii
else:  # pragma: no cover
    import json as _stdjson

    _scan = None
    _quote = _stdjson.encoder.encode_basestring_ascii


def loads(data):
    """Parse one JSON document (bytes or str)."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if _scan is None:  # pragma: no cover
        return _stdjson.loads(text)
    value, end = _scan(text, 0)
    if text[end:].strip():
        raise ValueError("extra data after JSON value")
    return value


def _encode(obj, out):
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
        out.append(
            float.__repr__(obj)
            if obj == obj and obj not in (float("inf"), float("-inf"))
            else "null"
        )
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
        raise TypeError("cannot encode %r" % (type(obj),))


def dumps(obj):
    """Compact ASCII JSON of dicts, lists, strings, numbers, booleans and None, as bytes."""
    out = []
    _encode(obj, out)
    return "".join(out).encode("ascii")


class _Key:
    __slots__ = ("fd", "events", "data")

    def __init__(self, fd, events, data):
        self.fd = fd
        self.events = events
        self.data = data


class Selector:
    """The subset of ``selectors.EpollSelector`` the supervisor uses."""

    def __init__(self):
        self._epoll = select.epoll()
        self._keys = {}

    def register(self, fd, events, data=None):
        if fd in self._keys:
            raise KeyError("fd %d is already registered" % fd)
        mask = (select.EPOLLIN if events & EVENT_READ else 0) | (
            select.EPOLLOUT if events & EVENT_WRITE else 0
        )
        self._epoll.register(fd, mask)
        self._keys[fd] = _Key(fd, events, data)

    def unregister(self, fd):
        key = self._keys.pop(fd)  # KeyError when not registered, as selectors does
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        return key

    def select(self, timeout=None):
        try:
            ready = self._epoll.poll(-1 if timeout is None else max(timeout, 0))
        except InterruptedError:
            return []
        events = []
        for fd, mask in ready:
            key = self._keys.get(fd)
            if key is not None:
                got = (
                    EVENT_READ if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR) else 0
                ) | (
                    EVENT_WRITE
                    if mask & (select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR)
                    else 0
                )
                if got & key.events:
                    events.append((key, got & key.events))
        return events

"""How a sandbox writes a ``@sandbox`` call's answer: a tree of JSON with type tags.

This module runs *inside* the sandbox (it is shipped in the prepared sandbox's library zip as
``harombe_encode``, so it imports nothing but the standard library) and in the host's tests. The
host never trusts what it writes: :mod:`harombe.decorator_decode` reads it with its own limits.

An *answer* is one JSON object, an *envelope*: ``{"kind": "return", "value": <node>}``, or
``{"kind": "raise", "error_type", "message", "traceback"}``, ``{"kind": "unencodable", "type",
"message"}``, ``{"kind": "too_large", "type", "bytes"}`` or ``{"kind": "version", "version"}``.
A *node* is ``null``, ``true``/``false``, a string, a finite float, an int of at most
:data:`MAX_INT_DIGITS` digits, a JSON array (a ``list``) or a *tagged* object with exactly one
key, the tag (see :data:`TAGS`). The format is a tree: a value that refers to itself cannot be
written, and one referred to twice is written twice (so the answer's size bounds the value's).
A value that cannot be written raises ``TypeError`` saying why, inside :func:`answer` (this
module defines no exception class: in the sandbox it has no :mod:`harombe.errors`).
"""

import base64
import collections
import datetime
import decimal
import fractions
import json
import uuid
from typing import Any

#: Deepest nesting of containers an answer may hold.
MAX_DEPTH = 200
#: Most values (scalars and containers) an answer may hold.
MAX_NODES = 10_000_000
#: Longest int, in decimal digits (the interpreter's own default limit for int <-> str).
MAX_INT_DIGITS = 4300
MAX_INT_BITS = (10**MAX_INT_DIGITS - 1).bit_length()
#: Tag → the type it stands for (the payload is described beside each).
TAGS = {
    "d": "dict with str keys ({key: node})",
    "m": "dict with other keys ([key, value, key, value, ...])",
    "t": "tuple ([node, ...])",
    "s": "set ([node, ...])",
    "fs": "frozenset ([node, ...])",
    "b": "bytes (base64 text)",
    "ba": "bytearray (base64 text)",
    "f": 'float that JSON has no number for ("nan", "inf" or "-inf")',
    "c": "complex ([real, imag])",
    "dt": "datetime ([year, month, day, hour, minute, second, microsecond, fold, tz])",
    "date": "date ([year, month, day])",
    "time": "time ([hour, minute, second, microsecond, fold, tz])",
    "td": "timedelta ([days, seconds, microseconds])",
    "tz": "timezone ([timedelta, name or null])",
    "dec": "Decimal (its str)",
    "fr": "Fraction ([numerator, denominator])",
    "u": "UUID (32 hex digits)",
    "od": "OrderedDict ([key, value, ...])",
    "dd": "defaultdict ([factory name, key, value, ...])",
    "dq": "deque ([maxlen or null, item, ...])",
    "ctr": "Counter ([key, value, ...])",
    "el": "Ellipsis (0)",
}
#: The ``default_factory`` a defaultdict may have, by name.
FACTORIES = {f.__name__: f for f in (list, dict, set, int, float, str, bytes, tuple, frozenset)}


_JSON_SCALARS = frozenset({type(None), bool, str, int, float})
_BIG = 10**300  # ints and finite floats below it in size are written as JSON numbers
_SIMPLE: dict[type, str] = {tuple: "t", set: "s", frozenset: "fs"}
_MAPPINGS: dict[type, str] = {collections.OrderedDict: "od", collections.Counter: "ctr"}


class _Writer:
    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.nodes = 0
        self.size_bytes = 0
        self.active: set[int] = set()

    def count(self, size_bytes: int = 1) -> None:
        self.nodes += 1
        self.size_bytes += size_bytes
        if self.nodes > MAX_NODES:
            raise TypeError(f"it holds more than {MAX_NODES} values")
        if self.size_bytes > self.cap_bytes:
            raise OverflowError("over the cap")

    def node(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if value is None or kind is bool:
            self.count()
            return value
        if kind is str:
            self.count(len(value))
            return value
        if kind is int:
            self.count(value.bit_length() // 3)
            if value.bit_length() > MAX_INT_BITS:
                raise TypeError(f"it holds an int of more than {MAX_INT_DIGITS} digits")
            return value
        if kind is float:
            self.count()
            return value if value - value == 0 else {"f": repr(value)}
        if kind in (bytes, bytearray):
            self.count(len(value) * 4 // 3)
            text = base64.b64encode(value).decode("ascii")
            return {"b" if kind is bytes else "ba": text}
        if depth >= MAX_DEPTH:
            raise TypeError(f"it is nested more than {MAX_DEPTH} levels deep")
        if id(value) in self.active:
            raise TypeError(f"a {kind.__qualname__} in it contains itself")
        self.active.add(id(value))
        try:
            self.count()
            return self.tagged(value, kind, depth + 1)
        finally:
            self.active.discard(id(value))

    def items(self, values: Any, depth: int) -> list[Any]:
        plain = self.plain(values)
        return plain if plain is not None else [self.node(item, depth) for item in values]

    def plain(self, values: Any) -> list[Any] | None:
        """``values`` as a list when each is a scalar JSON writes as is (a fast path)."""
        items = list(values)
        if not all(type(v) in _JSON_SCALARS for v in items):
            return None
        if not all(-_BIG < v < _BIG for v in items if type(v) in (int, float)):
            return None  # a huge int or a float JSON has no number for: the tagged path
        self.nodes += len(items)
        self.size_bytes += 2 * len(items) + sum(len(v) for v in items if type(v) is str)
        if self.nodes > MAX_NODES or self.size_bytes > self.cap_bytes:
            self.count(0)  # raises
        return items

    def pairs(self, mapping: Any, depth: int) -> list[Any]:
        out: list[Any] = []
        for key, item in mapping.items():
            out += (self.node(key, depth), self.node(item, depth))
        return out

    def tagged(self, value: Any, kind: type, depth: int) -> Any:
        if kind is list:
            return self.items(value, depth)
        if kind is dict:
            if all(type(key) is str for key in value):
                plain = self.plain(value.values())
                if plain is not None:
                    self.size_bytes += sum(map(len, value))
                    return {"d": dict(zip(value, plain, strict=True))}
                return {"d": {k: self.node(v, depth) for k, v in value.items()}}
            return {"m": self.pairs(value, depth)}
        simple = _SIMPLE.get(kind)
        if simple is not None:
            return {simple: self.items(value, depth)}
        if kind is complex:
            return {"c": self.items((value.real, value.imag), depth)}
        mapping = _MAPPINGS.get(kind)
        if mapping is not None:
            return {mapping: self.pairs(value, depth)}
        if kind is collections.defaultdict:
            factory = value.default_factory
            if factory is not None and FACTORIES.get(factory.__name__) is not factory:
                raise TypeError("it holds a defaultdict whose factory is not a builtin type")
            name = None if factory is None else factory.__name__
            return {"dd": [name, *self.pairs(value, depth)]}
        if kind is collections.deque:
            return {"dq": [value.maxlen, *self.items(value, depth)]}
        return self.other(value, kind, depth)

    def other(self, v: Any, kind: type, depth: int) -> Any:
        if kind is datetime.datetime:
            fields = [v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, v.fold]
            return {"dt": [*fields, self.node(v.tzinfo, depth)]}
        if kind is datetime.date:
            return {"date": [v.year, v.month, v.day]}
        if kind is datetime.time:
            fields = [v.hour, v.minute, v.second, v.microsecond, v.fold]
            return {"time": [*fields, self.node(v.tzinfo, depth)]}
        if kind is datetime.timedelta:
            return {"td": [v.days, v.seconds, v.microseconds]}
        if kind is datetime.timezone:
            offset = v.utcoffset(None)
            name = v.tzname(None)
            named = None if v is datetime.UTC else name
            return {"tz": [self.node(offset, depth), named]}
        if kind is decimal.Decimal:
            return {"dec": str(v)}
        if kind is fractions.Fraction:
            return {"fr": [self.node(v.numerator, depth), self.node(v.denominator, depth)]}
        if kind is uuid.UUID:
            return {"u": v.hex}
        if v is Ellipsis:
            return {"el": 0}
        raise TypeError(
            f"it holds a {kind.__module__}.{kind.__qualname__}, which is not plain data"
        )


def answer(value: object, cap_bytes: int) -> bytes:
    """The answer for a call that returned ``value``: a ``return`` envelope, or an
    ``unencodable`` / ``too_large`` one saying why it cannot cross (at most ``cap_bytes``)."""
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
    writer = _Writer(cap_bytes)
    try:
        data = envelope({"kind": "return", "value": writer.node(value, 0)})
    except OverflowError:
        return envelope({"kind": "too_large", "type": name, "bytes": writer.size_bytes})
    except (TypeError, ValueError, RecursionError) as exc:  # TypeError: why it is not data
        return envelope({"kind": "unencodable", "type": name, "message": str(exc)[:500]})
    if len(data) > cap_bytes:
        return envelope({"kind": "too_large", "type": name, "bytes": len(data)})
    return data


def envelope(fields: dict[str, object]) -> bytes:
    """``fields`` as the bytes of an answer (compact JSON, UTF-8, lone surrogates kept)."""
    text = json.dumps(fields, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")

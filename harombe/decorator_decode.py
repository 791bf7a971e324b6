"""How the host reads a ``@sandbox`` call's answer, which a hostile sandbox may have forged.

The answer is JSON in the tagged tree format of :mod:`harombe.decorator_encode`; no pickle is
involved, so nothing in it can name a host object, call a function or share a reference.
:func:`loads_answer` parses it with the standard library's JSON decoder (strict: no ``NaN``
constants; nesting past the interpreter's recursion limit is refused) and rebuilds the
``return`` value iteratively, with an explicit stack, under limits that keep the host's work
bounded by the answer's size: at most :data:`MAX_DEPTH` levels and :data:`MAX_NODES` values;
ints of at most :data:`MAX_INT_DIGITS` digits; ``Decimal`` exponents of at most
:data:`MAX_EXPONENT`; in each set or dict at most :data:`MAX_KEYS` keys that are not strings
and at most :data:`MAX_SAME_HASH` keys with one hash (so no insertion is quadratic). Anything
else raises :class:`~harombe.errors.SerializationError` naming what was refused.
"""

from __future__ import annotations

import base64
import collections
import datetime
import decimal
import fractions
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

from harombe.decorator_encode import FACTORIES, MAX_DEPTH, MAX_INT_DIGITS, MAX_NODES
from harombe.errors import SerializationError

#: Largest adjusted decimal exponent a returned ``Decimal`` may have.
MAX_EXPONENT = 4300
#: Most keys that are not strings in one set, frozenset or dict.
MAX_KEYS = 1_000_000
#: Most keys with the same hash in one set, frozenset or dict.
MAX_SAME_HASH = 32
_SCALARS = (type(None), bool, int, float, str)
_HINT = "; return plain data (see the @sandbox documentation), e.g. a dict or array.tolist()"


def _refuse(what: str) -> SerializationError:
    return SerializationError(f"the sandbox's answer holds {what}, which the host refuses{_HINT}")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _refuse(f"an int of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _no_constant(name: str) -> Any:
    raise _refuse(f"the JSON constant {name} (floats that are not numbers are tagged)")


def loads_answer(data: bytes) -> Any:
    """The envelope in ``data`` (a JSON object, else whatever JSON it is), with a ``return``
    envelope's ``value`` rebuilt (see the module docstring); a SerializationError otherwise."""
    limit = sys.get_int_max_str_digits()
    fast = 0 < limit <= MAX_INT_DIGITS  # the decoder's own int() refuses longer ints
    try:
        text = data.decode("utf-8", "surrogatepass")
        envelope = json.loads(text, parse_constant=_no_constant,
                              parse_int=None if fast else _parse_int)  # fmt: skip
    except SerializationError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SerializationError(
            f"the sandbox's answer is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})"
            f"{_HINT}"
        ) from None
    if isinstance(envelope, dict) and envelope.get("kind") == "return" and "value" in envelope:
        envelope["value"] = decode_value(envelope["value"])
    return envelope


class _Frame:
    """A container being rebuilt: its builder, its raw children, and those decoded so far."""

    __slots__ = ("build", "children", "depth", "done")

    def __init__(self, build: Callable[[list[Any]], Any], children: list[Any], depth: int):
        self.build, self.children, self.depth = build, children, depth
        self.done: list[Any] = []


def decode_value(raw: Any) -> Any:
    """The value of a parsed JSON node (iterative; see the module docstring)."""
    nodes = 0
    stack = [_Frame(lambda done: done[0], [raw], 0)]
    while True:
        frame = stack[-1]
        if len(frame.done) == len(frame.children):
            stack.pop()
            value = frame.build(frame.done)
            if not stack:
                return value
            stack[-1].done.append(value)
            continue
        children, done = frame.children, frame.done
        start = index = len(done)
        while index < len(children) and type(children[index]) in _SCALARS:
            done.append(children[index])  # scalars: already what they stand for
            index += 1
        nodes += index - start + 1
        if nodes > MAX_NODES:
            raise _refuse(f"more than {MAX_NODES} values")
        if index == len(children):
            continue
        child = children[index]
        build, children = _open(child)
        if build is None:  # a leaf: the value itself
            frame.done.append(children)
            continue
        if frame.depth >= MAX_DEPTH:
            raise _refuse(f"containers nested more than {MAX_DEPTH} levels deep")
        if type(child) is list and all(type(item) in _SCALARS for item in child):
            nodes += len(child)  # a list of scalars: already what it stands for
            if nodes > MAX_NODES:
                raise _refuse(f"more than {MAX_NODES} values")
            frame.done.append(child)
        else:
            stack.append(_Frame(build, children, frame.depth + 1))


def _same(done: list[Any]) -> Any:
    return done


def _open(raw: Any) -> tuple[Callable[[list[Any]], Any] | None, Any]:
    """How to rebuild a container node (its builder and raw children), or ``(None, value)``
    for a tagged leaf."""
    if type(raw) is list:
        return _same, raw
    if type(raw) is not dict or len(raw) != 1:
        raise _refuse("a JSON object that is not a tagged value")
    ((tag, payload),) = raw.items()
    leaf = _LEAVES.get(tag)
    if leaf is not None:
        try:
            return None, leaf(payload)
        except (TypeError, ValueError, OverflowError, ArithmeticError, LookupError):
            raise _refuse(f"a malformed {tag!r} value") from None
    if tag == "d" and type(payload) is dict:
        keys = list(payload)
        return (lambda done: dict(zip(keys, done, strict=True))), list(payload.values())
    build = _BUILDERS.get(tag)
    if build is None or type(payload) is not list:
        raise _refuse(f"an unknown tag {str(tag)[:40]!r}")
    return _guarded(tag, build), payload


def _guarded(tag: str, build: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def run(done: list[Any]) -> Any:
        try:
            return build(done)
        except SerializationError:
            raise
        except (TypeError, ValueError, OverflowError, ArithmeticError, LookupError):
            raise _refuse(f"a malformed {tag!r} value") from None

    return run


def _check_keys(keys: list[Any]) -> None:
    """At most :data:`MAX_KEYS` keys that are not strings, :data:`MAX_SAME_HASH` per hash."""
    counts: dict[int, int] = {}
    for key in keys:
        if type(key) is str:
            continue  # str hashes are randomized per process
        try:
            seen = counts.get(hash(key), 0) + 1
        except TypeError:
            raise _refuse(f"an unhashable {type(key).__name__} as a key") from None
        if seen > MAX_SAME_HASH or len(counts) >= MAX_KEYS:
            raise _refuse(f"a set or dict of more than {MAX_SAME_HASH} keys with one hash "
                          f"or {MAX_KEYS} keys that are not strings")  # fmt: skip
        counts[hash(key)] = seen


def _pairs(done: list[Any]) -> list[tuple[Any, Any]]:
    if len(done) % 2:
        raise _refuse("a mapping with a key but no value")
    keys = done[0::2]
    _check_keys(keys)
    return list(zip(keys, done[1::2], strict=True))


def _members(kind: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def build(done: list[Any]) -> Any:
        _check_keys(done)
        return kind(done)

    return build


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError("not an int")
    return value


def _tz(value: object) -> datetime.timezone | None:
    if value is not None and type(value) is not datetime.timezone:
        raise TypeError("not a timezone")
    return value


def _datetime(done: list[Any]) -> datetime.datetime:
    year, month, day, hour, minute, second, microsecond, fold = map(_int, done[:-1])
    return datetime.datetime(year, month, day, hour, minute, second, microsecond,
                             fold=fold, tzinfo=_tz(done[-1]))  # fmt: skip


def _time(done: list[Any]) -> datetime.time:
    hour, minute, second, microsecond, fold = map(_int, done[:-1])
    return datetime.time(hour, minute, second, microsecond, fold=fold, tzinfo=_tz(done[-1]))


def _timezone(done: list[Any]) -> datetime.timezone:
    offset, name = done
    if type(offset) is not datetime.timedelta or (name is not None and type(name) is not str):
        raise TypeError("not an offset and a name")
    return datetime.timezone(offset) if name is None else datetime.timezone(offset, name)


def _fraction(done: list[Any]) -> fractions.Fraction:
    numerator, denominator = map(_int, done)
    return fractions.Fraction(numerator, denominator)


def _complex(done: list[Any]) -> complex:
    real, imag = done
    if type(real) is not float or type(imag) is not float:
        raise TypeError("not two floats")
    return complex(real, imag)


def _defaultdict(done: list[Any]) -> collections.defaultdict[Any, Any]:
    name, *rest = done
    factory = None if name is None else FACTORIES.get(name if type(name) is str else "")
    if name is not None and factory is None:
        raise _refuse(f"a defaultdict whose factory is {str(name)[:40]!r}")
    return collections.defaultdict(factory, _pairs(rest))


def _deque(done: list[Any]) -> collections.deque[Any]:
    maxlen, *items = done
    return collections.deque(items, None if maxlen is None else _int(maxlen))


def _bytes(payload: object) -> bytes:
    if type(payload) is not str:
        raise TypeError("not base64 text")
    return base64.b64decode(payload, validate=True)


def _float(payload: object) -> float:
    if payload not in ("nan", "inf", "-inf"):
        raise ValueError("not nan, inf or -inf")
    return float(str(payload))


def _decimal(payload: object) -> decimal.Decimal:
    if type(payload) is not str or len(payload) > 10_000:
        raise ValueError("not a Decimal's text")
    value = decimal.Decimal(payload)
    if value.is_finite() and abs(value.adjusted()) > MAX_EXPONENT:
        raise _refuse(f"a Decimal with an exponent beyond {MAX_EXPONENT}")
    return value


def _uuid(payload: object) -> uuid.UUID:
    if type(payload) is not str or len(payload) != 32:
        raise ValueError("not 32 hex digits")
    return uuid.UUID(int=int(payload, 16))  # int() refuses non-hex; 32 digits: 128 bits


def _ellipsis(payload: object) -> Any:
    return Ellipsis


_LEAVES: dict[str, Callable[[Any], Any]] = {
    "b": _bytes, "ba": lambda p: bytearray(_bytes(p)), "f": _float, "dec": _decimal,
    "u": _uuid, "el": _ellipsis,
}  # fmt: skip
_BUILDERS: dict[str, Callable[[list[Any]], Any]] = {
    "m": lambda done: dict(_pairs(done)),
    "t": tuple,
    "s": _members(set),
    "fs": _members(frozenset),
    "c": _complex,
    "dt": _datetime,
    "date": lambda done: datetime.date(*map(_int, done)),
    "time": _time,
    "td": lambda done: datetime.timedelta(*map(_int, done)),
    "tz": _timezone,
    "fr": _fraction,
    "od": lambda done: collections.OrderedDict(_pairs(done)),
    "dd": _defaultdict,
    "dq": _deque,
    "ctr": lambda done: collections.Counter(dict(_pairs(done))),
}

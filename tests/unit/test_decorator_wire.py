"""The ``@sandbox`` wire without Docker: what crosses into a sandbox (cloudpickle), the runner
the sandbox executes (run here in a child interpreter), and the decoder that reads a hostile
sandbox's answer (tagged JSON) on the host."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import inspect
import pickle
import pickletools
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harombe.decorator_call import CallSpec, decode
from harombe.decorator_decode import MAX_SAME_HASH, loads_answer
from harombe.decorator_encode import MAX_DEPTH, answer
from harombe.decorator_encode import envelope as envelope_bytes
from harombe.decorator_wire import (
    CALL_DIR,
    CALL_PATH,
    LIBRARY_PATH,
    RESULT_PATH,
    WARMUP_CODE,
    dumps_call,
    library_zip,
    runner_code,
)
from harombe.errors import SandboxExecutionError, SerializationError

SPEC = CallSpec(name="fn", source="", is_async=False)
CAP = 1 << 20
OFFSET = 17


@dataclass
class Point:
    x: int
    y: int


def _helper(value: int) -> int:
    return value + OFFSET


def _self_list() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


SAFE_VALUES = {
    "scalars": [None, True, False, 0, -(10**300), 1.5, float("inf"), 2 + 3j, "text", "é" * 3],
    "bytes": {"b": b"\x00\xff" * 10, "ba": bytearray(b"abc")},
    "nested": {"a": [1, (2, 3), {4, 5}, frozenset({6})], "b": {"c": [[[[]]]]}},
    "datetimes": [
        datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
        datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        datetime.date(2024, 1, 2),
        datetime.time(3, 4, 5),
        datetime.timedelta(days=3, seconds=7),
    ],
    "numbers": [decimal.Decimal("1.25"), decimal.Decimal("-Infinity"), fractions.Fraction(3, 7)],
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "collections": [
        collections.OrderedDict([("b", 1), ("a", 2)]),
        collections.defaultdict(list, {"k": [1]}),
        collections.deque([1, 2, 3], maxlen=5),
        collections.Counter("hello"),
    ],
    "ellipsis": ...,
}


@pytest.mark.parametrize("value", list(SAFE_VALUES.values()), ids=list(SAFE_VALUES))
def test_plain_data_crosses_back_intact(value: object) -> None:
    """Builtin scalars and containers, datetimes, Decimal, Fraction, UUID and the collections
    types come back equal, of the same type, as the runner writes them."""
    loaded = loads_answer(answer(value, CAP))["value"]
    assert loaded == value
    assert type(loaded) is type(value)


def test_a_self_referencing_list_is_refused_in_the_sandbox() -> None:
    """Answers are trees: a list that contains itself is reported as such, not sent."""
    with pytest.raises(SerializationError, match="contains itself"):
        decode(SPEC, answer(_self_list(), CAP), CAP)


def _global_reduce(module: str, name: str, arg: str) -> bytes:
    """Protocol 0: ``module.name(arg)``, the classic code-execution pickle."""
    return f"c{module}\n{name}\n(V{arg}\ntR.".encode()


def _deep(depth: int) -> bytes:
    return b'{"kind":"return","value":' + b"[" * depth + b"]" * depth + b"}"


def _colliding_set(count: int) -> bytes:
    """A set of ints that all hash alike (multiples of 2**61 - 1)."""
    items = ",".join(str(i * ((1 << 61) - 1)) for i in range(1, count + 1))
    return b'{"kind":"return","value":{"s":[' + items.encode() + b"]}}"


def _value(node: str) -> bytes:
    return b'{"kind":"return","value":' + node.encode() + b"}"


FORGED = {
    "os.system-pickle": (_global_reduce("os", "system", "echo pwned"), "not valid JSON"),
    "eval-pickle": (_global_reduce("builtins", "eval", "1+1"), "not valid JSON"),
    "dataclass-pickle": (pickle.dumps(Point(1, 2), protocol=5), "not valid JSON"),
    "garbage": (b"\x00not json at all", "not valid JSON"),
    "truncated": (answer([1, 2, 3], CAP)[:-3], "not valid JSON"),
    "nan-constant": (_value("NaN"), "NaN"),
    "deep-1e6": (_deep(1_000_000), "not valid JSON"),
    "deep-past-cap": (_deep(MAX_DEPTH + 1), f"{MAX_DEPTH} levels"),
    "huge-int": (_value("9" * 5000), "not valid JSON"),
    "colliding-keys": (_colliding_set(MAX_SAME_HASH + 1), "with one hash"),
    "unhashable-key": (_value('{"s":[[1]]}'), "unhashable list"),
    "untagged-object": (_value('{"a":1,"b":2}'), "not a tagged value"),
    "unknown-tag": (_value('{"os.system":["true"]}'), "unknown tag"),
    "bad-base64": (_value('{"b":"!!"}'), "malformed 'b'"),
    "decimal-exponent": (_value('{"dec":"1e999999999"}'), "exponent beyond"),
    "fraction-zero": (_value('{"fr":[1,0]}'), "malformed 'fr'"),
    "eval-factory": (_value('{"dd":["eval"]}'), "factory is 'eval'"),
    "uuid-not-hex": (_value('{"u":"' + "z" * 32 + '"}'), "malformed 'u'"),
    "uuid-too-long": (_value('{"u":"' + "f" * 33 + '"}'), "malformed 'u'"),
    "uuid-negative": (_value('{"u":"-' + "f" * 31 + '"}'), "malformed 'u'"),
    "datetime-junk": (_value('{"dt":[[1],2,3]}'), "malformed 'dt'"),
    "datetime-huge": (_value('{"td":[' + "9" * 4000 + ",0,0]}"), "malformed 'td'"),
    "tz-not-offset": (_value('{"tz":[1,null]}'), "malformed 'tz'"),
    "complex-str": (_value('{"c":["1","2"]}'), "malformed 'c'"),
    "odd-pairs": (_value('{"m":[1]}'), "key but no value"),
}


@pytest.mark.parametrize(("data", "needle"), list(FORGED.values()), ids=list(FORGED))
def test_forged_answers_are_refused_without_running_anything(
    data: bytes, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pickles (which would call os.system or eval), malformed or over-limit JSON raise
    SerializationError naming what was refused; nothing is called."""
    calls: list[str] = []
    monkeypatch.setattr("os.system", lambda cmd: calls.append(cmd))  # a tripwire
    with pytest.raises(SerializationError) as refused:
        loads_answer(data)
    assert needle in str(refused.value)
    assert "plain data" in str(refused.value)
    assert calls == []


def test_forged_pickles_are_what_they_claim() -> None:
    """The forged os.system pickle really calls os.system under plain pickle (the test's
    premise), so its refusal above is meaningful."""
    ops = [op.name for op, _, _ in pickletools.genops(FORGED["os.system-pickle"][0])]
    assert ops[:1] == ["GLOBAL"] and "REDUCE" in ops


def test_the_deepest_allowed_value_crosses_back() -> None:
    """A value nested exactly MAX_DEPTH levels deep is written and read back."""
    value: list[Any] = []
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    assert loads_answer(answer(value, CAP))["value"] == value
    with pytest.raises(SerializationError, match="nested more than"):
        decode(SPEC, answer([value], CAP), CAP)


def _closure_fn() -> Callable[[int], int]:
    factor = 3

    def local(x: int) -> int:
        return x * factor + _helper(0)

    return local


CALLS = {
    "closure": (_closure_fn(), (2,), {}, 6 + OFFSET),
    "lambda": (lambda a, b=1: a - b, (5,), {"b": 2}, 3),
    "module-helper": (_helper, (1,), {}, 1 + OFFSET),
    "builtin": (sorted, ([3, 1, 2],), {}, [1, 2, 3]),
}


@pytest.mark.parametrize(("fn", "args", "kwargs", "expected"), list(CALLS.values()),
                         ids=list(CALLS))  # fmt: skip
def test_calls_pickle_by_value_and_run_in_another_interpreter(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    expected: object,
    tmp_path: Path,
) -> None:
    """Closures, lambdas and functions of this test module travel by value: a child
    interpreter that cannot import the module (``-I -S``) runs them."""
    answer = _run_in_child(tmp_path, fn, *args, kwargs=kwargs)
    assert decode(SPEC, answer, CAP) == expected


def test_an_unpicklable_argument_is_a_serialization_error() -> None:
    """A lock cannot cross: SerializationError naming the function and what to pass instead."""
    with pytest.raises(SerializationError, match="plain data") as err:
        dumps_call(_helper, (threading.Lock(),), {})
    assert "_helper" in str(err.value)


ENVELOPES = {
    "return": ({"kind": "return", "value": [1, {"d": {"a": 2}}]}, None, [1, {"a": 2}]),
    "unencodable": ({"kind": "unencodable", "type": "Gen", "message": "no"}, SerializationError,
                    "returned a Gen"),
    "too-large": ({"kind": "too_large", "type": "bytes", "bytes": 9}, SerializationError,
                  "too large"),
    "version": ({"kind": "version", "version": [3, 99]}, SerializationError, "Python 3.99"),
    "extra-key": ({"kind": "return", "value": 1, "x": 2}, SerializationError, "not an envelope"),
    "not-a-dict": ([1, 2], SerializationError, "not an envelope"),
    "unknown-kind": ({"kind": "other"}, SerializationError, "not an envelope"),
}  # fmt: skip


@pytest.mark.parametrize(("envelope", "error", "expected"), list(ENVELOPES.values()),
                         ids=list(ENVELOPES))  # fmt: skip
def test_envelopes_decode_to_a_value_or_a_clear_error(
    envelope: object, error: type[Exception] | None, expected: object
) -> None:
    """Each envelope kind gives the value or its error; anything else is refused."""
    data = envelope_bytes(envelope)
    if error is None:
        assert decode(SPEC, data, CAP) == expected
    else:
        with pytest.raises(error, match=str(expected)):
            decode(SPEC, data, CAP)


def test_a_remote_exception_keeps_type_message_and_traceback() -> None:
    """``raise`` envelopes become SandboxExecutionError("{type}: {msg}\\n{traceback}")."""
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'k'\n"
    data = envelope_bytes({"kind": "raise", "error_type": "KeyError", "message": "'k'",
                           "traceback": trace})  # fmt: skip
    with pytest.raises(SandboxExecutionError) as raised:
        decode(SPEC, data, CAP)
    assert str(raised.value) == f"KeyError: 'k'\n{trace}"
    assert raised.value.error_type == "KeyError"
    assert raised.value.traceback_str == trace


def test_an_answer_over_the_cap_is_refused() -> None:
    """The host checks the size itself: the sandbox's own check cannot be trusted."""
    with pytest.raises(SerializationError, match="over 10"):
        decode(SPEC, answer("x" * 100, CAP), 10)


def _run_in_child(tmp_path: Path, fn: Callable[..., Any], *args: Any, cap: int = CAP,
                  is_async: bool = False, code: str | None = None,
                  kwargs: dict[str, Any] | None = None) -> bytes:  # fmt: skip
    """What a prepared sandbox does, in a child interpreter: warm-up, then the runner."""
    call_dir = tmp_path / CALL_DIR
    call_dir.mkdir(exist_ok=True)
    (tmp_path / LIBRARY_PATH).write_bytes(library_zip())
    (tmp_path / CALL_PATH).write_bytes(dumps_call(fn, args, kwargs or {}))
    runner = code or runner_code(max_result_bytes=cap, is_async=is_async, root=str(tmp_path))
    warmup = WARMUP_CODE.replace("/workspace", str(tmp_path))
    # -I -S: no site-packages, so cloudpickle can come only from the library zip.
    done = subprocess.run([sys.executable, "-I", "-S", "-c", warmup + runner],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return (tmp_path / RESULT_PATH).read_bytes()


async def _async_double(x: int) -> int:
    return x * 2


def _raises() -> None:
    def inner() -> None:
        raise ValueError("bad input")

    inner()


def test_the_runner_returns_a_value_through_the_library_zip(tmp_path: Path) -> None:
    """The runner, with cloudpickle only from the shipped zip, returns the function's value."""
    assert decode(SPEC, _run_in_child(tmp_path, _helper, 4), CAP) == 4 + OFFSET


def test_the_runner_awaits_async_functions(tmp_path: Path) -> None:
    """An async function's coroutine is run to its result inside."""
    answer = _run_in_child(tmp_path, _async_double, 21, is_async=True)
    assert decode(SPEC, answer, CAP) == 42


def test_the_runner_reports_exceptions_with_their_traceback(tmp_path: Path) -> None:
    """An exception comes back as data: type, message and a traceback naming the frames,
    with the function's own source lines (cloudpickle's functions have no file inside)."""
    lines, first = inspect.getsourcelines(_raises)
    code = runner_code(max_result_bytes=CAP, is_async=False, root=str(tmp_path),
                       source=(first, lines))  # fmt: skip
    with pytest.raises(SandboxExecutionError) as raised:
        decode(SPEC, _run_in_child(tmp_path, _raises, code=code), CAP)
    assert 'raise ValueError("bad input")' in raised.value.traceback_str  # the source line
    assert raised.value.error_type == "ValueError"
    assert str(raised.value).startswith("ValueError: bad input\n")
    assert "in inner" in raised.value.traceback_str
    assert "_harombe_call" not in raised.value.traceback_str


def test_the_runner_reports_system_exit_as_an_error(tmp_path: Path) -> None:
    """sys.exit inside the function is an exception of the call, not the end of the runner."""
    with pytest.raises(SandboxExecutionError) as raised:
        decode(SPEC, _run_in_child(tmp_path, sys.exit, 3), CAP)
    assert raised.value.error_type == "SystemExit"


def test_the_runner_refuses_a_return_value_that_is_not_plain_data(tmp_path: Path) -> None:
    """A return value that is not plain data (a lock) is a SerializationError naming it."""
    with pytest.raises(SerializationError, match="lock"):
        decode(SPEC, _run_in_child(tmp_path, threading.Lock), CAP)


def test_the_runner_refuses_a_return_value_over_the_cap(tmp_path: Path) -> None:
    """A return value over the cap is reported with its size, not sent."""
    answer = _run_in_child(tmp_path, bytes, 5000, cap=1000)
    assert len(answer) < 1000
    with pytest.raises(SerializationError, match="too large"):
        decode(SPEC, answer, 1000)


def test_the_runner_refuses_another_python_version(tmp_path: Path) -> None:
    """A sandbox Python of another minor version says so instead of misreading bytecode."""
    code = runner_code(max_result_bytes=CAP, is_async=False, root=str(tmp_path))
    here = repr(tuple(sys.version_info[:2]))
    forged = code.replace(here, "(2, 7)")
    assert forged != code
    with pytest.raises(SerializationError, match="functions cross as bytecode"):
        decode(SPEC, _run_in_child(tmp_path, _helper, 1, code=forged), CAP)

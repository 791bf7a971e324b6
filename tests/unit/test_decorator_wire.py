"""The ``@sandbox`` wire without Docker: what crosses into a sandbox (cloudpickle), the runner
the sandbox executes (run here in a child interpreter), and the restricted unpickler that
reads a hostile sandbox's answer on the host."""

from __future__ import annotations

import collections
import copyreg
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
from harombe.decorator_wire import (
    CALL_DIR,
    CALL_PATH,
    LIBRARY_PATH,
    RESULT_PATH,
    WARMUP_CODE,
    dumps_call,
    library_zip,
    restricted_loads,
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
    types unpickle to equal values."""
    assert restricted_loads(pickle.dumps(value, protocol=5)) == value  # as the runner writes


def test_a_self_referencing_list_crosses_back() -> None:
    """Shared and cyclic references survive (the tree check walks each object once)."""
    loaded = restricted_loads(pickle.dumps(_self_list(), protocol=5))
    assert loaded[0] == 1 and loaded[1] is loaded


def _global_reduce(module: str, name: str, arg: str) -> bytes:
    """Protocol 0: ``module.name(arg)``, the classic code-execution pickle."""
    return f"c{module}\n{name}\n(V{arg}\ntR.".encode()


def _stack_global(module: str, name: str, arg: str) -> bytes:
    """Protocol 4: STACK_GLOBAL of ``module`` / ``name`` called with ``arg``."""
    def short(text: str) -> bytes:
        raw = text.encode()
        return b"\x8c" + bytes([len(raw)]) + raw

    return b"\x80\x04" + short(module) + short(name) + b"\x93" + short(arg) + b"\x85R."


def _ext_pickle() -> bytes:
    """EXT1 code 0xF0, registered here as ``os.system``: find_class is still asked."""
    copyreg.add_extension("os", "system", 0xF0)
    return b"\x80\x02\x82\xf0" + b"X\x04\x00\x00\x00true\x85R."


def _build_sets_attribute() -> bytes:
    """An OrderedDict whose BUILD state gives it an instance attribute."""
    ordered = collections.OrderedDict(a=1)
    ordered.extra = "hijacked"  # type: ignore[attr-defined]
    return pickle.dumps(ordered, protocol=2)


def _slot_state_class_swap() -> bytes:
    """An OrderedDict whose slot state tries to set ``__class__`` (a subclass trick)."""
    return (
        b"\x80\x02ccollections\nOrderedDict\n)R"
        b"N}X\t\x00\x00\x00__class__cbuiltins\ndict\ns\x86b."
    )


def _defaultdict_factory(factory: str) -> bytes:
    return f"ccollections\ndefaultdict\n(cbuiltins\n{factory}\ntR.".encode()


FORGED = {
    "os.system": (_global_reduce("os", "system", "echo pwned"), "os.system"),
    "posix.system": (_global_reduce("posix", "system", "echo pwned"), "posix.system"),
    "builtins.eval": (_global_reduce("builtins", "eval", "1+1"), "builtins.eval"),
    "builtin-py2-name": (_global_reduce("__builtin__", "eval", "1+1"), "__builtin__.eval"),
    "getattr": (_global_reduce("builtins", "getattr", "x"), "builtins.getattr"),
    "import": (_global_reduce("builtins", "__import__", "os"), "builtins.__import__"),
    "subprocess": (_global_reduce("subprocess", "Popen", "true"), "subprocess.Popen"),
    "stack-global": (_stack_global("os", "system", "true"), "os.system"),
    "dotted-name": (_stack_global("builtins", "str.__class__", "x"), "builtins.str.__class__"),
    "subclasses": (_stack_global("builtins", "object.__subclasses__", "x"), "__subclasses__"),
    "reconstructor": (_global_reduce("copyreg", "_reconstructor", "x"), "copyreg"),
    "dataclass": (pickle.dumps(Point(1, 2), protocol=5), "Point"),
    "bytes-alloc": (_global_reduce("builtins", "bytes", "x"), "builtins.bytes"),
    "type": (_global_reduce("builtins", "type", "x"), "builtins.type"),
    "fraction-exponent": (_global_reduce("fractions", "Fraction", "1e999999999"), "Fraction"),
    "fraction-huge-ints": (
        b"\x80\x05cfractions\nFraction\n" + pickle.dumps((1 << 70000, 3), protocol=5)[2:-1]
        + b"R.", "Fraction"),
    "decimal-exponent": (_global_reduce("decimal", "Decimal", "1e999999999"), "Decimal"),
    "eval-factory": (_defaultdict_factory("eval"), "builtins.eval"),
    "complex-factory": (_defaultdict_factory("complex"), "factory"),
    "instance-attribute": (_build_sets_attribute(), "instance attributes"),
    "class-swap": (_slot_state_class_swap(), ""),
    "persistent-id": (b"Pos.system\n.", "persistent"),
    "out-of-band": (b"\x80\x05\x97.", "not a valid pickle"),
    "truncated": (pickle.dumps([1, 2, 3], protocol=5)[:-3], "not a valid pickle"),
    "garbage": (b"\x00not a pickle at all", "not a valid pickle"),
}


@pytest.mark.parametrize(("data", "needle"), list(FORGED.values()), ids=list(FORGED))
def test_forged_answers_are_refused_without_running_anything(
    data: bytes, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pickles that would call os.system, eval, getattr, import or a subclass trick, or build
    a non-data object, raise SerializationError naming what was refused; nothing is called."""
    calls: list[str] = []
    monkeypatch.setattr("os.system", lambda cmd: calls.append(cmd))  # a tripwire
    with pytest.raises(SerializationError) as refused:
        restricted_loads(data)
    assert needle in str(refused.value)
    assert calls == []


def test_the_extension_registry_cannot_bypass_the_allow_list() -> None:
    """EXT opcodes resolve through find_class too: a registered code for os.system is refused."""
    data = _ext_pickle()
    try:
        with pytest.raises(SerializationError, match=r"os\.system"):
            restricted_loads(data)
    finally:
        copyreg.remove_extension("os", "system", 0xF0)


def test_forged_pickles_are_what_they_claim() -> None:
    """The forged os.system pickle really calls os.system under plain pickle (the test's
    premise), so its refusal above is meaningful."""
    ops = [op.name for op, _, _ in pickletools.genops(FORGED["os.system"][0])]
    assert ops[:1] == ["GLOBAL"] and "REDUCE" in ops


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
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], expected: object,
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
    "return": ({"kind": "return", "value": [1, {"a": 2}]}, None, [1, {"a": 2}]),
    "unpicklable": ({"kind": "unpicklable", "type": "Gen", "message": "no"}, SerializationError,
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
    data = pickle.dumps(envelope, protocol=5)
    if error is None:
        assert decode(SPEC, data, CAP) == expected
    else:
        with pytest.raises(error, match=str(expected)):
            decode(SPEC, data, CAP)


def test_a_remote_exception_keeps_type_message_and_traceback() -> None:
    """``raise`` envelopes become SandboxExecutionError("{type}: {msg}\\n{traceback}")."""
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: \'k\'\n'
    data = pickle.dumps({"kind": "raise", "error_type": "KeyError", "message": "'k'",
                         "traceback": trace}, protocol=5)  # fmt: skip
    with pytest.raises(SandboxExecutionError) as raised:
        decode(SPEC, data, CAP)
    assert str(raised.value) == f"KeyError: 'k'\n{trace}"
    assert raised.value.error_type == "KeyError"
    assert raised.value.traceback_str == trace


def test_an_answer_over_the_cap_is_refused() -> None:
    """The host checks the size itself: the sandbox's own check cannot be trusted."""
    with pytest.raises(SerializationError, match="over 10"):
        decode(SPEC, pickle.dumps({"kind": "return", "value": "x" * 100}), 10)


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


def test_the_runner_refuses_an_unpicklable_return_value(tmp_path: Path) -> None:
    """A return value pickle cannot write (a lock) is a SerializationError naming its type."""
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

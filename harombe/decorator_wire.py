"""What a ``@sandbox`` call sends into its sandbox and how its answer is read back.

A sandbox is *prepared* before a call claims it: :func:`library_zip`, this process's own
``cloudpickle`` package (its sources, and bytecode compiled here that a sandbox Python of the
same version loads without compiling), is written to :data:`LIBRARY_PATH` and imported by
:data:`WARMUP_CODE` in the session interpreter, with the modules the runner needs, so the two
ends run the same cloudpickle and a call does not wait for its imports. A call then writes
``call.pkl`` (the function, its arguments and keyword arguments as cloudpickle made them) and
runs :func:`runner_code`, which unpickles the call, runs it and writes ``result.pkl``: an
*envelope*, a plain ``dict`` pickled by the standard library, holding either the return value
or the exception's type name, message and traceback text.

The sandbox is hostile, so the host never unpickles what comes back with the full pickle
machinery (that would let code in the sandbox run code on the host). :func:`restricted_loads`
uses a restricted unpickler: ``find_class`` answers only from :data:`SAFE_GLOBALS` (builtin
scalars and containers, whose ``bytes`` and ``bytearray`` need no global; ``datetime``;
``Decimal`` and ``Fraction``, each through a constructor that refuses huge exponents; ``UUID``;
``OrderedDict``, ``defaultdict``, ``deque`` and ``Counter``) and refuses every other global,
naming it, as a :class:`~harombe.errors.SerializationError`; no module is imported by name.
Whatever loads is then walked once: every object must be of a type in :data:`SAFE_TYPES`, and
none may carry instance attributes. A function that returns anything else (a dataclass, a numpy
array) fails with a message that says to return plain data.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import decimal
import fractions
import importlib.util
import io
import marshal
import pickle
import re
import sys
import sysconfig
import threading
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from harombe.errors import SerializationError

#: Where a call's files live, relative to ``/workspace`` (the sandbox is removed after).
CALL_DIR = ".harombe-call"
LIBRARY_PATH = f"{CALL_DIR}/lib.zip"
CALL_PATH = f"{CALL_DIR}/call.pkl"
RESULT_PATH = f"{CALL_DIR}/result.pkl"
#: Longest remote exception message and traceback kept, in characters each.
MAX_ERROR_CHARS = 65_536
#: Largest decimal exponent a returned ``Decimal`` may have.
MAX_EXPONENT = 4300
MAX_FRACTION_BITS = 1 << 16
_FRACTION = re.compile(r"-?\d{1,4300}(?:/\d{1,4300})?")


def _fraction(*parts: object) -> fractions.Fraction:
    """``Fraction`` from its pickled form only: two ints (numerator, denominator) of at most
    :data:`MAX_FRACTION_BITS` bits, or a ``"n/d"`` string. ``Fraction("1e999999999")`` would
    compute a power of ten of a billion digits on the host, and huge ints a long gcd."""
    pair = parts if len(parts) == 2 else (None, None)
    numerator, denominator = pair
    if isinstance(numerator, int) and isinstance(denominator, int):  # noqa: SIM102
        if _small_int(numerator) and _small_int(denominator):
            return fractions.Fraction(numerator, denominator)
    if len(parts) == 1 and isinstance(parts[0], str) and _FRACTION.fullmatch(parts[0]):
        return fractions.Fraction(parts[0])
    kinds = ", ".join(type(p).__name__ for p in parts[:3])
    raise SerializationError(f"refused a Fraction built from ({kinds}) beyond the limits")


def _small_int(value: int) -> bool:
    return not isinstance(value, bool) and value.bit_length() <= MAX_FRACTION_BITS


def _decimal(text: object) -> decimal.Decimal:
    """``Decimal`` from its pickled form (a ``str``) with an exponent of at most
    :data:`MAX_EXPONENT`: ``int(Decimal("1e999999999"))`` would otherwise run on the host."""
    value = decimal.Decimal(text) if isinstance(text, str) and len(text) <= 10_000 else None
    if value is None or (value.is_finite() and abs(value.adjusted()) > MAX_EXPONENT):
        raise SerializationError(f"refused a Decimal built from {str(text)[:40]!r}")
    return value


#: (module, name) → the object ``find_class`` gives for it; nothing else is reachable.
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    **{("builtins", t.__name__): t for t in (
        bool, int, float, complex, str, list, tuple, dict, set, frozenset,
    )},
    ("builtins", "Ellipsis"): Ellipsis,
    **{("datetime", t.__name__): t for t in (
        datetime.date, datetime.time, datetime.datetime, datetime.timedelta, datetime.timezone,
    )},
    ("decimal", "Decimal"): _decimal,
    ("fractions", "Fraction"): _fraction,
    ("uuid", "UUID"): uuid.UUID,
    ("uuid", "SafeUUID"): uuid.SafeUUID,
    **{("collections", t.__name__): t for t in (
        collections.OrderedDict, collections.defaultdict, collections.deque, collections.Counter,
    )},
}  # fmt: skip
#: Every type an unpickled value may hold.
SAFE_TYPES = frozenset({
    type(None), type(Ellipsis), bool, int, float, complex, str, bytes, bytearray, list, tuple,
    dict, set, frozenset, datetime.date, datetime.time, datetime.datetime, datetime.timedelta,
    datetime.timezone, decimal.Decimal, fractions.Fraction, uuid.UUID, uuid.SafeUUID,
    collections.OrderedDict, collections.defaultdict, collections.deque, collections.Counter,
})  # fmt: skip
#: Callables a ``defaultdict`` may hold as its ``default_factory``.
SAFE_FACTORIES = frozenset({list, dict, set, int, float, str, bytes, tuple, frozenset})


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = SAFE_GLOBALS.get((module, name))
        if found is None:
            raise SerializationError(
                f"the sandbox returned a value of type {module}.{name}, which the host does "
                "not unpickle (only builtin scalars and containers, datetime, Decimal, "
                "Fraction, UUID and collections' OrderedDict, defaultdict, deque and Counter "
                "cross back); return plain data instead, e.g. a dict or array.tolist()"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise SerializationError("refused a pickle with persistent ids")


def _check_tree(value: object) -> None:
    """Every object reachable from ``value`` is of a :data:`SAFE_TYPES` type with no instance
    attributes; iterative, so a deeply nested value cannot exhaust the stack."""
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        kind = type(item)
        if kind not in SAFE_TYPES:
            raise SerializationError(f"refused a value of type {kind.__qualname__}")
        if getattr(item, "__dict__", None):
            raise SerializationError(f"refused a {kind.__qualname__} with instance attributes")
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
            factory = getattr(item, "default_factory", None)
            if factory is not None and factory not in SAFE_FACTORIES:
                raise SerializationError("refused a defaultdict with an unknown factory")
        elif isinstance(item, list | tuple | set | frozenset | collections.deque):
            todo.extend(item)


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` from the sandbox: safe globals only, then the tree check; anything
    else, a malformed pickle included, is a :class:`SerializationError`."""
    try:
        value = _RestrictedUnpickler(io.BytesIO(data)).load()
    except SerializationError:
        raise
    except Exception as exc:  # noqa: BLE001 - hostile bytes: every failure is a refusal
        raise SerializationError(
            f"the sandbox's answer is not a valid pickle ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    _check_tree(value)
    return value


def _local_module(fn: object) -> ModuleType | None:
    """The module a Python function was defined in, when it is the user's own (not
    ``__main__``, which cloudpickle sends by value anyway, the standard library or an
    installed package): it is sent by value too, so helpers beside the function travel."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if not isinstance(fn, FunctionType) or module is None or module.__name__ == "__main__":
        return None
    if not path or any(path.startswith(root) for root in _INSTALLED_ROOTS if root):
        return None
    return module


_BY_VALUE = threading.Lock()
_INSTALLED_ROOTS = tuple(
    {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def dumps_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The call, pickled by cloudpickle (closures, lambdas and local functions by value; the
    function's own module too, see :func:`_local_module`)."""
    import cloudpickle  # type: ignore[import-untyped]

    module = _local_module(fn)
    try:
        with _BY_VALUE:  # cloudpickle's by-value registry is global: one pickling at a time
            registered = cloudpickle.list_registry_pickle_by_value()
            if module is not None and module.__name__ in registered:
                module = None  # registered by the caller: leave it so
            if module is not None:
                cloudpickle.register_pickle_by_value(module)
            try:
                return bytes(cloudpickle.dumps((fn, args, kwargs), protocol=5))
            finally:
                if module is not None:
                    with contextlib.suppress(ValueError):
                        cloudpickle.unregister_pickle_by_value(module)
    except Exception as exc:  # pickling runs arbitrary __reduce__ code: any error
        raise SerializationError(
            f"cannot send {getattr(fn, '__qualname__', fn)!r} and its arguments into the "
            f"sandbox: {type(exc).__name__}: {str(exc)[:300]}; pass plain data (no open files, "
            "locks, sockets or generators)"
        ) from exc


def _cloudpickle_files() -> dict[str, bytes]:
    """This process's cloudpickle package: each source file, and beside it bytecode (an
    unchecked hash-based pyc) that a sandbox Python of this version loads without compiling."""
    import cloudpickle

    package = Path(cloudpickle.__file__).parent
    files: dict[str, bytes] = {}
    for path in sorted(package.glob("*.py")):
        source = path.read_bytes()
        name = f"cloudpickle/{path.name}"
        code = compile(source, f"/workspace/{LIBRARY_PATH}/{name}", "exec", dont_inherit=True)
        header = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")
        files[name] = source
        files[name + "c"] = header + importlib.util.source_hash(source) + marshal.dumps(code)
    return files


_LIBRARY: list[bytes] = []


def library_zip() -> bytes:
    """The zip of this process's cloudpickle that prepared sandboxes import (made once)."""
    if not _LIBRARY:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
            for name, data in _cloudpickle_files().items():
                archive.writestr(name, data)
        _LIBRARY.append(out.getvalue())
    return _LIBRARY[0]


#: Run once in a prepared sandbox: what every call needs, imported ahead.
WARMUP_CODE = (
    f"import sys\nsys.path.insert(0, '/workspace/{LIBRARY_PATH}')\n"
    "import pickle, traceback, asyncio, cloudpickle\n"
)

_RUNNER = """
def _harombe_call(library, call_path, result_path, version, cap, is_async, first, lines):
    import sys
    import pickle
    import linecache
    if lines:  # the function's own lines, where cloudpickle's "<dynamic-code>" frames point
        lines = ["\\n"] * (first - 1) + lines
        linecache.cache["<dynamic-code>"] = (sum(map(len, lines)), None, lines, "<dynamic-code>")
    def write(envelope):
        with open(result_path, "wb") as out:
            out.write(pickle.dumps(envelope, protocol=5))
    if sys.version_info[:2] != version:
        return write({"kind": "version", "version": list(sys.version_info[:2])})
    if library not in sys.path:
        sys.path.insert(0, library)
    try:
        with open(call_path, "rb") as call:
            fn, args, kwargs = pickle.loads(call.read())
        value = fn(*args, **kwargs)
        if is_async:
            import asyncio
            value = asyncio.run(value)
    except BaseException as exc:
        import traceback
        try:
            message = str(exc)
        except BaseException:
            message = "<the exception's str() failed>"
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
        return write({"kind": "raise", "error_type": type(exc).__name__,
                      "message": message, "traceback": "".join(lines)})
    try:
        data = pickle.dumps({"kind": "return", "value": value}, protocol=5)
    except BaseException as exc:
        return write({"kind": "unpicklable", "type": type(value).__qualname__,
                      "message": f"{type(exc).__name__}: {exc}"})
    if len(data) > cap:
        return write({"kind": "too_large", "type": type(value).__qualname__, "bytes": len(data)})
    with open(result_path, "wb") as out:
        out.write(data)
_harombe_call(%r, %r, %r, %r, %d, %r, %d, %r)
del _harombe_call
"""


def runner_code(
    *,
    max_result_bytes: int,
    is_async: bool,
    root: str = "/workspace",
    source: tuple[int, list[str]] = (1, []),
) -> str:
    """The Python the sandbox runs for one call (see the module docstring); ``root`` is where
    :data:`CALL_DIR` is (the sandbox's ``/workspace``), ``source`` the function's first line
    number and lines, so that its traceback shows them."""
    first, lines = source
    return _RUNNER % (
        f"{root}/{LIBRARY_PATH}", f"{root}/{CALL_PATH}", f"{root}/{RESULT_PATH}",
        tuple(sys.version_info[:2]), max_result_bytes, is_async, first, lines,
    )  # fmt: skip

"""What a ``@sandbox`` call sends into its sandbox and how its answer comes back.

A sandbox is *prepared* before a call claims it: :func:`library_zip`, this process's own
``cloudpickle`` package (its sources, and bytecode compiled here that a sandbox Python of the
same version loads without compiling) and :mod:`harombe.decorator_encode` (as
``harombe_encode``), is written to :data:`LIBRARY_PATH` and imported by :data:`WARMUP_CODE` in
the session interpreter, with the modules the runner needs, so the two ends run the same code
and a call does not wait for its imports. A call then writes ``call.pkl`` (the function, its
arguments and keyword arguments as cloudpickle made them) and runs :func:`runner_code`, which
unpickles the call, runs it and writes ``result.json``: an *envelope* in the tagged JSON tree
format of :mod:`harombe.decorator_encode`, holding either the return value or the exception's
type name, message and traceback text.

The sandbox is hostile, so the host never unpickles what comes back: the answer is JSON, read
by :func:`harombe.decorator_decode.loads_answer` under limits (depth, number of values, int
and exponent sizes, keys per set or dict), so nothing in it can name or call a host object,
share a reference or make the host's work grow faster than the answer's size. Only plain data
crosses back (builtin scalars and containers, ``datetime`` values, ``Decimal``, ``Fraction``,
``UUID`` and collections' ``OrderedDict``, ``defaultdict``, ``deque`` and ``Counter``); a
function that returns anything else (a dataclass, a numpy array) fails with a message that
says to return plain data.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import marshal
import sys
import sysconfig
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from harombe import decorator_encode
from harombe.errors import SerializationError

#: Where a call's files live, relative to ``/workspace`` (the sandbox is removed after).
CALL_DIR = ".harombe-call"
LIBRARY_PATH = f"{CALL_DIR}/lib.zip"
CALL_PATH = f"{CALL_DIR}/call.pkl"
RESULT_PATH = f"{CALL_DIR}/result.json"
#: Longest remote exception message and traceback kept, in characters each.
MAX_ERROR_CHARS = 65_536


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


_BY_VALUE = threading.RLock()  # reentrant: a signal handler may call in while it is held
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
    unchecked hash-based pyc) that a sandbox Python of this version loads without compiling;
    and the answer encoder, :data:`ENCODER_FILE`."""
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
    files[ENCODER_FILE] = Path(decorator_encode.__file__).read_bytes()
    return files


_LIBRARY: list[bytes] = []
#: :mod:`harombe.decorator_encode` in the library zip (a top-level module there).
ENCODER_FILE = "harombe_encode.py"


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
    "import pickle, json, traceback, asyncio, cloudpickle, harombe_encode\n"
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
        import json
        text = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
        with open(result_path, "wb") as out:
            out.write(text.encode("utf-8", "surrogatepass"))
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
    import harombe_encode
    data = harombe_encode.answer(value, cap)
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

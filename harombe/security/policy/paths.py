"""Workspace path policy: pure, no I/O, and the one place a caller's path is normalised.

The tools normalise every file path with :func:`workspace_relative` *before* the HITL gate sees
it, and the manager acts on that same normalised path, so the gate and the sandbox always judge
the same file. The function is idempotent (its output maps to itself). The supervisor then
checks the *resolved* path again inside the sandbox, where symlinks that user code planted are
visible. Files never touch a host directory: reads and writes travel over the sandbox's channel.

What is rewritten, because the meaning is unambiguous on Linux:

* ``./`` components and repeated ``/`` (``./a//b`` is ``a/b``);
* the ``/workspace/`` prefix (``/workspace/a`` is ``a``);
* a trailing ``/`` on a *directory* (listing ``data/`` lists ``data``).

What is refused, because a reader could take it for something else (a gate rule for ``run.py``
must not miss ``run.py `` that some layer later trims to ``run.py``):

* ``..`` anywhere, absolute paths outside ``/workspace``, NUL bytes, empty paths;
* white space at the start or end of any name (``run.py ``, `` a/b``);
* names ending in ``.`` (``run.py.``; ``.`` and ``..`` themselves are handled above);
* a trailing ``/`` on a *file* path (``.env/`` names a directory, not the file ``.env``);
* backslashes (``a\\b`` is one odd name on Linux, a path elsewhere);
* control, format and separator characters (U+0000–U+001F, U+007F–U+009F, zero-width and
  bidirectional marks such as U+200B and U+202E, U+2028, U+2029), and lone surrogates;
* text that is not in Unicode NFC form (``e`` + U+0301 and ``é`` name different files);
* paths over 4096 characters and names over 255 bytes (Linux's own limits), and paths more
  than 128 names deep.
"""

from __future__ import annotations

import posixpath
import unicodedata
from types import UnionType
from typing import Any, TypeGuard

from harombe.errors import WorkspacePathError

WORKSPACE = "/workspace"
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
#: Deepest path accepted, in names (a 1000-level path is refused here, before any gate).
MAX_PATH_DEPTH = 128
#: Unicode categories refused in names: controls, invisible format marks, line and paragraph
#: separators, surrogates, unassigned code points.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
ECHO_CHARS = 80


#: Exact built-in types whose repr is computed by harombe's own code, never by a caller's.
_SCALARS = (bool, int, float, complex, type(None))
_CONTAINERS: dict[type, tuple[str, str]] = {
    list: ("[", "]"),
    tuple: ("(", ")"),
    set: ("{", "}"),
    frozenset: ("{", "}"),
}
_MAX_ITEMS = 8


def type_name(value: object, limit: int = ECHO_CHARS // 2) -> str:
    """The name of ``value``'s type, cut to ``limit`` characters (a class may be named by a
    10 MB string)."""
    name: str = type.__dict__["__name__"].__get__(type(value))
    return name if len(name) <= limit else name[: limit - 1] + "…"


def preview(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (ending in "…" when cut), for error
    messages: a 10 MB argument is never echoed back, and nothing here can fail, hang or run
    the caller's code. Only exact built-in types are shown by value (a ``str`` subclass by its
    text); any other object is shown as ``<TypeName>``, without calling its ``__repr__``."""
    try:
        text = _preview(value, limit, depth=2)
    except Exception:  # noqa: BLE001 - an error message must never become a crash
        text = f"<{type_name(value)}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _preview(value: object, limit: int, depth: int) -> str:
    kind = type(value)
    if is_a(value, str):
        return repr(str.__getitem__(value, slice(0, 2 * limit)))
    if is_a(value, bytes):
        return repr(bytes.__getitem__(value, slice(0, 2 * limit)))
    if is_a(value, int) and not is_a(value, bool):
        if int.bit_length(value) > 256:  # repr of 10**10000 is slow, then refused
            return f"<{type_name(value)} of {int.bit_length(value)} bits>"
        return int.__repr__(value)
    if is_a(value, float):
        return float.__repr__(value)
    if kind in _SCALARS:
        return repr(value)
    if kind in _CONTAINERS and depth > 0:
        items = list(kind.__iter__(value))  # type: ignore[attr-defined]
        return _join(items, _CONTAINERS[kind], limit, depth)
    if is_a(value, dict) and kind is dict and depth > 0:
        pairs = list(dict.items(value))[:_MAX_ITEMS]
        shown = [f"{_preview(k, limit, 0)}: {_preview(v, limit, depth - 1)}" for k, v in pairs]
        more = ", …" if dict.__len__(value) > _MAX_ITEMS else ""
        return "{" + ", ".join(shown) + more + "}"
    return f"<{type_name(value)}>"


def _join(items: list[object], brackets: tuple[str, str], limit: int, depth: int) -> str:
    shown = [_preview(item, limit, depth - 1) for item in items[:_MAX_ITEMS]]
    more = ", …" if len(items) > _MAX_ITEMS else ""
    return brackets[0] + ", ".join(shown) + more + brackets[1]


def is_a(value: object, kinds: type | UnionType) -> TypeGuard[Any]:
    """``isinstance`` by the value's real type: an object whose ``__class__`` claims to be a
    ``str`` (or list, or float) is not one, and asking runs none of its code."""
    return issubclass(type(value), kinds)


def exact_str(value: str) -> str:
    """``value`` as a plain ``str``: a subclass's overridden methods (``split``, ``strip``,
    ``__eq__``, ``__hash__``…) must not make one layer read it differently from another."""
    return value if type(value) is str else str.__str__(value)


def workspace_relative(path: str, *, allow_root: bool = False) -> str:
    """``path`` as a normalised path relative to ``/workspace``, or :class:`WorkspacePathError`.

    Accepts ``a/b.txt``, ``./a/b.txt`` and ``/workspace/a/b.txt``; see the module docstring for
    what is rewritten and what is refused. ``allow_root`` is for directories (listing): it
    admits ``.`` (the workspace itself) and a trailing ``/``.
    """
    path = _plain_text(path)
    names = _relative_names(path)
    for name in names:
        _check_name(name, path)
    parts = [n for n in names if n not in ("", ".")]
    if len(parts) > MAX_PATH_DEPTH:
        raise WorkspacePathError(
            f"path is {len(parts)} directories deep, over {MAX_PATH_DEPTH}; use a shallower path"
        )
    rel = posixpath.join(*parts) if parts else "."
    if len(WORKSPACE) + 1 + len(rel.encode("utf-8")) >= MAX_PATH_CHARS:
        raise WorkspacePathError(
            f"path is longer than Linux allows below {WORKSPACE} ({MAX_PATH_CHARS} bytes in "
            "all); shorten it"
        )
    if not allow_root:
        if rel == ".":
            raise WorkspacePathError(
                f"path {preview(path)} names /workspace itself; give a file name"
            )
        if names[-1] in ("", "."):
            raise WorkspacePathError(
                f"file path {preview(path)} ends with '/', so it names a directory; give the "
                f"file's name without the trailing '/' ({preview(rel)})"
            )
    return rel


def _plain_text(path: object) -> str:
    """``path`` as an exact ``str`` that may name a file: not too long, not empty, no NUL,
    no odd characters, in NFC form; else :class:`WorkspacePathError`."""
    if not is_a(path, str):
        raise WorkspacePathError(
            f"file path must be a string, got {type_name(path)}; give a path relative to "
            "/workspace such as 'data/input.csv'"
        )
    text = exact_str(path)
    if len(text) > MAX_PATH_CHARS:
        raise WorkspacePathError(
            f"file path is longer than {MAX_PATH_CHARS} characters ({len(text)}); shorten it"
        )
    if "\x00" in text:
        raise WorkspacePathError(f"file path {preview(text)} contains a NUL byte; remove it")
    if text.strip() == "":
        raise WorkspacePathError("file path is empty; give a path relative to /workspace")
    _refuse_odd_characters(text)
    if not unicodedata.is_normalized("NFC", text):
        raise WorkspacePathError(
            f"file path {text[:ECHO_CHARS]!a} is not in Unicode NFC form, so it could name a "
            "different file than it appears to; write it composed, as "
            f"{unicodedata.normalize('NFC', text[:ECHO_CHARS])!a}"
        )
    return text


def _relative_names(path: str) -> list[str]:
    """The names of ``path`` below ``/workspace`` (empty and ``.`` names kept): the
    ``/workspace/`` prefix taken off; an absolute path elsewhere, or ``..``, refused."""
    rel_text = path
    if path.startswith("/"):
        collapsed = "/" + path.lstrip("/")
        if collapsed == WORKSPACE or collapsed.startswith(WORKSPACE + "/"):
            rel_text = collapsed[len(WORKSPACE) :]
        else:
            raise WorkspacePathError(
                f"absolute path {preview(path)} is outside /workspace; use a path relative to "
                "/workspace"
            )
    names = rel_text.split("/")
    if ".." in names:
        raise WorkspacePathError(
            f"path {preview(path)} contains '..'; paths must stay inside /workspace, so write "
            "it without '..'"
        )
    return names


def _refuse_odd_characters(path: str) -> None:
    if "\\" in path:
        raise WorkspacePathError(
            f"file path {preview(path)} contains a backslash; separate directories with '/'"
        )
    for index, char in enumerate(path):
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise WorkspacePathError(
                f"file path {preview(path)} contains U+{ord(char):04X} (a control, invisible or "
                f"unassigned character) at position {index}; remove it"
            )


def _check_name(name: str, path: str) -> None:
    if name in ("", ".", ".."):
        return
    if name != name.strip():
        raise WorkspacePathError(
            f"file path {preview(path)}: the name {preview(name)} begins or ends with white "
            "space, which is easy to misread; remove the spaces"
        )
    if name.endswith("."):
        raise WorkspacePathError(
            f"file path {preview(path)}: the name {preview(name)} ends with '.', which is easy "
            "to misread; remove the trailing dots"
        )
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise WorkspacePathError(
            f"file path {preview(path)}: a name is longer than {MAX_NAME_BYTES} bytes; shorten it"
        )

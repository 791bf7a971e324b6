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
import reprlib
import unicodedata

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


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 2 * ECHO_CHARS
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8


def preview(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (ending in "…" when cut), for error
    messages: a 10 MB argument is never echoed back, and nothing here can fail."""
    try:
        text = repr(value[: 2 * limit]) if isinstance(value, str) else _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not turn a refusal into a crash
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def workspace_relative(path: str, *, allow_root: bool = False) -> str:
    """``path`` as a normalised path relative to ``/workspace``, or :class:`WorkspacePathError`.

    Accepts ``a/b.txt``, ``./a/b.txt`` and ``/workspace/a/b.txt``; see the module docstring for
    what is rewritten and what is refused. ``allow_root`` is for directories (listing): it
    admits ``.`` (the workspace itself) and a trailing ``/``.
    """
    if not isinstance(path, str):
        raise WorkspacePathError(
            f"file path must be a string, got {type(path).__name__}; give a path relative to "
            "/workspace such as 'data/input.csv'"
        )
    if len(path) > MAX_PATH_CHARS:
        raise WorkspacePathError(
            f"file path is longer than {MAX_PATH_CHARS} characters ({len(path)}); shorten it"
        )
    if "\x00" in path:
        raise WorkspacePathError(f"file path {preview(path)} contains a NUL byte; remove it")
    if path.strip() == "":
        raise WorkspacePathError("file path is empty; give a path relative to /workspace")
    _refuse_odd_characters(path)
    if not unicodedata.is_normalized("NFC", path):
        raise WorkspacePathError(
            f"file path {path[:ECHO_CHARS]!a} is not in Unicode NFC form, so it could name a "
            "different file than it appears to; write it composed, as "
            f"{unicodedata.normalize('NFC', path[:ECHO_CHARS])!a}"
        )
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

"""What a :class:`~harombe.testing.guest.FakeGuest` runs: the outcome type, and the default
handler, a tiny deterministic stand-in for the interpreters of a sandbox.

:func:`echo_handler` understands a few literal-only statements and ignores everything else, so
a test can say what output and exit code it wants with ordinary-looking code (one statement
per line):

* Python: ``print(<literals>)`` (``file=sys.stderr`` goes to stderr), ``exit(<n>)`` /
  ``sys.exit(<n>)``, ``raise <Name>(<literal>)`` (a traceback on stderr, exit code 1), and in a
  session run a last line that is a bare literal becomes the run's ``result`` (its repr);
* JavaScript: ``console.log(<literal>)``, ``console.error(<literal>)``, ``process.exit(<n>)``;
* shell: ``echo <words>`` (``>&2`` at the end: stderr), ``exit <n>``.

A test that needs more passes its own handler: any callable ``(msg, stdin) -> RunOutcome`` (or
an awaitable of one), where ``msg`` is the supervisor's ``run`` request and ``stdin`` its blob;
:func:`code_of` finds the code in them.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunHandler", "RunOutcome", "code_of", "echo_handler", "language_of"]


@dataclass
class RunOutcome:
    """What one run produced. ``status`` None means ``ok`` for exit code 0, else ``error``;
    set it to ``timeout``, ``oom`` or ``cancelled`` to report those. ``result``,
    ``state_lost`` and ``warnings`` are reported as a session interpreter reports them."""

    stdout: str | bytes = ""
    stderr: str | bytes = ""
    exit_code: int = 0
    status: str | None = None
    result: str | None = None
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0
    state_lost: bool = False
    warnings: list[str] = field(default_factory=list)


#: Computes a run's outcome from the ``run`` request and its stdin blob.
RunHandler = Callable[[dict[str, Any], bytes], "RunOutcome | Awaitable[RunOutcome]"]

_JS_CALL = re.compile(r"^(console\.log|console\.error|process\.exit)\((.*)\);?$")


def language_of(msg: dict[str, Any]) -> str:
    """``python``, ``javascript`` or ``shell`` for a run request (a program: ``shell``)."""
    if msg.get("session"):
        return str(msg.get("language"))
    argv = [str(a) for a in msg.get("argv", ())]
    if argv[:2] == ["python3", "-"]:
        return "python"
    if argv[:2] == ["node", "-"]:
        return "javascript"
    return "shell"


def code_of(msg: dict[str, Any], stdin: bytes) -> str:
    """The code a run request carries: the blob of a session run or of ``python3 -`` /
    ``node -``, the script of ``bash -c``; '' for any other program."""
    argv = [str(a) for a in msg.get("argv", ())]
    if msg.get("session") or argv[1:2] == ["-"]:
        return stdin.decode("utf-8", "surrogateescape")
    if argv[:2] == ["bash", "-c"] and len(argv) > 2:
        return argv[2]
    return ""


def _literal(node: ast.expr) -> object:
    return ast.literal_eval(node)


def _python(code: str, session: bool) -> RunOutcome:
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return RunOutcome(stderr=f"SyntaxError: {exc.msg}\n", exit_code=1)
    out: list[str] = []
    err: list[str] = []
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if isinstance(stmt, ast.Raise):
            call = stmt.exc
        if not isinstance(call, ast.Call):
            continue
        name = ast.unparse(call.func)
        try:
            args = [_literal(a) for a in call.args]
        except ValueError:
            continue  # not literals: beyond this stand-in, ignored
        if isinstance(stmt, ast.Raise):
            err.append(f"Traceback (most recent call last):\n{name}: {' '.join(map(str, args))}\n")
            return RunOutcome("".join(out), "".join(err), exit_code=1)
        if name == "print":
            to_err = any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr"
                         for k in call.keywords)  # fmt: skip
            (err if to_err else out).append(" ".join(map(str, args)) + "\n")
        elif name in ("exit", "sys.exit", "quit"):
            status = args[0] if args and args[0] is not None else 0
            if not isinstance(status, int):  # exit("why"): the message on stderr, code 1
                err.append(f"{status}\n")
                status = 1
            return RunOutcome("".join(out), "".join(err), exit_code=status)
    result = None
    if session and tree.body and isinstance(tree.body[-1], ast.Expr):
        try:
            result = repr(_literal(tree.body[-1].value))
        except ValueError:
            result = None
    return RunOutcome("".join(out), "".join(err), result=result)


def _javascript(code: str) -> RunOutcome:
    out: list[str] = []
    err: list[str] = []
    for line in code.splitlines():
        match = _JS_CALL.match(line.strip())
        if match is None:
            continue
        try:
            value = ast.literal_eval(match.group(2)) if match.group(2) else ""
        except (ValueError, SyntaxError):
            continue
        if match.group(1) == "process.exit":
            return RunOutcome("".join(out), "".join(err), exit_code=int(str(value or 0)))
        (err if match.group(1) == "console.error" else out).append(f"{value}\n")
    return RunOutcome("".join(out), "".join(err))


def _shell(code: str) -> RunOutcome:
    out: list[str] = []
    err: list[str] = []
    for line in code.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[:1] == ["exit"]:
            code_n = words[1] if len(words) > 1 and words[1].isdigit() else "0"
            return RunOutcome("".join(out), "".join(err), exit_code=int(code_n))
        if words[:1] == ["echo"]:
            to_err = words[-1] == ">&2"
            text = " ".join(words[1 : -1 if to_err else None])
            (err if to_err else out).append(text + "\n")
    return RunOutcome("".join(out), "".join(err))


def echo_handler(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
    """The default handler: see the module docstring. Other programs (installs, the CA bundle
    of a network-enabled sandbox) succeed with no output."""
    code = code_of(msg, stdin)
    language = language_of(msg)
    if language == "python":
        return _python(code, bool(msg.get("session")))
    if language == "javascript":
        return _javascript(code)
    return _shell(code)

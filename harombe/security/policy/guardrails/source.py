"""What both scans share: reading the code into a tree, the violation list, what a name
denotes, and the value of a string the code builds from literals.

Reading refuses, as one violation each and never an exception: code over
:data:`MAX_SOURCE_CHARS`, a source encoding declaration other than UTF-8 (code run from bytes
honours it, so ``# coding: utf-7`` would make the interpreter read other code than the scan
did), code that does not parse (Python's own message and line), and code nested too deeply
for the parser. Code that is not a ``str`` is a caller's mistake: :class:`InvalidArgumentError`.
"""

from __future__ import annotations

import ast
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harombe.errors import InvalidArgumentError
from harombe.security.policy.guardrails.tables import CODING_COOKIE, UTF8_NAMES

#: The longest code the scans read (characters).
MAX_SOURCE_CHARS = 1_000_000
#: Violations listed per scan; past it one line says how many more there were.
MAX_VIOLATIONS = 100
#: The longest string :func:`fold` builds (``"_" * 10**9`` is not built).
MAX_FOLDED_CHARS = 10_000
_MAX_FOLD_DEPTH = 64


def parse(code: object) -> ast.Module | list[str]:
    """The syntax tree of ``code``, or the one violation that says why it cannot be read."""
    code = require_str(code)
    if len(code) > MAX_SOURCE_CHARS:
        return [
            f"Code of {len(code):,} characters is above the {MAX_SOURCE_CHARS:,} the scan "
            "reads; split it into smaller runs"
        ]
    for number, line in enumerate(code.splitlines()[:2], start=1):
        match = CODING_COOKIE.match(line)
        if match and not _is_utf8(match.group(1)):
            return [
                f"Line {number}: source encoding declaration '{match.group(1)}' is not allowed; "
                "send UTF-8 code without one"
            ]
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return [f"SyntaxError: {exc.msg}{where}"]
    except (RecursionError, MemoryError) as exc:
        return [f"Code is nested too deeply to analyse ({type(exc).__name__}); flatten it"]
    except ValueError as exc:  # older parsers: null bytes
        return [f"SyntaxError: {exc}"]


def require_str(code: object) -> str:
    """``code`` when it is a str; else :class:`InvalidArgumentError` naming what it was."""
    if not isinstance(code, str):
        raise InvalidArgumentError(
            f"code must be a str of Python source, not {type(code).__name__}; decode bytes "
            "as UTF-8 first"
        )
    return code


def _is_utf8(encoding: str) -> bool:
    name = encoding.lower().replace("_", "-")
    return name in UTF8_NAMES or name.startswith("utf-8-")


@dataclass
class Violations:
    """Violations as ``Line N: …`` texts, in line order, each once, at most
    :data:`MAX_VIOLATIONS` of them plus one line counting the rest."""

    found: list[tuple[int, int, str]] = field(default_factory=list)

    def add(self, node: ast.AST, text: str) -> None:
        line = getattr(node, "lineno", 1)
        self.found.append((line, getattr(node, "col_offset", 0), f"Line {line}: {text}"))

    def texts(self) -> list[str]:
        unique = list(dict.fromkeys(text for _, _, text in sorted(self.found)))
        if len(unique) <= MAX_VIOLATIONS:
            return unique
        rest = len(unique) - MAX_VIOLATIONS
        return [*unique[:MAX_VIOLATIONS], f"… and {rest} more violations not listed"]


def walk(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``tree``, without recursion (deep trees do not exhaust the stack)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


_BINDERS = (
    *(ast.Import, ast.ImportFrom, ast.Assign, ast.Name, ast.FunctionDef, ast.AsyncFunctionDef),
    *(ast.ClassDef, ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping, ast.arg),
)


class Names:
    """What the names of one module denote: aliases from imports and simple assignments
    (``import pandas as pd``, ``from operator import attrgetter as g``, ``o = os``), read
    from the whole tree first, so the order of the code does not matter.

    The reading ignores control flow, so a name bound in two ways (``import re`` and
    ``re = x``, or ``for re in …``) is *ambiguous*: :meth:`qualname` does not resolve it (no
    exception is granted through it), while :meth:`owners` lists every module it may be (each
    is judged).
    """

    def __init__(self, tree: ast.AST) -> None:
        self.aliases: dict[str, str] = {}
        self.candidates: dict[str, set[str]] = {}
        self.ambiguous: set[str] = set()
        #: Modules star-imported (``from m import *``): their names arrive unseen.
        self.star_modules: set[str] = set()
        nodes = [node for node in walk(tree) if isinstance(node, _BINDERS)]
        self._simple_targets = {
            id(node.targets[0])
            for node in nodes
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        }
        for _ in range(2):  # twice, so aliases of aliases resolve in any order
            sites: dict[str, set[str | None]] = {}
            for node in nodes:
                for name, value in self._bindings(node):
                    sites.setdefault(name, set()).add(value)
            for name, values in sites.items():
                known = {value for value in values if value is not None}
                self.candidates[name] = known
                if len(values) > 1:
                    self.ambiguous.add(name)
                if known:
                    self.aliases[name] = sorted(known)[0]

    def _bindings(self, node: ast.AST) -> list[tuple[str, str | None]]:
        """(name, what it denotes or None) for each name ``node`` binds."""
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
            return [
                (alias.asname, alias.name) if alias.asname else (top, top)
                for alias, top in zip(node.names, tops, strict=True)
            ]
        if isinstance(node, ast.ImportFrom):
            if node.module and not node.level:
                self.star_modules.update(node.module for a in node.names if a.name == "*")
            module = node.module if node.module and not node.level else None
            return [
                (alias.asname or alias.name, f"{module}.{alias.name}" if module else None)
                for alias in node.names
                if alias.name != "*"
            ]
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                return [(target.id, self.qualname(node.value))]
            return []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            return [] if self._simple_target(node) else [(node.id, None)]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [(node.name, None)]
        name = getattr(node, "name", None) or getattr(node, "rest", None)
        if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar | ast.MatchMapping):
            return [(name, None)] if isinstance(name, str) else []
        if isinstance(node, ast.arg):
            return [(node.arg, None)]
        return []

    def _simple_target(self, node: ast.Name) -> bool:
        return id(node) in self._simple_targets

    def qualname(self, node: ast.AST) -> str | None:
        """The dotted name ``node`` denotes when it is a module or a module's member reached
        through names the module bound once (``pd.read_pickle`` → ``pandas.read_pickle``)."""
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        if node.id in self.ambiguous:
            return None
        return ".".join([self.aliases[node.id], *reversed(attributes)])

    def owners(self, node: ast.AST) -> list[str]:
        """Every dotted name ``node`` may denote, ambiguous names included (sorted)."""
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return []
        tail = list(reversed(attributes))
        return [".".join([base, *tail]) for base in sorted(self.candidates.get(node.id, ()))]

    def dotted(self, node: ast.AST) -> str | None:
        """Like :meth:`qualname`, but a name the module never bound stands for itself
        (``pickle.loads`` is ``pickle.loads`` even where ``pickle`` was not imported)."""
        resolved = self.qualname(node)
        if resolved:
            return resolved
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return ".".join([node.id, *reversed(attributes)])
        return None


def normal(text: str) -> str:
    """``text`` as Python would read it as an identifier (NFKC: ``ｅval`` is ``eval``)."""
    return unicodedata.normalize("NFKC", text) if not text.isascii() else text


def fold(node: ast.AST, depth: int = 0) -> str | None:
    """The string ``node`` evaluates to when it is built from literals alone: concatenation,
    repetition, f-strings of literals, ``chr(95)``, ``"".join([...])``, slices, ``.lower()``,
    ``.upper()``, ``.replace()``, ``b"…".decode()``. None when it is not (or is too long)."""
    if depth > _MAX_FOLD_DEPTH:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = [fold(value, depth + 1) for value in node.values]
        return _capped("".join(p for p in parts if p is not None)) if None not in parts else None
    if isinstance(node, ast.FormattedValue):
        plain = node.conversion in (-1, ord("s")) and node.format_spec is None
        return fold(node.value, depth + 1) if plain else None
    if isinstance(node, ast.BinOp):
        return _fold_binop(node, depth)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        return _fold_slice(node, depth)
    if isinstance(node, ast.Call):
        return _fold_call(node, depth)
    return None


def _capped(text: str) -> str | None:
    return text if len(text) <= MAX_FOLDED_CHARS else None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return None


def _fold_binop(node: ast.BinOp, depth: int) -> str | None:
    if isinstance(node.op, ast.Add):
        left, right = fold(node.left, depth + 1), fold(node.right, depth + 1)
        return _capped(left + right) if left is not None and right is not None else None
    if isinstance(node.op, ast.Mult):
        for text_node, count_node in ((node.left, node.right), (node.right, node.left)):
            text, count = fold(text_node, depth + 1), _int(count_node)
            if text is not None and count is not None:
                return _capped(text * count) if len(text) * count <= MAX_FOLDED_CHARS else None
    return None


def _fold_slice(node: ast.Subscript, depth: int) -> str | None:
    text = fold(node.value, depth + 1)
    cut = node.slice
    assert isinstance(cut, ast.Slice)
    bounds = [None if part is None else _int(part) for part in (cut.lower, cut.upper, cut.step)]
    given = [part for part in (cut.lower, cut.upper, cut.step) if part is not None]
    if text is None or len([b for b in bounds if b is not None]) != len(given) or bounds[2] == 0:
        return None
    return text[bounds[0] : bounds[1] : bounds[2]]


def _fold_call(node: ast.Call, depth: int) -> str | None:
    func = node.func
    if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
        return None
    if isinstance(func, ast.Name) and func.id == "chr" and len(node.args) == 1:
        code = _int(node.args[0])
        return chr(code) if code is not None and 0 <= code <= 0x10FFFF else None
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "decode" and not node.args and isinstance(func.value, ast.Constant):
        raw = func.value.value
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None
    base = fold(func.value, depth + 1)
    if base is None:
        return None
    if func.attr == "join" and len(node.args) == 1:
        items = node.args[0]
        if not isinstance(items, ast.List | ast.Tuple):
            return None
        parts = [fold(item, depth + 1) for item in items.elts]
        return _capped(base.join(p for p in parts if p is not None)) if None not in parts else None
    args = [fold(arg, depth + 1) for arg in node.args]
    strings = [arg for arg in args if arg is not None]
    if len(strings) != len(args):
        return None
    if func.attr in _CASES and not strings:
        return _CASES[func.attr](base)
    if func.attr == "replace" and len(strings) == 2:
        old, new = strings
        if len(base) + len(new) * (len(base) + 1) > MAX_FOLDED_CHARS:
            return None
        return base.replace(old, new)
    return None


_CASES: dict[str, Callable[[str], str]] = {
    "lower": str.lower,
    "upper": str.upper,
    "strip": str.strip,
}

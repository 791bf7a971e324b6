"""What both scans share: reading the code into a tree, the violation list, and what a name
denotes (the value of a string built from literals is :mod:`.folding`'s).

Reading refuses, as one violation each and never an exception: code over
:data:`MAX_SOURCE_CHARS`, a source encoding declaration other than UTF-8 (code run from bytes
honours it, so ``# coding: utf-7`` would make the interpreter read other code than the scan
did), code that does not parse (Python's own message and line), code nested too deeply
for the parser, and code of more than :data:`~.folding.MAX_SCAN_NODES` syntax nodes. Code
that is not a ``str`` is a caller's mistake: :class:`InvalidArgumentError`.
"""

from __future__ import annotations

import ast
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field

from harombe.errors import InvalidArgumentError
from harombe.security.policy.guardrails.folding import MAX_SCAN_NODES, too_complex
from harombe.security.policy.guardrails.tables import CODING_COOKIE, UTF8_NAMES

#: The longest code the scans read (characters).
MAX_SOURCE_CHARS = 1_000_000
#: Violations listed per scan; past it one line says how many more there were.
MAX_VIOLATIONS = 100


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
        tree = ast.parse(code)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return [f"SyntaxError: {exc.msg}{where}"]
    except (RecursionError, MemoryError) as exc:
        return [f"Code is nested too deeply to analyse ({type(exc).__name__}); flatten it"]
    except ValueError as exc:  # older parsers: null bytes
        return [f"SyntaxError: {exc}"]
    if _node_count(tree, MAX_SCAN_NODES + 1) > MAX_SCAN_NODES:
        return [too_complex(f"more than {MAX_SCAN_NODES:,} syntax nodes")]
    return tree


def _node_count(tree: ast.AST, limit: int) -> int:
    """The nodes of ``tree``, counted up to ``limit``."""
    count, stack = 0, [tree]
    while stack and count < limit:
        count += 1
        stack.extend(ast.iter_child_nodes(stack.pop()))
    return count


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

"""The value of a string the code builds from literals alone, and the work budget of one scan.

:class:`Folder` folds ``"__glo" + "bals__"``, ``chr(95) * 2``, f-strings of literals,
``"".join([...])``, slices, ``.lower()``/``.upper()``/``.strip()``/``.replace()`` and
``b"…".decode()`` to the text they evaluate to. Each node is folded once per scan (the result
is kept), and the characters built are counted against the scan's :class:`Budget`, so a file
of long literal chains costs linear time; past the budget the stage stops and reports one
violation (:attr:`Budget.exceeded`). Pure.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

#: The longest string a fold builds (``"_" * 10**9`` is not built).
MAX_FOLDED_CHARS = 10_000
#: Syntax nodes one stage visits at most, string annotations scanned as code included: code
#: past it is one violation, never a long stall (both stages at the limit take about 2 s).
#: Far above what a person or a model writes: 40,000 lines of ``x = 1`` are 160,000 nodes,
#: a list literal of 200,000 numbers about 200,000.
MAX_SCAN_NODES = 250_000
#: Characters the string folding of one stage may build in all (each node's string counted
#: once): chains of literal concatenations cannot make the scan quadratic.
MAX_FOLD_WORK = 4_000_000


class Budget:
    """What one stage may still spend: syntax nodes visited and characters folded. Past
    either, ``exceeded`` holds the one violation the stage reports instead of its findings
    (the stage stops at its next node)."""

    def __init__(self, nodes: int = MAX_SCAN_NODES, fold_chars: int = MAX_FOLD_WORK) -> None:
        self.nodes_left = nodes
        self.fold_chars_left = fold_chars
        self.exceeded: str | None = None

    def nodes(self, count: int) -> bool:
        """Spend ``count`` node visits; False once anything is over budget."""
        self.nodes_left -= count
        if self.nodes_left < 0 and self.exceeded is None:
            self.exceeded = too_complex(f"more than {MAX_SCAN_NODES:,} syntax nodes")
        return self.exceeded is None

    def fold(self, chars: int) -> bool:
        """Spend ``chars`` characters of folding; False once anything is over budget."""
        self.fold_chars_left -= chars
        if self.fold_chars_left < 0 and self.exceeded is None:
            self.exceeded = too_complex("strings built from literals are too long and many")
        return self.exceeded is None


def too_complex(why: str) -> str:
    """The one violation of code a scan gives up on."""
    return f"Code is too complex to analyse ({why}); split it into smaller runs or simplify it"


def fold(node: ast.AST) -> str | None:
    """The string ``node`` evaluates to when built from literals alone (None otherwise), with
    a budget of its own: for one-off use. A scan shares one :class:`Folder`."""
    return Folder(Budget()).fold(node)


class Folder:
    """Folds nodes, each once, spending ``budget`` (see the module docstring). Iterative,
    children before parents, so a chain thousands of nodes long folds without recursion."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        # Keyed by the node itself (not id()): the folder keeps the nodes alive, so an id
        # reused by a tree parsed later cannot return a stale value.
        self._known: dict[ast.AST, str | None] = {}

    def fold(self, node: ast.AST) -> str | None:
        """The string ``node`` evaluates to when built from literals alone; None when it is
        not, or is longer than :data:`MAX_FOLDED_CHARS`."""
        known = self._known
        stack: list[tuple[ast.AST, bool]] = [(node, False)]
        while stack:
            current, ready = stack.pop()
            if current in known:
                continue
            if ready:
                text = self._combine(current)
                known[current] = text
                if not self.budget.fold(1 + (len(text) if text is not None else 0)):
                    return None  # the stage reports the budget, not this string
                continue
            stack.append((current, True))
            stack.extend((part, False) for part in _parts(current) if part not in known)
        return known[node]

    def _combine(self, node: ast.AST) -> str | None:
        """``node``'s string from its parts' (all folded already)."""
        value = self._known.get
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            return _joined("", [value(part) for part in node.values])
        if isinstance(node, ast.FormattedValue):
            return value(node.value) if _plain(node) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return _joined("", [value(node.left), value(node.right)])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for text_node, count_node in ((node.left, node.right), (node.right, node.left)):
                text, count = value(text_node), _int(count_node)
                if text is not None and count is not None:
                    return text * count if len(text) * count <= MAX_FOLDED_CHARS else None
            return None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return _sliced(value(node.value), node.slice)
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _call(self, node: ast.Call) -> str | None:
        func = node.func
        if not _simple_call(node):
            return None
        if isinstance(func, ast.Name):
            code = _int(node.args[0]) if func.id == "chr" and len(node.args) == 1 else None
            return chr(code) if code is not None and 0 <= code <= 0x10FFFF else None
        if not isinstance(func, ast.Attribute):
            return None
        if func.attr == "decode" and not node.args and isinstance(func.value, ast.Constant):
            raw = func.value.value
            return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None
        base = self._known.get(func.value)
        if base is None:
            return None
        if func.attr == "join" and len(node.args) == 1:
            items = node.args[0]
            if not isinstance(items, ast.List | ast.Tuple):
                return None
            return _joined(base, [self._known.get(item) for item in items.elts])
        args = [self._known.get(arg) for arg in node.args]
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


def _parts(node: ast.AST) -> list[ast.AST]:
    """The nodes whose strings ``node``'s string is made of (folded first)."""
    if isinstance(node, ast.JoinedStr):
        return list(node.values)
    if isinstance(node, ast.FormattedValue):
        return [node.value] if _plain(node) else []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [node.left, node.right]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        sides = ((node.left, node.right), (node.right, node.left))
        return [text for text, count in sides if _int(count) is not None]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        return [node.value]
    if isinstance(node, ast.Call) and _simple_call(node) and isinstance(node.func, ast.Attribute):
        items = node.args[0] if node.func.attr == "join" and len(node.args) == 1 else None
        elements = list(items.elts) if isinstance(items, ast.List | ast.Tuple) else []
        return [node.func.value, *elements, *node.args]
    return []


def _plain(node: ast.FormattedValue) -> bool:
    return node.conversion in (-1, ord("s")) and node.format_spec is None


def _simple_call(node: ast.Call) -> bool:
    return not node.keywords and not any(isinstance(arg, ast.Starred) for arg in node.args)


def _sliced(text: str | None, cut: ast.Slice) -> str | None:
    bounds = [None if part is None else _int(part) for part in (cut.lower, cut.upper, cut.step)]
    given = [part for part in (cut.lower, cut.upper, cut.step) if part is not None]
    if text is None or len([b for b in bounds if b is not None]) != len(given):
        return None
    return None if bounds[2] == 0 else text[bounds[0] : bounds[1] : bounds[2]]


def _joined(separator: str, parts: list[str | None]) -> str | None:
    """``separator.join(parts)`` when every part folded and the result is not too long."""
    if None in parts:
        return None
    strings = [part for part in parts if part is not None]
    size = len(separator) * max(len(strings) - 1, 0) + sum(len(part) for part in strings)
    return separator.join(strings) if size <= MAX_FOLDED_CHARS else None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return None


_CASES: dict[str, Callable[[str], str]] = {
    "lower": str.lower,
    "upper": str.upper,
    "strip": str.strip,
}

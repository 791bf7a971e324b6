"""The ``ast_scan`` stage: the structure of the code against the profile.

Refused, each as ``Line N: <what>``:

* imports outside the profile's allowlist (``import os``, ``from os import path``), relative
  imports; ``from __future__ import …`` is a compiler directive and always allowed;
* the builtins that run strings, import by name, reach namespaces or read attributes by a
  computed name (``eval``, ``exec``, ``compile``, ``__import__``, ``open``, ``getattr``,
  ``setattr``, ``delattr``, ``breakpoint``, ``input``, ``globals``, ``locals``, ``vars``,
  ``get_type_hints``), called or merely named (``e = eval``, ``@eval``, ``x=eval`` defaults);
* attribute names refused on any object (``.open``, ``.system``, ``.__class__``,
  ``.f_globals``, ``._os``…, see :mod:`.tables`), read through ``x.attr``, ``from m import
  attr``, class patterns (``case object(_os=o)``) and ``operator.attrgetter`` /
  ``methodcaller``, which must be called directly with literal names;
* any member of ``subprocess``, ``socket``, ``importlib``, ``signal``; the os process family;
* the profile's blocklist entries (``pd.read_pickle``, ``from scipy.io import loadmat``,
  ``import numpy.ctypeslib``, a star import's names);
* dunder names read bare (``__builtins__``) or bound outside a class body (``__name__ = "x"``
  would make the runtime layer take the code for a library's), as subscript keys, string
  literals, strings built from literals (``"__glo" + "bals__"``, ``chr(95) * 2``), and fields
  of format strings (``"{0.__globals__}"``).

* class patterns that could read an attribute named at run time: positional sub-patterns
  (they read what ``__match_args__`` names) unless the class is a builtin self-matching type
  under its own name (``case int(n)``); ``__match_args__``, ``__instancecheck__``,
  ``__subclasscheck__``, ``__subclasshook__`` bound, even in a class body;
* a computed key into a namespace (``globals()[k]``, ``x.__dict__[k]``, ``sys.modules[k]``).

String annotations are scanned as code (``typing.get_type_hints`` evaluates them), and
``__annotations__`` may not be reached or bound. The walk spends a budget
(:class:`~.folding.Budget`): past it the code is one "too complex" violation.

Identifiers reach the scan as Python reads them (NFKC: ``ｅval`` is ``eval``); strings are
normalised the same way before they are judged.
"""

from __future__ import annotations

import ast

from harombe.security.policy.guardrails import attributes
from harombe.security.policy.guardrails.folding import Budget, Folder
from harombe.security.policy.guardrails.source import Names, Violations, parse
from harombe.security.policy.guardrails.tables import (
    BINDABLE_DUNDERS,
    BLOCKED_BUILTINS,
    DUNDER,
    DYNAMIC_ATTRIBUTE_CALLS,
    DYNAMIC_ITEM_CALLS,
    MATCH_DUNDERS,
    NAMESPACE_ATTRIBUTES,
    NAMESPACE_CALLS,
    READABLE_DUNDERS,
    SELF_MATCHING_TYPES,
    UNBINDABLE_DUNDERS,
)
from harombe.security.policy.profiles import Profile

_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp,
                    ast.SetComp, ast.DictComp, ast.GeneratorExp)  # fmt: skip
_MAX_ANNOTATION_DEPTH = 3
_MAX_ANNOTATION_CHARS = 10_000
_BUILT = (ast.JoinedStr, ast.BinOp, ast.Call, ast.Subscript)
_NODE_TYPES = [
    kind for kind in vars(ast).values() if isinstance(kind, type) and issubclass(kind, ast.AST)
]


def ast_scan(code: str, profile: Profile) -> list[str]:
    """Violations of ``code`` against ``profile`` (empty: it passed). A syntax error, code too
    large or too deeply nested is one violation; code that is not a str raises
    :class:`~harombe.errors.InvalidArgumentError`."""
    tree = parse(code)
    return tree if isinstance(tree, list) else scan_tree(tree, profile)


def scan_tree(tree: ast.Module, profile: Profile, names: Names | None = None) -> list[str]:
    """:func:`ast_scan` of code already parsed (``names``: the tree's, if already read)."""
    try:
        scan = _Scan(tree, profile, names or Names(tree))
        scan.run(tree)
    except (RecursionError, MemoryError) as exc:
        return [f"Code is nested too deeply to analyse ({type(exc).__name__}); flatten it"]
    if scan.budget.exceeded is not None:
        return [scan.budget.exceeded]
    return scan.found.texts()


def _annotation_strings(annotation: ast.AST) -> list[tuple[str, int]]:
    """The string literals of an annotation outside ``Literal[...]``, with their lines."""
    found, stack = [], [annotation]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Subscript):
            head = node.value
            name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
            if name == "Literal":
                continue
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and len(text) <= _MAX_ANNOTATION_CHARS:
            found.append((text, node.lineno))  # type: ignore[attr-defined]
        stack.extend(ast.iter_child_nodes(node))
    return found


class _Scan:
    """One walk over the tree; ``visit_<node type>`` is called for each node, parents first,
    with the kind of scope the node binds names in (module, function or class)."""

    def __init__(self, tree: ast.Module, profile: Profile, names: Names) -> None:
        self.profile = profile
        self.names = names
        self.found = Violations()
        self.called: set[int] = set()  # ids of nodes that are the function of a call
        self.budget = Budget()
        self.fold = Folder(self.budget).fold
        self._visitors = {
            kind: method
            for kind in _NODE_TYPES
            if (method := getattr(self, f"visit_{kind.__name__}", None)) is not None
        }

    def run(self, tree: ast.AST) -> None:
        stack: list[tuple[ast.AST, str]] = [(tree, "module")]
        budget = self.budget
        while stack:
            node, scope = stack.pop()
            if not budget.nodes(1):
                return
            visit = self._visitors.get(type(node))
            if visit is not None:
                visit(node, scope)
            if isinstance(node, _BUILT):
                self._built_string(node)
            inner = "function" if isinstance(node, _FUNCTION_SCOPES) else scope
            body = {id(child) for child in node.body} if isinstance(node, ast.ClassDef) else ()
            for child in reversed(list(ast.iter_child_nodes(node))):
                stack.append((child, "class" if id(child) in body else inner))

    # -- imports ---------------------------------------------------------------------------

    def _import_refused(self, node: ast.AST, module: str) -> bool:
        if module.split(".")[0] in self.profile.allowed_imports:
            return False
        allowed = ", ".join(self.profile.allowed_imports) or "none"
        self.found.add(
            node,
            f"Import '{module}' is not allowed in the current security profile. "
            f"Allowed modules: {allowed}",
        )
        return True

    def visit_Import(self, node: ast.Import, scope: str) -> None:
        for alias in node.names:
            if not self._import_refused(node, alias.name):
                self._add(node, attributes.in_module_path(alias.name, self.profile))
            self._bind(node, alias.asname or alias.name.split(".")[0], scope)

    def visit_ImportFrom(self, node: ast.ImportFrom, scope: str) -> None:
        names = ", ".join(alias.name for alias in node.names)
        if node.level or not node.module:
            source = "." * node.level + (node.module or "")
            self.found.add(node, f"relative import 'from {source} import {names}' is not allowed")
            return
        if node.module == "__future__" or self._import_refused(node, node.module):
            return
        module = node.module
        self._add(node, attributes.in_module_path(module, self.profile))
        for alias in node.names:
            if alias.name == "*":
                continue
            self._add(node, attributes.any_object(alias.name, module))
            self._add(node, attributes.on_module(module, alias.name, call=False))
            self._add(node, attributes.blocked_by_profile(module, alias.name, self.profile))
            self._bind(node, alias.asname or alias.name, scope)

    # -- names -----------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name, scope: str) -> None:
        name = node.id
        if not isinstance(node.ctx, ast.Load):
            self._bind(node, name, scope)
            return
        if name in BLOCKED_BUILTINS:
            called = id(node) in self.called
            text = f"call to '{name}()'" if called else f"reference to '{name}'"
            self.found.add(node, f"{text} is not allowed")
        elif DUNDER.fullmatch(name) and name not in READABLE_DUNDERS:
            self.found.add(node, f"reference to '{name}' is not allowed")
        self._dynamic_reference(node, name)
        for module in sorted(self.names.star_modules):
            problem = attributes.any_object(name, module)
            self._add(node, problem or attributes.blocked_by_profile(module, name, self.profile))

    def _bind(self, node: ast.AST, name: str, scope: str) -> None:
        if not DUNDER.fullmatch(name) or name in BINDABLE_DUNDERS:
            return
        if scope != "class" or name in UNBINDABLE_DUNDERS:
            why = " (it decides what class patterns match)" if name in MATCH_DUNDERS else ""
            self.found.add(node, f"assignment to '{name}' is not allowed{why}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: str) -> None:
        self._bind(node, node.name, scope)
        self._annotation(node.returns)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef, scope: str) -> None:
        self._bind(node, node.name, scope)

    def visit_arg(self, node: ast.arg, scope: str) -> None:
        self._bind(node, node.arg, "function")
        self._annotation(node.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign, scope: str) -> None:
        self._annotation(node.annotation)

    def _annotation(self, annotation: ast.AST | None, depth: int = 0) -> None:
        """Strings in an annotation are code: ``typing.get_type_hints`` (which
        ``functools.singledispatch``'s ``register`` calls) evaluates them, and a string it
        gets back it evaluates again. They are parsed and scanned like the code around them
        (``Literal[...]`` values are data, and a string that does not parse cannot run)."""
        if annotation is None or depth > _MAX_ANNOTATION_DEPTH:
            return
        for text, line in _annotation_strings(annotation):
            try:
                tree = ast.parse(text.strip(), mode="eval")
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            ast.increment_lineno(tree, line - 1)
            self.run(tree)
            self._annotation(tree.body, depth + 1)

    def visit_ExceptHandler(self, node: ast.ExceptHandler, scope: str) -> None:
        if node.name:
            self._bind(node, node.name, scope)

    def visit_Global(self, node: ast.Global | ast.Nonlocal, scope: str) -> None:
        for name in node.names:
            self._bind(node, name, "function")

    visit_Nonlocal = visit_Global

    def visit_MatchAs(self, node: ast.MatchAs | ast.MatchStar, scope: str) -> None:
        if node.name:
            self._bind(node, node.name, scope)

    visit_MatchStar = visit_MatchAs

    def visit_MatchMapping(self, node: ast.MatchMapping, scope: str) -> None:
        if node.rest:
            self._bind(node, node.rest, scope)

    def visit_keyword(self, node: ast.keyword, scope: str) -> None:
        # type("X", (), dict(__annotations__=…)) sets what a class body may not.
        if node.arg and attributes.dangerous_key(node.arg):
            self.found.add(node, f"keyword argument '{node.arg}' is not allowed")

    def visit_MatchClass(self, node: ast.MatchClass, scope: str) -> None:
        owner = self.names.qualname(node.cls)
        for attr in node.kwd_attrs:
            problem = attributes.any_object(attr, owner) or attributes.blocked_by_profile(
                owner, attr, self.profile
            )
            if problem or DUNDER.fullmatch(attr):
                self.found.add(node, f"class pattern reading attribute '{attr}' is not allowed")
        if node.patterns and not self._self_matching(node.cls):
            name = self.names.dotted(node.cls) or "C"
            builtins = ", ".join(sorted(SELF_MATCHING_TYPES))
            self.found.add(
                node,
                f"positional sub-pattern in class pattern '{name}(...)' is not allowed: it "
                "reads the attributes the class's __match_args__ names, which code can set at "
                f"run time; match by keyword ('case {name}(x=...)'); only the builtin types "
                f"{builtins} take a positional sub-pattern",
            )

    def _self_matching(self, cls: ast.AST) -> bool:
        """``cls`` is a builtin type that matches the subject itself, under its own name
        (not bound anywhere in the code, no star import that could bind it)."""
        return (
            isinstance(cls, ast.Name)
            and cls.id in SELF_MATCHING_TYPES
            and cls.id not in self.names.candidates
            and not self.names.star_modules
        )

    # -- attributes and calls --------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute, scope: str) -> None:
        owner = self.names.qualname(node.value)
        call = id(node) in self.called
        problems = [attributes.any_object(node.attr, owner)]
        problems += [
            attributes.on_module(o, node.attr, call=call) for o in self.names.owners(node.value)
        ]
        problems.append(attributes.blocked_by_profile(owner, node.attr, self.profile))
        self._add(node, next((p for p in problems if p is not None), None))
        self._dynamic_reference(node, node.attr)

    def _dynamic_function(self, func: ast.AST) -> str | None:
        """``attrgetter``/``methodcaller``/``itemgetter`` when ``func`` names one (by name, by
        attribute, or through an alias such as ``from operator import attrgetter as g``)."""
        known = DYNAMIC_ATTRIBUTE_CALLS | DYNAMIC_ITEM_CALLS
        if isinstance(func, ast.Attribute) and func.attr in known:
            return func.attr
        if isinstance(func, ast.Name):
            resolved = (self.names.qualname(func) or func.id).rpartition(".")[2]
            return resolved if func.id in known or resolved in known else None
        return None

    def _dynamic_reference(self, node: ast.Name | ast.Attribute, name: str) -> None:
        function = self._dynamic_function(node)
        if function in DYNAMIC_ATTRIBUTE_CALLS and id(node) not in self.called:
            self.found.add(
                node,
                f"reference to '{function}' outside a direct call is not allowed; call "
                f"{function}() directly with literal names",
            )

    def visit_Call(self, node: ast.Call, scope: str) -> None:
        self.called.add(id(node.func))
        function = self._dynamic_function(node.func)
        if function is None:
            return
        names = node.args[:1] if function == "methodcaller" else node.args
        for arg in names:
            text = self.fold(arg) if not isinstance(arg, ast.Starred) else None
            if text is None and function in DYNAMIC_ATTRIBUTE_CALLS:
                self.found.add(
                    node,
                    f"{function}() with a computed attribute name is not allowed; pass "
                    "literal names",
                )
            elif text is not None and function in DYNAMIC_ATTRIBUTE_CALLS:
                for problem in attributes.dynamic_name(text, function, self.profile):
                    self.found.add(node, problem)
            elif text is not None and attributes.dangerous_key(text):
                self.found.add(node, f"dynamic item access to '{text}' via {function}() "
                               "is not allowed")  # fmt: skip

    # -- strings ---------------------------------------------------------------------------

    def visit_Subscript(self, node: ast.Subscript, scope: str) -> None:
        key = self.fold(node.slice)
        if key is not None and attributes.dangerous_key(key):
            self.found.add(node, f"subscript access with key '{key}' is not allowed")
        namespace = self._namespace(node.value)
        if key is None and namespace is not None and not isinstance(node.slice, ast.Slice):
            self.found.add(
                node,
                f"subscript with a computed key into a namespace ('{namespace}') is not "
                "allowed; use a literal key",
            )

    def _namespace(self, value: ast.AST) -> str | None:
        """What ``value`` is when it is a namespace (name → object): a call of ``globals``,
        ``locals``, ``vars``; a ``__dict__``/``__globals__``/``f_globals``… attribute;
        ``__builtins__``; ``sys.modules``."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return f"{value.func.id}()" if value.func.id in NAMESPACE_CALLS else None
        if isinstance(value, ast.Name):
            return value.id if value.id == "__builtins__" else None
        if not isinstance(value, ast.Attribute):
            return None
        if value.attr in NAMESPACE_ATTRIBUTES:
            return f".{value.attr}"
        owners = [*self.names.owners(value.value), self.names.dotted(value.value)]
        if value.attr == "modules" and "sys" in owners:
            return "sys.modules"
        return None

    def visit_Constant(self, node: ast.Constant, scope: str) -> None:
        if isinstance(node.value, str):
            for problem in attributes.in_string(node.value):
                self.found.add(node, problem)

    def _built_string(self, node: ast.AST) -> None:
        text = self.fold(node)
        if text is not None:
            for problem in attributes.in_string(text, built=True):
                self.found.add(node, problem)

    def _add(self, node: ast.AST, problem: str | None) -> None:
        if problem is not None:
            self.found.add(node, problem)

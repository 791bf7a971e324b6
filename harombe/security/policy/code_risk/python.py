"""Dangerous constructs in Python source, found through its syntax tree.

Names are resolved through imports and simple assignments (``import os as o``, ``from os import
system as s``, ``f = os.system``, ``__import__("os")``, ``sys.modules["os"]``,
``getattr(os, "system")``), so aliases do not hide a call; a *reference* counts, not only a call,
so ``e = eval`` is found where it is written. A dotted name is judged by every suffix, so a
module's re-export (``shutil.os.system``) is the function it re-exports; and an attribute with a
dangerous name (``system``, ``popen``, ``exec*``, ``spawn*``…, see
:mod:`~harombe.security.policy.code_risk.python_names`) is a finding on any object not known to be
harmless, since ``[os][0]`` or a function's result may be the module. Attribute access with
ordinary names (``model.eval()``, ``re.compile``, ``cursor.execute``) is not a finding.

Name resolution is :mod:`.python_resolve`; literal paths and written scripts are
:mod:`.python_paths`.
"""

from __future__ import annotations

import ast
import re

from harombe.security.policy.code_risk import Finding, cut
from harombe.security.policy.code_risk.python_names import (
    DYNAMIC_BUILTINS,
    ESCAPE_ATTRIBUTES,
    HARMLESS_MEMBERS,
    IMPORT_FINDINGS,
)
from harombe.security.policy.code_risk.python_paths import PathChecks
from harombe.security.policy.code_risk.python_resolve import (
    NameResolver,
    argument,
    canonical,
    const_str,
    describe,
    describe_exact,
    is_dangerous_leaf,
    leaf_danger,
)

#: A dotted name written as a string (``"os.system"``, ``"subprocess:Popen"``).
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class _Analyzer:
    """One module's analysis: visitors (``visit_<node type>``) called on every node of the
    tree, after :meth:`NameResolver.collect_aliases` has read all its bindings."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.names = NameResolver()
        self.qualname = self.names.qualname
        self.paths = PathChecks(self.names, self.report, depth)
        self.findings: list[Finding] = []
        self.called: set[int] = set()  # ids of nodes that are the function of a call
        #: Module namespaces used as data (``vars(os)``, ``sys.modules``), and the ids of those
        #: that are only read by a constant key, which the lookup itself judges.
        self.exposures: list[tuple[ast.AST, str]] = []
        self.keyed: set[int] = set()

    def report(self, node: ast.AST, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, getattr(node, "lineno", None)))

    # -- name resolution -------------------------------------------------------------------

    # -- visitors --------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            why = describe(canonical(alias.name)) or IMPORT_FINDINGS.get(alias.name)
            if why:
                self.report(node, "import", f"imports {alias.name}: {why}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = canonical(node.module or "")
        for alias in node.names:
            why = (
                describe(module)
                or describe(f"{module}.{alias.name}")
                or IMPORT_FINDINGS.get(module)
            )
            if why:
                self.report(node, "import", f"imports {alias.name} from {node.module}: {why}")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id == "__builtins__":
                self.report(node, "escape", "__builtins__ reaches every builtin, eval included")
            elif node.id in ("__loader__", "__spec__"):
                self.report(node, "escape", f"{node.id} loads and runs modules")
            else:
                qualname = self.qualname(node)
                why = describe(qualname) if qualname else None
                if why:
                    self.report(node, "call", why)
                elif qualname == "sys.modules":
                    self.exposures.append((node, "sys.modules"))
                elif (
                    qualname is not None
                    and (leaf_why := leaf_danger(qualname.rsplit(".", 1)[-1]))
                    and canonical(qualname) not in HARMLESS_MEMBERS
                ):
                    # from anylib import run_setup: a dangerous name imported from anywhere.
                    self.report(node, "call", f"{node.id} ({qualname}): {leaf_why}")
                elif (
                    self.names.star_modules
                    and qualname is None
                    and (star_why := self._star_danger(node.id))
                ):
                    self.report(node, "call", f"{node.id} (from a star import): {star_why}")
                elif qualname == "builtins.getattr" and id(node) not in self.called:
                    # reduce(getattr, ["system"], os): the names it looks up are data.
                    self.report(node, "computed-name", "getattr passed as a value looks up "
                                "names the scan cannot see")  # fmt: skip

    def _star_danger(self, name: str) -> str | None:
        """Why a bare ``name`` is dangerous when a star import may have bound it: judged as a
        member of each star-imported module, and by its own name (an unknown module may
        re-export anything)."""
        for module in self.names.star_modules:
            if why := describe(f"{module}.{name}"):
                return why
        return leaf_danger(name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "__dict__" and (owner := self.qualname(node.value)):
            self.exposures.append((node, f"{owner}.__dict__"))
        if node.attr in ESCAPE_ATTRIBUTES:
            self.report(node, "escape", f"{node.attr} climbs out to builtins or raw code")
        qualname = self.qualname(node)
        if qualname == "sys.modules":
            self.exposures.append((node, "sys.modules"))
        why = describe(qualname) if qualname else None
        # The base is reported on its own (an imported dangerous module); report the member
        # only when the danger starts here, so one use is one finding.
        if why and (base := self.qualname(node.value)) and describe(base) is None:
            self.report(node, "call", why)
        elif (
            not why
            and isinstance(node.ctx, ast.Load)
            and (leaf_why := leaf_danger(node.attr))
            and (qualname is None or canonical(qualname) not in HARMLESS_MEMBERS)
        ):
            # Anything may be a module here (a list element, a function's result, another
            # module's re-export): a dangerous name is judged by the name. The receiver is part
            # of the finding, so approving ``job.spawn()`` never approves ``[os][0].spawn()``.
            receiver = _source(node.value)
            self.report(node, "call", f".{node.attr} on {receiver}: {leaf_why}")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        value = node.value
        if self.names.is_namespace(value):
            key = const_str(node.slice)
            if key is not None:
                self.keyed.add(id(value))
            module = self.names.namespace_module(value)
            if key is None:
                self.report(node, "computed-name", f"{_source(value)}[…] looks up a name "
                            "computed at run time")  # fmt: skip
            elif key in DYNAMIC_BUILTINS or key in ESCAPE_ATTRIBUTES or describe(key):
                self.report(node, "escape", f"looks up {key!r} by name")
            elif module and (why := describe(f"{module}.{key}")):
                self.report(node, "call", why)

    def visit_Constant(self, node: ast.Constant) -> None:
        # "os.system" or "os:system" as data: dictConfig's "()", hydra's _target_,
        # pydoc.locate and pkgutil.resolve_name turn such a string into the callable.
        if isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            name = node.value.replace(":", ".")
            # Judged from its first part: "build.sh" is a file name, not the sh module.
            if (why := describe_exact(name)) and canonical(name) not in HARMLESS_MEMBERS:
                self.report(node, "callable-name", f"the string {node.value!r} names a "
                            f"callable a loader can resolve: {why}")  # fmt: skip

    def visit_Compare(self, node: ast.Compare) -> None:
        # "numpy" in sys.modules asks whether a name is there; it reaches nothing.
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn):
                self.keyed.add(id(comparator))

    def report_exposures(self) -> None:
        """Namespaces used other than by a constant key: iterated, copied or passed on, they
        hand out every member (``system`` included) to names the scan cannot read."""
        for node, what in self.exposures:
            if id(node) not in self.keyed:
                self.report(node, "namespace", f"{what} used as data exposes every member of "
                            "the namespace to names computed at run time")  # fmt: skip

    def visit_Call(self, node: ast.Call) -> None:
        """Calls that touch paths, look names up, or load code; the function called is judged
        where its name is visited."""
        func = self.qualname(node.func)
        self._namespace_use(node, func)
        self.paths.check_paths(node, func)
        self.paths.check_written_script(node)
        if func == "yaml.load" and not any(
            kw.arg == "Loader" and (self.qualname(kw.value) or "").endswith("SafeLoader")
            for kw in node.keywords
        ):
            self.report(node, "call", "yaml.load() without SafeLoader can build any object")
        self._getattr(node, func)
        self._name_getters(node, func)
        if func == "importlib.import_module" and (module_arg := argument(node, 0, "name")):
            name = const_str(module_arg)
            if name is None:
                self.report(node, "computed-name", "imports a module whose name is computed")
            elif why := describe(canonical(name)) or IMPORT_FINDINGS.get(name):
                self.report(node, "import", f"imports {name}: {why}")

    def _namespace_use(self, node: ast.Call, func: str | None) -> None:
        """Namespaces read by a constant key (``sys.modules.get("json")``), handed out whole
        (``vars(os)``, ``inspect.getmembers(os)``), or asked for a dangerous name."""
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "keys")
            and (node.func.attr == "keys" or (node.args and const_str(node.args[0]) is not None))
        ):
            self.keyed.add(id(node.func.value))  # sys.modules.get("json")
        if (
            isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args
            and (owner := self.qualname(node.args[0]))
        ):  # fmt: skip
            self.exposures.append((node, f"vars({owner})"))
        if func == "inspect.getmembers" and node.args and self.qualname(node.args[0]):
            self.report(node, "namespace", "inspect.getmembers() on a module hands out every "
                        "member, system included")  # fmt: skip
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault", "__getitem__")
            and node.args
            and (key := const_str(node.args[0])) is not None
            and (leaf_danger(key) or key in DYNAMIC_BUILTINS)
            and self.names.is_namespace(node.func.value)
        ):
            self.report(node, "escape", f"looks up {key!r} by name")

    def _getattr(self, node: ast.Call, func: str | None) -> None:
        """``getattr(x, name)`` / ``setattr`` through any alias: the name is judged, and a
        computed name on a module is a finding."""
        is_getattr = func in ("builtins.getattr", "builtins.setattr")
        if is_getattr and len(node.args) >= 2:
            attr = const_str(node.args[1])
            base = node.args[0]
            on_module = self.qualname(base) is not None
            if attr is None and on_module:
                self.report(node, "computed-name", f"getattr() on {self.qualname(base)} with a "
                            "computed name")  # fmt: skip
            elif attr is not None and attr in ESCAPE_ATTRIBUTES:
                self.report(node, "escape", f"getattr() fetches {attr}")
            elif attr is not None and not on_module and (leaf_why := leaf_danger(attr)):
                self.report(node, "call", f"getattr(…, {attr!r}): {leaf_why}")
            elif attr is not None and on_module:
                full = self.qualname(node)
                why = describe(full) if full else None
                if why:
                    self.report(node, "call", why)

    def _name_getters(self, node: ast.Call, func: str | None) -> None:
        """``attrgetter("system")(os)`` reaches os.system without writing it: judge the names."""
        if func in ("operator.attrgetter", "operator.methodcaller") and node.args:
            for arg in node.args[:1] if func == "operator.methodcaller" else node.args:
                name = const_str(arg)
                leaf = name.rsplit(".", 1)[-1] if name else None
                if name is None:
                    self.report(node, "computed-name", f"{func}() with a computed name")
                elif (
                    leaf in ESCAPE_ATTRIBUTES or is_dangerous_leaf(leaf) or leaf_danger(leaf or "")
                ):
                    self.report(node, "escape", f"{func}({name!r}) reaches {name} by name")


def _source(node: ast.AST) -> str:
    """Short source text of an expression, for naming it in a finding."""
    return cut(ast.unparse(node), 60)


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for Python ``code``; code that does not parse is one ``unparseable`` finding."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        message = getattr(exc, "msg", None) or str(exc)
        return [Finding("unparseable", f"Python that does not parse ({message})", line)]
    analyzer = _Analyzer(depth)
    nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if isinstance(item.optional_vars, ast.Name) and (
                    path := analyzer.paths.opened_path(item.context_expr)
                ):
                    analyzer.paths.file_paths[item.optional_vars.id] = path
    analyzer.names.collect_aliases(nodes)
    analyzer.called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    visitors = {
        ast.Import: analyzer.visit_Import,
        ast.ImportFrom: analyzer.visit_ImportFrom,
        ast.Name: analyzer.visit_Name,
        ast.Attribute: analyzer.visit_Attribute,
        ast.Subscript: analyzer.visit_Subscript,
        ast.Call: analyzer.visit_Call,
        ast.Compare: analyzer.visit_Compare,
        ast.Constant: analyzer.visit_Constant,
    }
    for node in nodes:
        visit = visitors.get(type(node))
        if visit is not None:
            visit(node)  # type: ignore[operator]
    analyzer.report_exposures()
    return _dedupe(analyzer.findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

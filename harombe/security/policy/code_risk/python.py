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
"""

from __future__ import annotations

import ast
import functools
import re

from harombe.security.policy.code_risk import Finding
from harombe.security.policy.code_risk.python_names import (
    DANGEROUS_CALLABLES,
    DANGEROUS_LEAVES,
    DANGEROUS_MODULES,
    DANGEROUS_PREFIXES,
    DYNAMIC_BUILTINS,
    ENVIRONMENT_BUILTINS,
    ESCAPE_ATTRIBUTES,
    EXEC_PREFIXES,
    HARMLESS_MEMBERS,
    IMPORT_FINDINGS,
    MODULE_ALIASES,
    NAMESPACE_CALLS,
    REFLECTION_BUILTINS,
)
from harombe.security.policy.code_risk.python_paths import (
    PathChecks,
)
from harombe.security.policy.code_risk.python_paths import argument as _argument
from harombe.security.policy.code_risk.python_paths import const_str as _const_str


@functools.lru_cache(maxsize=4096)  # the same dotted names recur throughout a module
def _describe(qualname: str) -> str | None:
    """Why ``qualname`` is dangerous, trying every suffix: modules re-export each other
    (``shutil.os.system`` is ``os.system``, ``asyncio.subprocess.Popen`` is in subprocess)."""
    parts = qualname.split(".")
    for start in range(len(parts)):
        why = _describe_exact(".".join(parts[start:]) if start else qualname)
        if why:
            return why
    return None


def _describe_exact(qualname: str) -> str | None:
    qualname = _canonical(qualname)
    if qualname in DANGEROUS_CALLABLES:
        return DANGEROUS_CALLABLES[qualname]
    for prefix, why in DANGEROUS_PREFIXES.items():
        if qualname.startswith(prefix):
            return why
    return DANGEROUS_MODULES.get(qualname.split(".", 1)[0])


def _leaf_danger(name: str) -> str | None:
    """Why an attribute called ``name`` is dangerous whatever object it is on."""
    if name in DANGEROUS_LEAVES:
        return DANGEROUS_LEAVES[name]
    if name.startswith(EXEC_PREFIXES):
        return f"{name}() runs another program"
    return None


#: Calls whose result is the module named by their first argument.
_IMPORTERS = ("builtins.__import__", "importlib.import_module", "importlib.__import__")


def _literal_element(container: ast.AST, key: ast.AST) -> ast.AST | None:
    """The element ``container[key]`` picks when both are literals, else ``None``."""
    if isinstance(container, ast.List | ast.Tuple) and isinstance(key, ast.Constant):
        index = key.value
        if isinstance(index, int) and -len(container.elts) <= index < len(container.elts):
            return container.elts[index]
    if isinstance(container, ast.Dict) and isinstance(key, ast.Constant):
        for k, v in zip(container.keys, container.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == key.value:
                return v
    return None


#: A dotted name written as a string (``"os.system"``, ``"subprocess:Popen"``).
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")

_BINDING_NODES = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.NamedExpr)


class _Analyzer(PathChecks):
    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        #: Names bound by ``with open(<literal path>, …) as f``: the path each writes to.
        self.file_paths: dict[str, str] = {}
        self.aliases: dict[str, str] = {}
        self.findings: list[Finding] = []
        self.called: set[int] = set()  # ids of nodes that are the function of a call
        #: Modules star-imported (``from m import *``): their names arrive unseen.
        self.star_modules: set[str] = set()
        #: Module namespaces used as data (``vars(os)``, ``sys.modules``), and the ids of those
        #: that are only read by a constant key, which the lookup itself judges.
        self.exposures: list[tuple[ast.AST, str]] = []
        self.keyed: set[int] = set()

    def report(self, node: ast.AST, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, getattr(node, "lineno", None)))

    # -- name resolution -------------------------------------------------------------------

    def qualname(self, node: ast.AST) -> str | None:
        """The dotted name an expression denotes, if it is a module or a module's member."""
        if isinstance(node, ast.Name):
            if node.id == "__builtins__":
                return "builtins"
            if node.id in self.aliases:
                return self.aliases[node.id]
            if (
                node.id in DYNAMIC_BUILTINS
                or node.id in REFLECTION_BUILTINS
                or node.id in ENVIRONMENT_BUILTINS
            ):
                return f"builtins.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            if not base:
                return None
            # os.sys.modules and json.decoder.re.sys.modules are sys.modules.
            dotted = f"{base}.{node.attr}"
            return "sys.modules" if dotted.endswith(".sys.modules") else dotted
        if isinstance(node, ast.NamedExpr):
            return self.qualname(node.value)
        if isinstance(node, ast.Subscript):
            # sys.modules["os"] is the os module.
            if self.qualname(node.value) == "sys.modules":
                key = _const_str(node.slice)
                return _canonical(key) if key else None
            # vars(m)["f"] and m.__dict__["f"] are m.f.
            if self._is_namespace(node.value) and (key := _const_str(node.slice)):
                owner = self._namespace_module(node.value)
                if owner:
                    return f"{owner}.{key}"
            # [os][0], (os,)[0] and {"m": os}["m"] are the os module.
            element = _literal_element(node.value, node.slice)
            return self.qualname(element) if element is not None else None
        if isinstance(node, ast.Call):
            func = self.qualname(node.func)
            arg = _const_str(_argument(node, 0, "name"))
            if func in _IMPORTERS and arg:
                return _canonical(arg)
            if func == "sys.modules.get" and arg:
                return _canonical(arg)
            if func == "builtins.getattr" or (
                isinstance(node.func, ast.Name) and node.func.id == "getattr"
            ):
                base = self.qualname(node.args[0]) if node.args else None
                attr = _const_str(node.args[1]) if len(node.args) > 1 else None
                return f"{base}.{attr}" if base and attr else None
        return None

    def collect_aliases(self, nodes: list[ast.AST]) -> None:
        binding = [n for n in nodes if isinstance(n, _BINDING_NODES)]
        # Two passes make aliases of aliases (o = os; s = o.system) resolve, in any order.
        for _ in range(2):
            for node in binding:
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            self.aliases[alias.asname] = _canonical(alias.name)
                        else:
                            top = alias.name.split(".", 1)[0]
                            self.aliases[top] = _canonical(top)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    module = _canonical(node.module)
                    for alias in node.names:
                        if alias.name == "*":
                            self.star_modules.add(module)
                            for name in DANGEROUS_CALLABLES:
                                mod, _, attr = name.rpartition(".")
                                if mod == module:
                                    self.aliases[attr] = name
                        else:
                            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    value = node.value
                    resolved = self.qualname(value) if value is not None else None
                    if resolved:
                        for target in targets:
                            if isinstance(target, ast.Name):
                                self.aliases[target.id] = resolved

    # -- visitors --------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            why = _describe(_canonical(alias.name)) or IMPORT_FINDINGS.get(alias.name)
            if why:
                self.report(node, "import", f"imports {alias.name}: {why}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _canonical(node.module or "")
        for alias in node.names:
            why = (
                _describe(module)
                or _describe(f"{module}.{alias.name}")
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
                why = _describe(qualname) if qualname else None
                if why:
                    self.report(node, "call", why)
                elif qualname == "sys.modules":
                    self.exposures.append((node, "sys.modules"))
                elif (
                    qualname is not None
                    and (leaf_why := _leaf_danger(qualname.rsplit(".", 1)[-1]))
                    and _canonical(qualname) not in HARMLESS_MEMBERS
                ):
                    # from anylib import run_setup: a dangerous name imported from anywhere.
                    self.report(node, "call", f"{node.id} ({qualname}): {leaf_why}")
                elif (
                    self.star_modules
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
        for module in self.star_modules:
            if why := _describe(f"{module}.{name}"):
                return why
        return _leaf_danger(name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "__dict__" and (owner := self.qualname(node.value)):
            self.exposures.append((node, f"{owner}.__dict__"))
        if node.attr in ESCAPE_ATTRIBUTES:
            self.report(node, "escape", f"{node.attr} climbs out to builtins or raw code")
        qualname = self.qualname(node)
        if qualname == "sys.modules":
            self.exposures.append((node, "sys.modules"))
        why = _describe(qualname) if qualname else None
        # The base is reported on its own (an imported dangerous module); report the member
        # only when the danger starts here, so one use is one finding.
        if why and (base := self.qualname(node.value)) and _describe(base) is None:
            self.report(node, "call", why)
        elif (
            not why
            and isinstance(node.ctx, ast.Load)
            and (leaf_why := _leaf_danger(node.attr))
            and (qualname is None or _canonical(qualname) not in HARMLESS_MEMBERS)
        ):
            # Anything may be a module here (a list element, a function's result, another
            # module's re-export): a dangerous name is judged by the name. The receiver is part
            # of the finding, so approving ``job.spawn()`` never approves ``[os][0].spawn()``.
            receiver = _source(node.value)
            self.report(node, "call", f".{node.attr} on {receiver}: {leaf_why}")

    def _is_namespace(self, value: ast.AST) -> bool:
        """Whether ``value`` is a namespace of names: ``globals()``, ``vars(m)``, ``m.__dict__``,
        ``sys.modules``."""
        return (
            (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
             and value.func.id in NAMESPACE_CALLS)
            or (isinstance(value, ast.Attribute) and value.attr == "__dict__")
            or self.qualname(value) == "sys.modules"
        )  # fmt: skip

    def visit_Subscript(self, node: ast.Subscript) -> None:
        value = node.value
        if self._is_namespace(value):
            key = _const_str(node.slice)
            if key is not None:
                self.keyed.add(id(value))
            module = self._namespace_module(value)
            if key is None:
                self.report(node, "computed-name", f"{_source(value)}[…] looks up a name "
                            "computed at run time")  # fmt: skip
            elif key in DYNAMIC_BUILTINS or key in ESCAPE_ATTRIBUTES or _describe(key):
                self.report(node, "escape", f"looks up {key!r} by name")
            elif module and (why := _describe(f"{module}.{key}")):
                self.report(node, "call", why)

    def _namespace_module(self, value: ast.AST) -> str | None:
        """The module whose namespace ``vars(m)`` / ``m.__dict__`` is, if known."""
        if isinstance(value, ast.Attribute) and value.attr == "__dict__":
            return self.qualname(value.value)
        if isinstance(value, ast.Call) and value.args and isinstance(value.func, ast.Name):
            return self.qualname(value.args[0]) if value.func.id == "vars" else None
        return None

    def visit_Constant(self, node: ast.Constant) -> None:
        # "os.system" or "os:system" as data: dictConfig's "()", hydra's _target_,
        # pydoc.locate and pkgutil.resolve_name turn such a string into the callable.
        if isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            name = node.value.replace(":", ".")
            # Judged from its first part: "build.sh" is a file name, not the sh module.
            if (why := _describe_exact(name)) and _canonical(name) not in HARMLESS_MEMBERS:
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
        func = self.qualname(node.func)
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "keys")
            and (node.func.attr == "keys" or (node.args and _const_str(node.args[0]) is not None))
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
        self._check_paths(node, func)
        self._check_written_script(node)
        if func == "yaml.load" and not any(
            kw.arg == "Loader" and (self.qualname(kw.value) or "").endswith("SafeLoader")
            for kw in node.keywords
        ):
            self.report(node, "call", "yaml.load() without SafeLoader can build any object")
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault", "__getitem__")
            and node.args
            and (key := _const_str(node.args[0])) is not None
            and (_leaf_danger(key) or key in DYNAMIC_BUILTINS)
            and self._is_namespace(node.func.value)
        ):
            self.report(node, "escape", f"looks up {key!r} by name")
        # Through any alias: ``f = getattr; f(os, "system")`` is getattr too.
        is_getattr = func in ("builtins.getattr", "builtins.setattr")
        if is_getattr and len(node.args) >= 2:
            attr = _const_str(node.args[1])
            base = node.args[0]
            on_module = self.qualname(base) is not None
            if attr is None and on_module:
                self.report(node, "computed-name", f"getattr() on {self.qualname(base)} with a "
                            "computed name")  # fmt: skip
            elif attr is not None and attr in ESCAPE_ATTRIBUTES:
                self.report(node, "escape", f"getattr() fetches {attr}")
            elif attr is not None and not on_module and (leaf_why := _leaf_danger(attr)):
                self.report(node, "call", f"getattr(…, {attr!r}): {leaf_why}")
            elif attr is not None and on_module:
                full = self.qualname(node)
                why = _describe(full) if full else None
                if why:
                    self.report(node, "call", why)
        if func in ("operator.attrgetter", "operator.methodcaller") and node.args:
            # attrgetter("system")(os) reaches os.system without writing it: judge the names.
            for arg in node.args[:1] if func == "operator.methodcaller" else node.args:
                name = _const_str(arg)
                leaf = name.rsplit(".", 1)[-1] if name else None
                if name is None:
                    self.report(node, "computed-name", f"{func}() with a computed name")
                elif (
                    leaf in ESCAPE_ATTRIBUTES
                    or _is_dangerous_leaf(leaf)
                    or _leaf_danger(leaf or "")
                ):
                    self.report(node, "escape", f"{func}({name!r}) reaches {name} by name")
        if func == "importlib.import_module" and (module_arg := _argument(node, 0, "name")):
            name = _const_str(module_arg)
            if name is None:
                self.report(node, "computed-name", "imports a module whose name is computed")
            elif why := _describe(_canonical(name)) or IMPORT_FINDINGS.get(name):
                self.report(node, "import", f"imports {name}: {why}")


def _source(node: ast.AST) -> str:
    """Short source text of an expression, for naming it in a finding."""
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_dangerous_leaf(name: str | None) -> bool:
    """Whether ``name`` is the last part of a dangerous callable (``system``, ``popen``…)."""
    if not name:
        return False
    leaves = {q.rsplit(".", 1)[1] for q in DANGEROUS_CALLABLES}
    return name in leaves or any(name.startswith(p.rsplit(".", 1)[1]) for p in DANGEROUS_PREFIXES)


def _canonical(module: str) -> str:
    top, dot, rest = module.partition(".")
    return MODULE_ALIASES.get(top, top) + dot + rest


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
                    path := analyzer.opened_path(item.context_expr)
                ):
                    analyzer.file_paths[item.optional_vars.id] = path
    analyzer.collect_aliases(nodes)
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

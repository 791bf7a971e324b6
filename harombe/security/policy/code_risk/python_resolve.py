"""What a name in Python code denotes, and why a dotted name is dangerous.

Names are resolved through imports and simple assignments (``import os as o``, ``from os import
system as s``, ``f = os.system``, ``__import__("os")``, ``sys.modules["os"]``,
``getattr(os, "system")``); a dotted name is judged by every suffix, since modules re-export
each other. Pure; :mod:`.python` walks the tree with it.
"""

from __future__ import annotations

import ast
import functools

from harombe.security.policy.code_risk.python_names import (
    DANGEROUS_CALLABLES,
    DANGEROUS_LEAVES,
    DANGEROUS_MODULES,
    DANGEROUS_PREFIXES,
    DYNAMIC_BUILTINS,
    ENVIRONMENT_BUILTINS,
    EXEC_PREFIXES,
    MODULE_ALIASES,
    NAMESPACE_CALLS,
    REFLECTION_BUILTINS,
)

_BINDING_NODES = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.NamedExpr)


def const_str(node: ast.AST | None) -> str | None:
    """The value of a string literal, else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def argument(node: ast.Call, index: int, keyword: str) -> ast.AST | None:
    """The call's argument at ``index``, or passed as ``keyword=``."""
    if len(node.args) > index and not any(isinstance(a, ast.Starred) for a in node.args[:index]):
        return node.args[index]
    return next((kw.value for kw in node.keywords if kw.arg == keyword), None)


@functools.lru_cache(maxsize=4096)  # the same dotted names recur throughout a module
def describe(qualname: str) -> str | None:
    """Why ``qualname`` is dangerous, trying every suffix: modules re-export each other
    (``shutil.os.system`` is ``os.system``, ``asyncio.subprocess.Popen`` is in subprocess)."""
    parts = qualname.split(".")
    for start in range(len(parts)):
        why = describe_exact(".".join(parts[start:]) if start else qualname)
        if why:
            return why
    return None


def describe_exact(qualname: str) -> str | None:
    qualname = canonical(qualname)
    if qualname in DANGEROUS_CALLABLES:
        return DANGEROUS_CALLABLES[qualname]
    for prefix, why in DANGEROUS_PREFIXES.items():
        if qualname.startswith(prefix):
            return why
    return DANGEROUS_MODULES.get(qualname.split(".", 1)[0])


def leaf_danger(name: str) -> str | None:
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


def is_dangerous_leaf(name: str | None) -> bool:
    """Whether ``name`` is the last part of a dangerous callable (``system``, ``popen``…)."""
    if not name:
        return False
    leaves = {q.rsplit(".", 1)[1] for q in DANGEROUS_CALLABLES}
    return name in leaves or any(name.startswith(p.rsplit(".", 1)[1]) for p in DANGEROUS_PREFIXES)


def canonical(module: str) -> str:
    """``module`` under its canonical name (``posix.system`` is ``os.system``)."""
    top, dot, rest = module.partition(".")
    return MODULE_ALIASES.get(top, top) + dot + rest


class NameResolver:
    """The names one module binds: aliases from imports and assignments
    (:meth:`collect_aliases`, run once over every node first) and star-imported modules."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        #: Modules star-imported (``from m import *``): their names arrive unseen.
        self.star_modules: set[str] = set()

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
                key = const_str(node.slice)
                return canonical(key) if key else None
            # vars(m)["f"] and m.__dict__["f"] are m.f.
            if self.is_namespace(node.value) and (key := const_str(node.slice)):
                owner = self.namespace_module(node.value)
                if owner:
                    return f"{owner}.{key}"
            # [os][0], (os,)[0] and {"m": os}["m"] are the os module.
            element = _literal_element(node.value, node.slice)
            return self.qualname(element) if element is not None else None
        if isinstance(node, ast.Call):
            func = self.qualname(node.func)
            arg = const_str(argument(node, 0, "name"))
            if func in _IMPORTERS and arg:
                return canonical(arg)
            if func == "sys.modules.get" and arg:
                return canonical(arg)
            if func == "builtins.getattr" or (
                isinstance(node.func, ast.Name) and node.func.id == "getattr"
            ):
                base = self.qualname(node.args[0]) if node.args else None
                attr = const_str(node.args[1]) if len(node.args) > 1 else None
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
                            self.aliases[alias.asname] = canonical(alias.name)
                        else:
                            top = alias.name.split(".", 1)[0]
                            self.aliases[top] = canonical(top)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    module = canonical(node.module)
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

    def is_namespace(self, value: ast.AST) -> bool:
        """Whether ``value`` is a namespace of names: ``globals()``, ``vars(m)``, ``m.__dict__``,
        ``sys.modules``."""
        return (
            (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
             and value.func.id in NAMESPACE_CALLS)
            or (isinstance(value, ast.Attribute) and value.attr == "__dict__")
            or self.qualname(value) == "sys.modules"
        )  # fmt: skip

    def namespace_module(self, value: ast.AST) -> str | None:
        """The module whose namespace ``vars(m)`` / ``m.__dict__`` is, if known."""
        if isinstance(value, ast.Attribute) and value.attr == "__dict__":
            return self.qualname(value.value)
        if isinstance(value, ast.Call) and value.args and isinstance(value.func, ast.Name):
            return self.qualname(value.args[0]) if value.func.id == "vars" else None
        return None

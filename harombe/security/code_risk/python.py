"""Dangerous constructs in Python source, found through its syntax tree.

Names are resolved through imports and simple assignments (``import os as o``, ``from os import
system as s``, ``f = os.system``, ``__import__("os")``, ``sys.modules["os"]``,
``getattr(os, "system")``), so aliases do not hide a call; a *reference* counts, not only a call,
so ``e = eval`` is found where it is written. Attribute access on ordinary objects
(``model.eval()``, ``re.compile``, ``cursor.execute``) is not a finding.
"""

from __future__ import annotations

import ast

from harombe.security.code_risk import Finding

#: Builtins that turn data into running code.
DYNAMIC_BUILTINS = {
    "eval": "eval() runs a string as code",
    "exec": "exec() runs a string as code",
    "compile": "compile() turns a string into code",
    "__import__": "__import__() imports a module chosen at run time",
    "breakpoint": "breakpoint() opens an interactive debugger",
}
#: Builtins that only look names up; resolved (through aliases too) so their uses are judged.
REFLECTION_BUILTINS = {"getattr", "setattr"}
#: Modules whose import alone means running programs or poking memory.
DANGEROUS_MODULES = {
    "subprocess": "subprocess runs other programs",
    "_posixsubprocess": "_posixsubprocess runs other programs",
    "ctypes": "ctypes calls C functions and writes raw memory",
    "_ctypes": "ctypes calls C functions and writes raw memory",
    "cffi": "cffi calls C functions and writes raw memory",
    "pty": "pty spawns programs on a terminal",
    "pexpect": "pexpect runs other programs",
    "sh": "sh runs other programs",
    "plumbum": "plumbum runs other programs",
}
#: Functions (dotted, after alias resolution) that run programs or code.
DANGEROUS_CALLABLES = {
    "os.system": "os.system() runs a shell command",
    "os.popen": "os.popen() runs a shell command",
    "asyncio.create_subprocess_exec": "asyncio subprocess runs another program",
    "asyncio.create_subprocess_shell": "asyncio subprocess runs a shell command",
    "pickle.loads": "pickle.loads() can call any function while loading",
    "pickle.load": "pickle.load() can call any function while loading",
    "marshal.loads": "marshal.loads() loads raw code objects",
    "marshal.load": "marshal.load() loads raw code objects",
    "types.CodeType": "types.CodeType builds code objects by hand",
    "types.FunctionType": "types.FunctionType builds functions from code objects",
    "sys._getframe": "sys._getframe() reaches other frames' globals",
    "runpy.run_path": "runpy runs a file as code",
    "runpy.run_module": "runpy runs a module as code",
    "code.interact": "code.interact() opens an interpreter",
    "code.InteractiveInterpreter": "code.InteractiveInterpreter runs strings as code",
    "code.InteractiveConsole": "code.InteractiveConsole runs strings as code",
    "distutils.spawn.spawn": "distutils.spawn runs another program",
    **{f"builtins.{name}": why for name, why in DYNAMIC_BUILTINS.items()},
}
DANGEROUS_PREFIXES = {
    "os.exec": "os.exec*() replaces the process with another program",
    "os.spawn": "os.spawn*() runs another program",
    "os.posix_spawn": "os.posix_spawn() runs another program",
}
#: ``posix`` is what ``os`` re-exports on Linux.
MODULE_ALIASES = {"posix": "os"}
#: Attributes used to climb out of a namespace to builtins or to raw code.
ESCAPE_ATTRIBUTES = {
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__mro__",
    "__bases__", "__base__", "__getattribute__", "__reduce__", "__reduce_ex__",
    "f_globals", "f_builtins", "f_locals", "f_back", "gi_frame", "gi_code", "cr_frame",
    "ag_frame", "tb_frame", "func_globals",
}  # fmt: skip
#: Callables whose result, subscripted, is a namespace of names.
NAMESPACE_CALLS = {"globals", "vars", "locals", "dir"}
#: Device and kernel files a write to which is never data processing.
_SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/shm/")
_KERNEL_PATHS = ("/dev/", "/proc/", "/sys/")


def _describe(qualname: str) -> str | None:
    module = qualname.split(".", 1)[0]
    if module in DANGEROUS_MODULES:
        return DANGEROUS_MODULES[module]
    if qualname in DANGEROUS_CALLABLES:
        return DANGEROUS_CALLABLES[qualname]
    for prefix, why in DANGEROUS_PREFIXES.items():
        if qualname.startswith(prefix):
            return why
    return None


def _const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


_BINDING_NODES = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.NamedExpr)


class _Analyzer:
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.findings: list[Finding] = []

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
            if node.id in DYNAMIC_BUILTINS or node.id in REFLECTION_BUILTINS:
                return f"builtins.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript):
            # sys.modules["os"] is the os module.
            if self.qualname(node.value) == "sys.modules":
                key = _const_str(node.slice)
                return _canonical(key) if key else None
            return None
        if isinstance(node, ast.Call):
            func = self.qualname(node.func)
            arg = _const_str(node.args[0]) if node.args else None
            if func in ("builtins.__import__", "importlib.import_module") and arg:
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
            why = _describe(_canonical(alias.name))
            if why:
                self.report(node, "import", f"imports {alias.name}: {why}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _canonical(node.module or "")
        for alias in node.names:
            why = _describe(module) or _describe(f"{module}.{alias.name}")
            if why:
                self.report(node, "import", f"imports {alias.name} from {node.module}: {why}")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id == "__builtins__":
                self.report(node, "escape", "__builtins__ reaches every builtin, eval included")
            else:
                qualname = self.qualname(node)
                why = _describe(qualname) if qualname else None
                if why:
                    self.report(node, "call", why)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ESCAPE_ATTRIBUTES:
            self.report(node, "escape", f"{node.attr} climbs out to builtins or raw code")
        qualname = self.qualname(node)
        why = _describe(qualname) if qualname else None
        # The base is reported on its own (an imported dangerous module); report the member
        # only when the danger starts here, so one use is one finding.
        if why and (base := self.qualname(node.value)) and _describe(base) is None:
            self.report(node, "call", why)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        value = node.value
        is_namespace = (
            (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
             and value.func.id in NAMESPACE_CALLS)
            or (isinstance(value, ast.Attribute) and value.attr == "__dict__")
            or self.qualname(value) == "sys.modules"
        )  # fmt: skip
        if is_namespace:
            key = _const_str(node.slice)
            module = self._namespace_module(value)
            if key is None:
                self.report(node, "computed-name", "looks up a name computed at run time")
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

    def visit_Call(self, node: ast.Call) -> None:
        func = self.qualname(node.func)
        # Through any alias: ``f = getattr; f(os, "system")`` is getattr too.
        is_getattr = func in ("builtins.getattr", "builtins.setattr")
        if is_getattr and len(node.args) >= 2:
            attr = _const_str(node.args[1])
            base = node.args[0]
            on_module = self.qualname(base) is not None
            if attr is None and on_module:
                self.report(node, "computed-name", "getattr() on a module with a computed name")
            elif attr is not None and attr in ESCAPE_ATTRIBUTES:
                self.report(node, "escape", f"getattr() fetches {attr}")
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
                elif leaf in ESCAPE_ATTRIBUTES or _is_dangerous_leaf(leaf):
                    self.report(node, "escape", f"{func}({name!r}) reaches {name} by name")
        if func == "importlib.import_module" and node.args:
            name = _const_str(node.args[0])
            if name is None:
                self.report(node, "computed-name", "imports a module whose name is computed")
            elif why := _describe(_canonical(name)):
                self.report(node, "import", f"imports {name}: {why}")
        if isinstance(node.func, ast.Name) and node.func.id == "open" and node.args:
            self._check_open(node)
        if func == "shutil.rmtree" and node.args:
            path = _const_str(node.args[0])
            if path is not None and _is_system_path(path):
                self.report(node, "delete", f"shutil.rmtree() deletes {path!r}")

    def _check_open(self, node: ast.Call) -> None:
        path = _const_str(node.args[0])
        mode_node = (
            node.args[1]
            if len(node.args) > 1
            else next((kw.value for kw in node.keywords if kw.arg == "mode"), None)
        )
        mode = _const_str(mode_node) or "r"
        writing = any(flag in mode for flag in "wax+")
        if (
            path
            and writing
            and path.startswith(_KERNEL_PATHS)
            and not path.startswith(_SAFE_DEVICES)
        ):
            self.report(node, "device-write", f"writes to the kernel or device file {path}")


def _is_dangerous_leaf(name: str | None) -> bool:
    """Whether ``name`` is the last part of a dangerous callable (``system``, ``popen``…)."""
    if not name:
        return False
    leaves = {q.rsplit(".", 1)[1] for q in DANGEROUS_CALLABLES}
    return name in leaves or any(name.startswith(p.rsplit(".", 1)[1]) for p in DANGEROUS_PREFIXES)


def _canonical(module: str) -> str:
    top, dot, rest = module.partition(".")
    return MODULE_ALIASES.get(top, top) + dot + rest


def _is_system_path(path: str) -> bool:
    stripped = path.rstrip("/") or "/"
    if stripped in ("/", "~", "."):
        return True
    return stripped.startswith("/") and not stripped.startswith(("/workspace/", "/tmp/"))


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for Python ``code``; code that does not parse is one ``unparseable`` finding."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        message = getattr(exc, "msg", None) or str(exc)
        return [Finding("unparseable", f"Python that does not parse ({message})", line)]
    analyzer = _Analyzer()
    nodes = list(ast.walk(tree))
    analyzer.collect_aliases(nodes)
    visitors = {
        ast.Import: analyzer.visit_Import,
        ast.ImportFrom: analyzer.visit_ImportFrom,
        ast.Name: analyzer.visit_Name,
        ast.Attribute: analyzer.visit_Attribute,
        ast.Subscript: analyzer.visit_Subscript,
        ast.Call: analyzer.visit_Call,
    }
    for node in nodes:
        visit = visitors.get(type(node))
        if visit is not None:
            visit(node)  # type: ignore[operator]
    return _dedupe(analyzer.findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

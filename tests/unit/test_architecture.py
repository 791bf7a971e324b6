"""The layers of harombe, checked on the source: who may import whom, no cycles, one Docker
seam, pure policy, and modules and functions of a readable size.

    tools ──> approval ──> policy ──> config, errors
      └─────> runtime ───────┘
                 └──> guest (source text only; guest imports nothing of harombe)
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harombe"
#: The usage guide's modules: thin faces over the rooms, for users; harombe never imports them.
FACES = {
    "harombe.security.docker_manager",
    "harombe.security.sandbox_manager",
    "harombe.security.hitl",
    "harombe.security.sandbox_risk",
}
#: Standard-library modules that do I/O, read a clock or spawn work: never in policy.
IMPURE = {
    "asyncio", "concurrent", "datetime", "glob", "io", "os", "pathlib", "random", "secrets",
    "shutil", "signal", "socket", "ssl", "subprocess", "tempfile", "threading", "time", "urllib",
    "uuid", "importlib", "builtins", "ctypes", "mmap", "select", "multiprocessing", "http",
    "docker", "requests", "structlog",
}  # fmt: skip
#: Built-ins that open files or import by name: never called in policy.
IMPURE_CALLS = {"open", "__import__", "exec", "eval", "compile", "input", "breakpoint"}
#: The Docker programs; no harombe module may start them.
DOCKER_PROGRAMS = ("docker", "dockerd", "docker-init", "containerd")
#: Bounds that flag a module or function to look at, never a reason to pack lines by hand:
#: ``ruff format`` lays out every line, and what passes these is cut by concept.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: Functions that are one data table (a dict literal), not logic: exempt from the length cap.
TABLES = {("harombe.security.runtime.sandbox", "container_spec")}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (or module.name for `from m import name`)
    line: int
    type_only: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _dynamic_import(node: ast.AST) -> str | None:
    """The module a literal ``importlib.import_module("m")`` / ``__import__("m")`` names."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = ast.unparse(node.func)
    first = node.args[0]
    if func.endswith("import_module") or func == "__import__":
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
        return "?"
    return None


def imports_of(name: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if (dynamic := _dynamic_import(node)) is not None:
            # A computed name ("?") is an import of anything: no room allows it unchecked.
            yield Import(name, dynamic, node.lineno, False)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno, node.lineno in type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(name, f"{base}.{alias.name}", node.lineno, node.lineno in type_only)


def resolve(target: str, known: dict[str, Path]) -> str:
    """The harombe module ``target`` names (``pkg.mod.name`` → ``pkg.mod``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


ALL = modules()
IMPORTS = [imp for name, path in ALL.items() for imp in imports_of(name, path)]
INTERNAL = [(imp, resolve(imp.target, ALL)) for imp in IMPORTS if imp.target.startswith("harombe")]


def room(module: str) -> str:
    """The layer a module belongs to."""
    for prefix in ("policy", "approval", "runtime", "guest"):
        if module.startswith(f"harombe.security.{prefix}"):
            return prefix
    if module in FACES:
        return "face"
    if module.startswith("harombe.tools"):
        return "tools"
    if module.startswith("harombe.service"):
        return "service"
    if module in BASE:
        return "base"
    if module in TOP or module.startswith(("harombe.testing", "harombe.images", "harombe.cli")):
        return "top"
    return "unknown"  # a new module outside every room: test_the_layer_table_... fails


#: The base room: configuration, errors, logging, and the reading of profile files.
BASE = {"harombe.config", "harombe.config_environments", "harombe.config_hitl",
        "harombe.config_registries", "harombe.config_service", "harombe.errors",
        "harombe.host_paths", "harombe.logs", "harombe.profile_files"}  # fmt: skip
#: The modules above every room: the package, the CLI (``harombe.__main__`` and every
#: ``harombe.cli`` module), the security package's docstring.
TOP = {"harombe", "harombe.__main__", "harombe.security", "harombe.mounts", "harombe.mounts_host",
       "harombe.mounts_compat", "harombe.mounts_gate",
       "harombe.mounts_scan",
       "harombe.decorator", "harombe.decorator_call", "harombe.decorator_runner",
       "harombe.decorator_wire", "harombe.decorator_encode",
       "harombe.decorator_decode"}  # fmt: skip
#: What runtime may take from guest: the joined source text, and the wire codec it shares.
RUNTIME_GUEST = {"harombe.security.guest", "harombe.security.guest.wire"}


#: room → rooms it may import from (besides itself).
ALLOWED = {
    "base": {"base"},
    "guest": set(),
    "policy": {"base"},
    "approval": {"base", "policy"},
    "runtime": {"base", "policy", "guest"},
    "tools": {"base", "policy", "approval", "runtime"},
    "service": {"base", "policy", "approval", "runtime", "tools"},
    "face": {"base", "policy", "approval", "runtime"},
    "top": {"base", "policy", "approval", "runtime", "tools", "service", "face", "top", "guest"},
}
LAYER_CASES = [(imp, target) for imp, target in INTERNAL if room(imp.module) != room(target)]


def test_the_layer_table_covers_every_module() -> None:
    """Every module lands in a known room, and the rooms the docs name exist."""
    assert [name for name in ALL if room(name) == "unknown"] == []
    rooms = {room(name) for name in ALL}
    named = {"policy", "approval", "runtime", "guest", "tools", "service", "face", "base", "top"}
    assert named == rooms


@pytest.mark.parametrize(
    ("imp", "target"), LAYER_CASES, ids=[f"{i.module}->{t}" for i, t in LAYER_CASES]
)
def test_imports_go_down_the_layers(imp: Import, target: str) -> None:
    """A module imports only from rooms below it (tools → approval/runtime → policy → base)."""
    assert room(target) in ALLOWED[room(imp.module)], (
        f"{imp.module}:{imp.line} imports {target}: {room(imp.module)} may not import "
        f"{room(target)}"
    )
    if room(target) == "guest" and room(imp.module) == "runtime":
        assert target in RUNTIME_GUEST, f"{imp.module} imports guest code {target}"


def test_guest_code_imports_only_the_standard_library() -> None:
    """Code that runs inside the sandbox imports nothing of harombe and no third-party package."""
    stdlib = set(sys.stdlib_module_names)
    bad = [
        f"{imp.module}:{imp.line} {imp.target}"
        for imp in IMPORTS
        if room(imp.module) == "guest"
        and imp.module != "harombe.security.guest"  # the host-side joiner of the sources
        and imp.target.split(".")[0] not in stdlib | {"__future__"}
    ]
    assert not bad


def impurities(name: str, path: Path) -> list[str]:
    """What in policy module ``name`` (at ``path``) reaches I/O, a clock or randomness."""
    bad = [
        f"{imp.module}:{imp.line} {imp.target}"
        for imp in imports_of(name, path)
        if imp.target.split(".")[0] in IMPURE | {"?"}
    ]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Name) and func.id in IMPURE_CALLS:
            bad.append(f"{name}:{node.lineno} {func.id}()")
    return bad


def test_policy_is_pure() -> None:
    """Policy modules import nothing that does I/O, reads a clock, draws randomness or talks
    to Docker, import nothing by a computed name, and call no built-in that opens or imports."""
    assert [bad for name, path in ALL.items() if room(name) == "policy"
            for bad in impurities(name, path)] == []  # fmt: skip


def test_only_the_docker_module_imports_docker() -> None:
    """One seam: the Docker SDK is imported by ``runtime/docker.py`` alone."""
    users = {imp.module for imp in IMPORTS if imp.target.split(".")[0] in ("docker", "requests")}
    assert users <= {"harombe.security.runtime.docker"}, users


def _names_docker(node: ast.AST) -> bool:
    """A string that is, or is the path of, or starts a command line of, a Docker program."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    words = node.value.strip().split()
    return bool(words) and words[0].rpartition("/")[2] in DOCKER_PROGRAMS


def docker_cli_lines(source: str) -> list[int]:
    """The lines of ``source`` that start or look up a Docker program: an argv, a command
    string, or a call (``shutil.which``, ``create_subprocess_exec``…) whose first argument
    names one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        firsts: list[ast.AST] = []
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            firsts.append(node.elts[0])
        if isinstance(node, ast.Call) and node.args:
            firsts.append(node.args[0])
        if any(_names_docker(first) for first in firsts):
            found.append(node.lineno)  # type: ignore[attr-defined]
    return found


def test_nothing_runs_the_docker_cli() -> None:
    """No harombe module starts or looks up a Docker program (image builds go through the
    backend)."""
    found = {
        name: lines
        for name, path in ALL.items()
        if (lines := docker_cli_lines(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_nothing_inside_imports_the_public_faces() -> None:
    """The faces are for users: harombe's own rooms import the real modules."""
    bad = [
        f"{imp.module}:{imp.line} {target}"
        for imp, target in INTERNAL
        if target in FACES and room(imp.module) not in ("top", "face")
    ]
    assert not bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    """No two harombe modules import each other, directly or around a loop (package
    ``__init__`` re-exports aside, type-only imports included)."""
    graph: dict[str, set[str]] = {}
    for imp, target in INTERNAL:
        if target and target != imp.module and ALL[target].name != "__init__.py":
            graph.setdefault(imp.module, set()).add(target)
    assert _cycles(graph) == []


def _long_functions() -> Iterator[tuple[str, str, int]]:
    for name, path in ALL.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES and (name, node.name) not in TABLES:
                    yield name, node.name, length


def test_modules_are_a_readable_size() -> None:
    """No module is over ~600 lines (formatted)."""
    big = {
        name: n
        for name, path in ALL.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}


def test_functions_are_a_readable_size() -> None:
    """No function is over ~80 lines (formatted), data tables aside."""
    assert list(_long_functions()) == []


#: Exceptions that are signals inside one module and never reach a caller (errors.py says
#: where each is caught); every other exception class harombe defines is a HarombeError.
INTERNAL_EXCEPTIONS = {
    "harombe.security.guest.wire.ProtocolError",
    "harombe.security.guest.supervisor_paths.Refused",
    "harombe.security.guest.supervisor_workers.Violation",
    "harombe.security.policy.code_risk.javascript_tokens.JSSyntaxError",
    "harombe.security.policy.code_risk.shell_syntax.ShellSyntaxError",
    "harombe.security.runtime.egress.Refused",
    "harombe.security.runtime.egress_http.BadRequest",
    "harombe.security.runtime.egress_http._Stalled",
    "harombe.testing.workspace.Refused",
}


def _is_builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


def test_every_exception_is_in_the_error_tree_or_known_internal() -> None:
    """A new exception class is a HarombeError (in errors.py's tree) or is listed above."""
    outside = []
    internal_names = {qualified.rpartition(".")[2] for qualified in INTERNAL_EXCEPTIONS}
    for name, path in ALL.items():
        if name == "harombe.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
            foreign = {b for b in bases if _is_builtin_exception(b)} | (bases & internal_names)
            if foreign and f"{name}.{node.name}" not in INTERNAL_EXCEPTIONS:
                outside.append(f"{name}.{node.name}")
    assert outside == []

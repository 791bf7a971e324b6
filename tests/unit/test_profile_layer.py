"""The profile's runtime layer (guest/profile_layer.py) run on the host, in child interpreters:
its audit hook cannot be removed, so it never touches the test process. Each case is code run
as a session cell (compiled as ``<cell 1>`` in the user's namespace) after the layer applied;
the cases run on this Python and on Python 3.8, the oldest the sandbox supports. The real
sandbox is covered by tests/integration/test_profiles_live.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harombe.security.guest import HERE, PROFILE_ENV, PY_WORKER_PARTS, load
from tests.unit.test_wire import python38

#: Loads the layer as the worker does, applies the spec from argv[3] and runs every cell of
#: argv[4], printing one JSON outcome per cell. Compiled as ``<harombe-worker>``, as the worker
#: is: the layer tells the worker's frames from the user's by that name.
BOOT = "import sys; exec(compile(sys.argv[1], '<harombe-worker>', 'exec'))"
RUNNER = r"""
import json, sys
parts, spec, cells = json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
scope = {"__name__": "harombe_worker"}
source = "\n\n".join(open(p, encoding="utf-8").read() for p in parts)
exec(compile(source, "<harombe-worker>", "exec"), scope)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    check = scope["apply_profile"](spec, namespace)
except Exception as exc:
    print(json.dumps({"layer": "%s: %s" % (type(exc).__name__, exc)}))
    sys.exit(0)
import io
changed = None
for cell in cells:
    if changed is not None:  # the worker would have been restarted: nothing runs here
        print(json.dumps("restarted: " + changed))
        continue
    out, real = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        exec(compile(cell, "<cell 1>", "exec"), namespace)
        outcome = "ok: " + out.getvalue().strip()
    except BaseException as exc:
        outcome = "%s: %s" % (type(exc).__name__, exc)
    finally:
        sys.stdout = real
    changed = check(namespace) if check is not None else None
    print(json.dumps(outcome if changed is None else outcome + " | " + changed))
"""
#: The worker's parts but its own (the loop, and the images a call displays).
WORKER_ONLY = ("pyworker_artifacts.py", "pyworker.py")
LAYER_PARTS = [str(HERE / name) for name in PY_WORKER_PARTS if name not in WORKER_ONLY]
SPEC: dict[str, Any] = {
    "allowed_imports": ["collections", "json", "math", "operator", "random", "textwrap", "xml"],
    "preimport": ["json"],
    "subprocess_memory_mb": 512,
    "blocklist": [["json", "loads"], ["xml.dom", "minidom"], ["textwrap", "dedent"]],
}
BLOCKED = "ImportError: import of '{}' blocked by sandbox"
DUNDER = "RuntimeError: dunder attribute access blocked by sandbox"
GETATTR = "RuntimeError: object.__getattr__ blocked by sandbox"
ORIGINAL_IMPORT = (
    "real = [c.cell_contents for c in __import__.__closure__ if callable(c.cell_contents)][0]\n"
)
#: The real builtins module, reached without a name the layer refuses.
BORROW = "import collections\nreal = print.__self__\nREAD_HOSTNAME = 'open(\"/etc/hostname\")'\n"
# fmt: off
CASES = [
    # imports: the profile's modules only, by top-level name
    pytest.param("import math\nprint(math.sqrt(16))", "ok: 4.0", id="allowed-import"),
    pytest.param("import os", BLOCKED.format("os"), id="import-os"),
    pytest.param("import os.path", BLOCKED.format("os.path"), id="import-os-path"),
    pytest.param("from os import path", BLOCKED.format("os"), id="from-os"),
    pytest.param("import builtins", BLOCKED.format("builtins"), id="import-builtins"),
    pytest.param("__import__('subprocess')", BLOCKED.format("subprocess"), id="dunder-import"),
    pytest.param("from . import x", BLOCKED.format("."), id="relative-import"),
    pytest.param("import json\nprint(json.dumps([1]))", "ok: [1]", id="library-own-deps"),
    # builtins removed from user code
    pytest.param("open('/etc/hostname')", "NameError: name 'open' is not defined", id="open"),
    pytest.param("input()", "NameError: name 'input' is not defined", id="input"),
    pytest.param("breakpoint()", "NameError: name 'breakpoint' is not defined", id="breakpoint"),
    pytest.param("__builtins__['open']", "KeyError: 'open'", id="builtins-dict"),
    # the real builtins, reached through a builtin's __self__, are refused to user code
    pytest.param("print.__self__.open('/etc/hostname')", "RuntimeError: open blocked by sandbox",
                 id="restored-open"),
    pytest.param("print.__self__.exec('1')", "RuntimeError: compile blocked by sandbox",
                 id="restored-exec"),
    pytest.param("exec('1')", "RuntimeError: compile blocked by sandbox", id="exec"),
    pytest.param("eval('1')", "RuntimeError: compile blocked by sandbox", id="eval"),
    pytest.param("compile('1', 'x', 'eval')", "RuntimeError: compile blocked by sandbox",
                 id="compile"),
    # the original __import__ from the hook's closure: loaded modules come back, but what
    # they could do is refused (Python 3.8 audits reading __closure__, and refuses it first)
    pytest.param(ORIGINAL_IMPORT + "real('os').system('true')",
                 ("RuntimeError: os.system blocked by sandbox", GETATTR), id="closure-os-system"),
    pytest.param(ORIGINAL_IMPORT + "real('os').listdir('/')",
                 ("RuntimeError: os.listdir blocked by sandbox", GETATTR),
                 id="closure-os-listdir"),
    pytest.param(ORIGINAL_IMPORT + "real('smtplib')",
                 ("RuntimeError: import blocked by sandbox", GETATTR), id="closure-new-module"),
    pytest.param("__import__.__defaults__",
                 "RuntimeError: object.__getattr__ blocked by sandbox", id="defaults"),
    pytest.param("__import__.__wrapped__",
                 "AttributeError: 'function' object has no attribute '__wrapped__'", id="wrapped"),
    # sys through a module's private alias
    pytest.param("import collections\ncollections._sys.modules['os'].system('true')",
                 "AttributeError: module 'sys' has no attribute 'modules'",
                 id="collections-sys-os"),
    pytest.param("import collections\ncollections._sys._getframe()",
                 "RuntimeError: sys._getframe blocked by sandbox", id="collections-sys-frame"),
    # introspection that leads to code, frames and globals
    pytest.param("(lambda: 0).__code__", "RuntimeError: object.__getattr__ blocked by sandbox",
                 id="code-object"),
    pytest.param("def g():\n    yield 1\ng().gi_frame",
                 "RuntimeError: object.__getattr__ blocked by sandbox", id="gi-frame"),
    pytest.param("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame",
                 "RuntimeError: object.__getattr__ blocked by sandbox", id="tb-frame"),
    # dunder-safe getters
    pytest.param("getattr(1, '__class__')", DUNDER, id="getattr-dunder"),
    pytest.param("hasattr(1, '__class__')", DUNDER, id="hasattr-dunder"),
    pytest.param("class A: pass\nsetattr(A, '__init__', None)", DUNDER, id="setattr-dunder"),
    pytest.param("print(getattr(2, 'real'), hasattr(2, 'nope'))", "ok: 2 False", id="getattr"),
    pytest.param("import operator\noperator.attrgetter('__class__')", DUNDER, id="attrgetter"),
    pytest.param("import operator\noperator.attrgetter('real', 'a.__dict__')", DUNDER,
                 id="attrgetter-dotted"),
    pytest.param("from operator import methodcaller as m\nm('__reduce__')", DUNDER,
                 id="methodcaller-alias"),
    pytest.param("import operator\noperator.attrgetter('f_globals')", DUNDER, id="frame-name"),
    pytest.param("import operator\nprint(operator.attrgetter('real')(3))", "ok: 3",
                 id="attrgetter-real"),
    pytest.param("class A: pass\nA.x = 1\nprint(A.x, id(A) > 0)", "ok: 1 True",
                 id="ordinary-class"),
    # random._os, the blocklist
    pytest.param("import random\nrandom._os", "AttributeError: module 'random' has no "
                 "attribute '_os'", id="random-os"),
    pytest.param("import random\nrandom.seed(1)\nprint(0 <= random.random() < 1)", "ok: True",
                 id="random-works"),
    pytest.param("from json import loads", BLOCKED.format("json.loads"), id="blocklist-from"),
    pytest.param("import json\njson.loads('1')", "RuntimeError: json.loads is blocked by "
                 "sandbox", id="blocklist-attr"),
    pytest.param("import xml.dom.minidom", BLOCKED.format("xml.dom.minidom"),
                 id="blocklist-dotted-module"),
    pytest.param("from xml.dom import minidom", BLOCKED.format("xml.dom.minidom"),
                 id="blocklist-dotted-from"),
    pytest.param("import textwrap\ntextwrap.dedent(' x')", "RuntimeError: textwrap.dedent is "
                 "blocked by sandbox", id="blocklist-loaded-later"),
    # borrowed library frames: what is touched is judged, not who called
    pytest.param(BORROW + "f = list(collections.Counter(map(real.open, ['/etc/hostname'])))",
                 "PermissionError: open of '/etc/hostname' blocked by sandbox",
                 id="open-through-library-frame"),
    pytest.param(BORROW + "c = list(collections.Counter(map(real.compile, [READ_HOSTNAME], "
                 "['/usr/lib/x.py'], ['exec'])))[0]\n"
                 "list(collections.Counter(map(real.exec, [c], [{}])))",
                 "PermissionError: open of '/etc/hostname' blocked by sandbox",
                 id="code-compiled-under-a-library-name"),
    pytest.param(BORROW + "list(collections.Counter(map(real.exec, ['import gc\\n"
                 "gc.get_objects()'], [{}])))",
                 "RuntimeError: gc.get_objects blocked by sandbox", id="gc-walk-for-everyone"),
    pytest.param(BORROW + "list(collections.Counter(map(real.exec, ['import gc\\n"
                 "gc.get_referents(1)'], [{}])))",
                 "RuntimeError: gc.get_referents blocked by sandbox", id="gc-referents"),
    pytest.param(BORROW + "list(collections.Counter(map(real.exec, ['import os\\n"
                 "os.listdir(\"/\")'], [{}])))",
                 "PermissionError: os.listdir of '/' blocked by sandbox", id="listdir-root"),
    pytest.param("import collections\nP = collections.namedtuple('P', 'x y')\nprint(P(1, 2))",
                 "ok: P(x=1, y=2)", id="namedtuple-works"),
    pytest.param("import collections\n"
                 "print([n for n in sorted(vars(collections._sys)) if n[:2] != '__'])",
                 "ok: ['_getframe', 'getsizeof', 'intern', 'maxsize']",
                 id="collections-sys-narrowed"),
    # memory: RLIMIT_AS
    pytest.param("x = bytearray(1024 * 1024 * 1024)", "MemoryError: ", id="rlimit-as"),
]
# fmt: on


def run_cells(
    python: str, spec: dict[str, Any], cells: list[str], cwd: Path | None = None
) -> list[Any]:
    """The outcomes of ``cells`` under ``spec`` in a new ``python -I -S`` (run in ``cwd``)."""
    done = subprocess.run(
        [python, "-I", "-S", "-c", BOOT, RUNNER, json.dumps(LAYER_PARTS), json.dumps(spec),
         json.dumps(cells)],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module", params=[sys.executable, "python3.8"], ids=["host", "py38"])
def outcomes(request: pytest.FixtureRequest) -> dict[str, str]:
    python = python38() if request.param == "python3.8" else request.param
    cells = [case.values[0] for case in CASES]
    return dict(zip(cells, run_cells(python, SPEC, cells), strict=True))


@pytest.mark.parametrize(("code", "expected"), CASES)
def test_the_layer_holds(outcomes: dict[str, str], code: str, expected: str | tuple[str]) -> None:
    """Each escape is refused with the layer's message, and ordinary code runs."""
    assert outcomes[code] in (expected if isinstance(expected, tuple) else (expected,))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({**SPEC, "preimport": ["no_such_module_here"]},
                     "RuntimeError: preimport of 'no_such_module_here' failed: "
                     "ModuleNotFoundError: No module named 'no_such_module_here'",
                     id="failing-preimport"),
        pytest.param({"preimport": []}, "RuntimeError: the profile's runtime spec is malformed: "
                     "KeyError('allowed_imports')", id="malformed-spec"),
    ],
)  # fmt: skip
def test_a_layer_that_cannot_be_applied_says_why(spec: dict[str, Any], expected: str) -> None:
    """A failing preimport names the module; a malformed spec says so."""
    assert run_cells(sys.executable, spec, []) == [{"layer": expected}]


def test_observe_mode_keeps_limits_and_preimports_only() -> None:
    """With the runtime audit mode 'observe', imports are not restricted, memory still is."""
    spec = {**SPEC, "enforce": False, "preimport": ["textwrap"]}
    cells = ["import os\nprint(os.sep)", "x = bytearray(1024 * 1024 * 1024)"]
    assert run_cells(sys.executable, spec, cells) == ["ok: /", "MemoryError: "]


def test_the_worker_reads_the_spec_from_the_environment_variable_the_host_sets() -> None:
    """The layer, the worker and the host agree on the variable's name."""
    layer = load(("wire.py", "profile_hook.py", "profile_layer.py"), "harombe-worker")
    worker = (HERE / "pyworker.py").read_text(encoding="utf-8")
    assert layer.PROFILE_ENV == PROFILE_ENV == "HAROMBE_PROFILE"
    assert "os.environ.pop(PROFILE_ENV, None)" in worker
    assert [Path(p).name for p in LAYER_PARTS] == ["wire.py", "profile_hook.py", "profile_layer.py"]


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        pytest.param(["__builtins__['open'] = print.__self__.open", "open"],
                     ["ok:  | the profile's runtime layer was changed (builtins)",
                      "restarted: the profile's runtime layer was changed (builtins)"],
                     id="builtins-restored"),
        pytest.param(["import collections\ncollections._sys = print.__self__", "1"],
                     ["ok:  | the profile's runtime layer was changed (module alias)",
                      "restarted: the profile's runtime layer was changed (module alias)"],
                     id="alias-restored"),
        pytest.param(["import operator\nimport collections\n"
                      "operator.attrgetter = collections.Counter", "1"],
                     ["ok:  | the profile's runtime layer was changed (operator)",
                      "restarted: the profile's runtime layer was changed (operator)"],
                     id="operator-restored"),
        pytest.param(["import json\njson.loads = json.JSONDecoder().decode", "1"],
                     ["ok:  | the profile's runtime layer was changed (blocklist stub)",
                      "restarted: the profile's runtime layer was changed (blocklist stub)"],
                     id="stub-restored"),
        pytest.param(["x = 1", "print(x)"], ["ok: ", "ok: 1"], id="ordinary-session"),
    ],
)  # fmt: skip
def test_a_call_that_changes_the_layer_ends_the_session(
    cells: list[str], expected: list[str]
) -> None:
    """The check after each call reports a changed layer, so the next call never runs on it."""
    assert run_cells(sys.executable, SPEC, cells) == expected


def test_a_workspace_module_never_shadows_an_allowed_one(tmp_path: Path) -> None:
    """A file in the working directory named like an allowed module is not imported."""
    (tmp_path / "textwrap.py").write_text("print('SHADOW')\n", encoding="utf-8")
    cells = ["import textwrap\nprint(textwrap.fill('a b', 10))"]
    assert run_cells(sys.executable, SPEC, cells, cwd=tmp_path) == ["ok: a b"]


#: Starts as the worker does (the working directory first, the user site before the system
#: sites), applies the layer from argv[3] and prints sys.path as the layer left it.
PATH_RUNNER = r"""
import json, sys
sys.path[:] = ["", "/home/sandbox/.local/lib/site"] + sys.path + ["/usr/lib/python3/x"]
source = "\n\n".join(open(p, encoding="utf-8").read() for p in json.loads(sys.argv[2]))
scope = {"__name__": "harombe_worker"}
exec(compile(source, "<harombe-worker>", "exec"), scope)
scope["apply_profile"](sys.argv[3], {"__builtins__": __builtins__})
print(json.dumps([sys.path, sys.dont_write_bytecode]))
"""


@pytest.mark.parametrize("enforce", [True, False], ids=["enforce", "observe"])
def test_preimports_come_from_the_trusted_path_only(tmp_path: Path, enforce: bool) -> None:
    """A workspace file named like a preimport never runs (in either mode); the enforced
    layer's sys.path has no working directory and puts the user site after the system's."""
    (tmp_path / "textwrap.py").write_text("raise SystemExit('SHADOW RAN')\n", encoding="utf-8")
    spec = {**SPEC, "preimport": ["json", "textwrap"], "enforce": enforce,
            "preimport_needed": ["harombe_no_such_module"]}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT, PATH_RUNNER, json.dumps(LAYER_PARTS),
         json.dumps(spec)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={"HOME": "/home/sandbox"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    path, no_bytecode = json.loads(done.stdout)
    if enforce:
        assert "" not in path and path[-1] == "/home/sandbox/.local/lib/site"
        assert path.index("/usr/lib/python3/x") < path.index(path[-1]) and no_bytecode
    else:
        assert path[:2] == ["", "/home/sandbox/.local/lib/site"] and not no_bytecode


HOOK = load(("wire.py", "profile_hook.py"), "harombe-worker")


@pytest.fixture
def judge(tmp_path: Path) -> Any:
    """``allowed(path, write)`` over a writable root and a read-only one under ``tmp_path``."""
    for name in ("work", "lib", "secret"):
        (tmp_path / name).mkdir()
    (tmp_path / "work" / "out").symlink_to(tmp_path / "secret")
    (tmp_path / "work" / "lib").symlink_to(tmp_path / "lib")
    return HOOK._path_judge([str(tmp_path / "lib")], [str(tmp_path / "work")]), tmp_path


class Text(str):
    """A path that could say one thing to the hook and another to the kernel."""


@pytest.mark.parametrize(
    ("path", "write", "expected"),
    [
        pytest.param("work/new.csv", True, True, id="new-file-in-writable-root"),
        pytest.param("lib/x.py", False, True, id="read-only-root-read"),
        pytest.param("lib/x.py", True, False, id="read-only-root-write"),
        pytest.param("secret/key", False, False, id="outside"),
        pytest.param("work/out/key", False, False, id="symlink-out-of-root"),
        pytest.param("work/lib/x.py", False, True, id="symlink-to-read-root"),
        pytest.param("work/../secret/key", False, False, id="dotdot"),
        pytest.param(b"work/a", True, True, id="bytes"),
        pytest.param(3, False, False, id="request-pipe"),
        pytest.param(4, True, False, id="reply-pipe"),
        pytest.param(7, True, True, id="descriptor-opened-before"),
        pytest.param(Text("work/a"), False, False, id="str-subclass"),
    ],
)  # fmt: skip
def test_the_hook_judges_paths_by_where_they_lead(
    judge: Any, path: Any, write: bool, expected: bool
) -> None:
    """Paths resolve as the kernel resolves them; only the roots are reachable."""
    allowed, root = judge
    if isinstance(path, str) and type(path) is str:
        path = f"{root}/{path}"
    elif isinstance(path, bytes):
        path = str(root).encode() + b"/" + path
    elif isinstance(path, Text):
        path = Text(f"{root}/{path}")
    assert allowed(path, write) is expected


def test_a_relative_path_may_not_climb(judge: Any) -> None:
    """A relative path with '..' is refused (it could be meant for a dir_fd elsewhere)."""
    allowed, _ = judge
    assert allowed("../etc/passwd", False) is False


@pytest.mark.parametrize(
    ("event", "args", "expected"),
    [
        pytest.param("os.mkdir", ("new", 0o777, 9), False, id="mkdir-dir-fd"),
        pytest.param("os.mkdir", ("new", 0o777, -1), True, id="mkdir-cwd"),
        pytest.param("os.rename", ("a", "b", -1, 9), False, id="rename-dst-dir-fd"),
        pytest.param("os.remove", ("WORK/a", 9), True, id="absolute-with-dir-fd"),
        pytest.param("open", ("a.csv", None, os.O_RDONLY), False, id="os-open-relative"),
        pytest.param("open", ("WORK/a", None, os.O_RDONLY), True, id="os-open-absolute"),
        pytest.param("open", ("a.csv", "r", os.O_RDONLY), True, id="builtin-open-relative"),
        pytest.param("sqlite3.connect", ("data.db",), True, id="sqlite-relative"),
        pytest.param("sqlite3.connect", (":memory:",), True, id="sqlite-memory"),
        pytest.param("sqlite3.connect", ("file:data.db?mode=rwc",), True, id="sqlite-uri-local"),
        pytest.param("sqlite3.connect", ("file:WORK/d.db",), True, id="sqlite-uri-absolute-ok"),
        pytest.param("sqlite3.connect", ("file:/etc/passwd?mode=ro",), False, id="uri-outside"),
        pytest.param("sqlite3.connect", ("file://localhost/etc/passwd",), False,
                     id="uri-localhost"),
        pytest.param("sqlite3.connect", ("file://host/x",), False, id="uri-remote-authority"),
        pytest.param("sqlite3.connect", ("file:%2Fetc%2Fpasswd",), False, id="uri-escape"),
        pytest.param("sqlite3.connect", ("file:../x",), False, id="uri-climb"),
    ],
)  # fmt: skip
def test_the_hook_judges_dir_fd_os_open_and_sqlite_uris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: str, args: tuple[Any, ...],
    expected: bool,
) -> None:  # fmt: skip
    """A relative path given with a dir_fd, or to os.open, is refused (its directory is not
    known); builtins.open's relative names stay allowed; a file: URI is judged by its path."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    hook = HOOK.audit_hook({}, [], (), (str(work),))
    args = tuple(a.replace("WORK", str(work)) if isinstance(a, str) else a for a in args)
    if expected:
        assert hook(event, args) is None
    else:
        with pytest.raises(PermissionError):
            hook(event, args)

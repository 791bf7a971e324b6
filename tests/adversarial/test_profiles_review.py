"""Review probes of policy profiles, fast and without Docker: escapes the static scan of a
shipped profile lets through, the runtime layer run in child interpreters (as in
tests/unit/test_profile_layer.py), hostile profile files, and the scan's place in the tools.

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import harombe.tools.profiles as tool_profiles
from harombe.errors import ConfigError
from harombe.profile_files import read_profile_documents
from harombe.security.policy.guardrails import run_stages
from harombe.security.policy.profiles import Profile, resolve_profiles
from harombe.security.runtime.profiled import profile_env
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit.fake_manager import running
from tests.unit.test_profile_layer import run_cells

OBSERVE_BOTH = {"audit": {"mode": {"ast_scan": "observe", "blocklist_audit": "observe"}}}
PROFILES = resolve_profiles(
    {
        **read_profile_documents(None),
        "watch-both": {"extends": "minimal", **OBSERVE_BOTH},
        "observe-scan": {"extends": "minimal", "audit": {"mode": {"ast_scan": "observe"}}},
    }
)
MINIMAL, DATA_SCIENCE = PROFILES["minimal"], PROFILES["data-science"]
ROOT = Path(__file__).resolve().parents[2]

#: A generic getattr the scan does not see: a class pattern's positional sub-pattern reads the
#: attribute its class's ``__match_args__`` names, and ``__instancecheck__`` lets any subject in.
MATCH_GETATTR = """
import random
import collections

def rv(text):
    return "".join(reversed(text))

class Any_(type):
    def __instancecheck__(cls, obj):
        return True

class Get(metaclass=Any_):
    __match_args__ = (rv("__slabolg__"),)

match random.Random.choice:
    case Get(found):
        pass
real = found[rv("__snitliub__")]
"""
#: ... then the real open, called from a library frame (collections.Counter.update consumes
#: the map), which the layer's audit hook takes for library code.
MATCH_OPEN = (
    MATCH_GETATTR
    + """
handle = list(collections.Counter(map(real[rv("nepo")], ["/etc/hostname"])))[0]
print("READ", len(handle.read()) > 0)
"""
)
#: Code compiled and run through the same library frames runs as library code: it clears the
#: audit hook's ``busy`` cell (found through gc) and then starts a process.
PAYLOAD = """
import gc
gc.unfreeze()
for o in gc.get_objects():
    if type(o).__name__ == "function" and o.__name__ == "hook":
        if o.__code__.co_filename.startswith("<harombe"):
            for c in o.__closure__:
                if type(c.cell_contents) is list:
                    c.cell_contents[0] = True
import os
print("SPAWNED", os.popen("echo $((6*7))").read().strip())
"""
RUN_AS_LIBRARY = """
code = list(collections.Counter(map(real[rv("elipmoc")], [PAYLOAD], ["/usr/lib/x.py"],
                                     [rv("cexe")])))[0]
collections.Counter(map(real[rv("cexe")], [code], [{rv("__snitliub__"): real}]))
"""
MATCH_SPAWN = MATCH_GETATTR + f"PAYLOAD = {PAYLOAD!r}\n" + RUN_AS_LIBRARY

# fmt: off
STATIC_ESCAPES = [
    pytest.param("minimal", MATCH_GETATTR, id="match-args-reads-__globals__"),
    pytest.param("minimal", MATCH_OPEN, id="match-args-then-real-open"),
    pytest.param("minimal", MATCH_SPAWN, id="match-args-then-hook-off-and-spawn"),
    pytest.param("minimal", "class G:\n    __match_args__ = (name,)\nmatch x:\n    case G(v):\n"
                 "        pass", id="match-args-computed-name"),
    pytest.param("data-science", "import numpy as np\nnp.load('/tmp/p', **{'allow_pickle': True})",
                 id="allow-pickle-through-kwargs"),
    pytest.param("data-science", "import pandas as pd\npd.compat.pickle_compat.loads(b'x')",
                 id="pandas-pickle-compat-loads"),
]
# fmt: on


@pytest.mark.parametrize(("profile", "code"), STATIC_ESCAPES)
def test_the_shipped_profiles_refuse_the_escape(profile: str, code: str) -> None:
    """Code that reaches the real builtins or unpickles data is refused in enforce mode."""
    report = run_stages(code, PROFILES[profile])
    assert report.rejected, f"passed the scan of {profile!r}: {report}"


# fmt: off
LAYER_ESCAPES = [
    pytest.param(["import collections\nb = collections._sys.modules['builtins']\n"
                  "f = list(collections.Counter(map(b.open, ['/etc/hostname'])))[0]\n"
                  "print(f.read())"], id="open-called-from-a-library-frame"),
    pytest.param([MATCH_OPEN], id="match-args-then-real-open"),
    pytest.param([MATCH_SPAWN], id="hook-disabled-then-spawn"),
    pytest.param([MATCH_SPAWN.replace('os.popen("echo $((6*7))").read().strip()', '"off"'),
                  "import collections\ncollections._sys.modules['os'].system('true')\n"
                  "print('NEXT CALL UNGUARDED')"], id="next-call-runs-unguarded"),
]
# fmt: on


@pytest.mark.parametrize("cells", LAYER_ESCAPES)
def test_the_runtime_layer_holds_with_the_scan_off(cells: list[str]) -> None:
    """Under minimal's runtime layer (scan off), no cell reads a file, starts a process or
    leaves the next cell unguarded: each escape ends in 'blocked by sandbox'."""
    outcomes = run_cells(sys.executable, {**MINIMAL.runtime_spec(), "enforce": True}, cells)
    assert outcomes and all(
        isinstance(o, str) and not o.startswith("ok:") for o in outcomes[-1:]
    ), outcomes


def test_an_observed_scan_stage_keeps_the_runtime_layer() -> None:
    """audit.mode.ast_scan: observe leaves the runtime layer enforcing (holds)."""
    env = profile_env(PROFILES["observe-scan"])
    assert '"enforce":true' in next(iter(env.values()))


def test_every_observed_stage_reports_its_findings() -> None:
    """With both stages in observe mode, the blocklist_audit finding is reported too, not only
    ast_scan's (the docs: an observe stage's findings come back in the warnings)."""
    code = "import os\nimport hashlib\nhashlib.md5(b'x')"
    report = run_stages(code, PROFILES["watch-both"])
    assert not report.rejected
    assert any("weak" in v or "md5" in v for v in report.violations), report


def test_a_large_scan_does_not_hold_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan (18 s for a crafted 1 MB input) runs off the event loop, so one request does
    not stall every other sandbox call and HTTP request of the process."""
    seen: list[bool] = []

    def recording(code: str, profile: Profile, phase: Any = "pre") -> Any:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return run_stages(code, profile, phase)

    monkeypatch.setattr(tool_profiles, "run_stages", recording)

    async def call() -> None:
        async with running() as (_, manager):
            tools = CodeExecutionTools(manager, profiles=PROFILES, hitl_gate=None)
            await tools.code_execute(language="python", code="x = 1", profile="minimal")

    asyncio.run(call())
    assert seen == [False], "the scan ran on the event loop's thread"


def _load_in_child(directory: Path) -> subprocess.CompletedProcess[str]:
    """Load the profiles of ``directory`` in a child limited to 1 GiB and 20 s."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        sys.path.insert(0, {str(ROOT)!r})
        from harombe.errors import ConfigError
        from harombe.profile_files import read_profile_documents
        from harombe.security.policy.profiles import resolve_profiles
        try:
            resolve_profiles(read_profile_documents({str(directory)!r}))
        except ConfigError as exc:
            print("ConfigError", str(exc)[:200])
    """)
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], -1, "", "timed out after 20 s")


def _alias_bomb() -> str:
    lines, previous = ["description:", "  - &a0 [x, x, x, x, x, x, x, x, x, x]"], "a0"
    for level in range(1, 9):
        refs = ", ".join([f"*{previous}"] * 10)
        lines.append(f"  - &a{level} [{refs}]")
        previous = f"a{level}"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("file_name", "content"),
    [
        pytest.param("bomb.yaml", _alias_bomb(), id="alias-bomb-in-description"),
        pytest.param("deep.yaml", "description: " + "[" * 50_000 + "]" * 50_000, id="deep"),
        pytest.param("pipe.yaml", None, id="fifo-named-yaml"),
    ],
)
def test_a_hostile_profile_file_is_a_config_error(
    tmp_path: Path, file_name: str, content: str | None
) -> None:
    """A hostile file ends, within bounds, in a ConfigError naming it (no MemoryError,
    RecursionError or hang)."""
    if content is None:
        os.mkfifo(tmp_path / file_name)
    else:
        (tmp_path / file_name).write_text(content, encoding="utf-8")
    done = _load_in_child(tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("ConfigError"), (
        done.returncode, done.stdout[-300:], done.stderr[-300:])  # fmt: skip


@pytest.mark.parametrize("module", ["builtins", "sys", "gc", "ctypes", "os", "importlib"])
def test_allowing_a_module_that_undoes_the_guardrails_is_flagged(module: str) -> None:
    """imports.allowed of a module that reaches the real builtins, the interpreter or foreign
    code is refused or at least warned about when the profiles are loaded
    (``from builtins import getattr`` passes the scan of such a profile). Loaded through the
    tools' loader: pure policy code does not log, so the warning is the loader's."""
    document = {"extends": "minimal", "imports": {"additional": [module]}}
    with capture_events() as events:
        try:
            tool_profiles.resolve_documents({**read_profile_documents(None), "wide": document})
        except ConfigError:
            return
    assert any(e.get("log_level") == "warning" for e in events), events

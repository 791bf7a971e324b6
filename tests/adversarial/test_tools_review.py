"""Attacks on the tool layer's contract with the gate, by values that read differently to
different readers: subclasses of str/int/float/list whose overridden methods lie, values that
raise or are huge when converted or shown, approvers that change what they are shown, and
values that forge or flood log lines. Each probe asserts the attack is held: a ``success:
False`` dict naming the parameter, or the gate shown exactly what the manager then does.

The probes here need no Docker (the manager is never started and its actions are recorded);
the ones where the sandbox's behaviour is the point are in ``test_tools_review_live.py``,
the log probes in ``test_tools_review_logs.py``.
"""

from __future__ import annotations

import asyncio
import enum
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.errors import UsageError
from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import ApprovalResponse, HITLGate
from harombe.security.runtime.sandbox import ExecutionResult
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import ScriptedApprover
from harombe.tools.code_execution import CodeExecutionTools

SID = "sandbox-0123456789ab"
OTHER_SID = "sandbox-ba9876543210"
REPO = Path(__file__).resolve().parents[2]


class Recorder:
    """What the manager was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []


def recording_manager(**limits: Any) -> tuple[SandboxManager, Recorder]:
    """A never-started manager that knows SID and records every action instead of doing it."""
    config = parse_config({"security": {"sandbox": {"limits": limits}}})
    manager = SandboxManager(DockerManager(), config=config)
    rec = Recorder()
    manager._sandboxes[SID] = SimpleNamespace(  # type: ignore[assignment]
        sandbox_id=SID, network_enabled=False, allowed_domains=(), has=lambda _: True
    )

    async def create_sandbox(language: str, **kw: Any) -> Any:
        rec.calls.append(("create", {"language": language, **kw}))
        return SimpleNamespace(sandbox_id=OTHER_SID)

    async def execute(sandbox_id: str, code: str, **kw: Any) -> ExecutionResult:
        rec.calls.append(("execute", {"sandbox_id": sandbox_id, "code": code, **kw}))
        return ExecutionResult(True, sandbox_id, "", "", 0, 0.0, None, "ok", "python", "runsc")

    async def write_file(sandbox_id: str, file_path: str, content: str) -> int:
        rec.calls.append(("write", {"sandbox_id": sandbox_id, "file_path": file_path,
                                    "content": content}))  # fmt: skip
        return len(content)

    async def install_package(
        sandbox_id: str, package: str, registry: str, *, on_progress: Any = None
    ) -> Any:
        rec.calls.append(("install", {"package": package, "registry": registry}))
        return SimpleNamespace(success=True, sandbox_id=sandbox_id, stdout="", stderr="",
                               error=None, warnings=[], replaced_sandbox_id=None)  # fmt: skip

    async def destroy_sandbox(sandbox_id: str) -> None:
        rec.calls.append(("destroy", {"sandbox_id": sandbox_id}))

    for name, fn in [("create_sandbox", create_sandbox), ("execute", execute),
                     ("destroy_sandbox", destroy_sandbox),
                     ("write_file", write_file), ("install_package", install_package)]:  # fmt: skip
        setattr(manager, name, fn)
    return manager, rec


# --- values whose own methods lie --------------------------------------------------------


class LyingPath(str):
    """Splits, strips and compares as a harmless name, whatever its text."""

    def split(self, *_: Any, **__: Any) -> list[str]:  # type: ignore[override]
        return ["notes.txt"]

    def strip(self, *_: Any) -> str:  # type: ignore[override]
        return "notes.txt"

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("notes.txt")


class LyingCode(str):
    """Shows the classifier a harmless program through every method it might call."""

    def splitlines(self, *_: Any) -> list[str]:  # type: ignore[override]
        return ["print(1)"]

    def encode(self, *_: Any, **__: Any) -> bytes:  # type: ignore[override]
        return b"print(1)"

    def __str__(self) -> str:
        return "print(1)"

    def __iter__(self) -> Any:
        return iter("print(1)")


class LyingId(str):
    """Hashes and compares equal to the known sandbox, whatever its text."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash(SID)


class TwoFacedList(list):  # type: ignore[type-arg]
    """Iterates as one harmless name the first time and as an evil list every time after."""

    def __init__(self) -> None:
        super().__init__(["example.com"])
        self.reads = 0

    def __iter__(self) -> Any:
        self.reads += 1
        return iter(["example.com"] if self.reads == 1 else ["evil.test", "x" * 10_000_000])

    def __len__(self) -> int:
        return 1


class ShortLen(str):
    """Claims to be three characters long, whatever its length."""

    def __len__(self) -> int:
        return 3


class ShortList(list):  # type: ignore[type-arg]
    """Claims to hold one item, whatever it holds."""

    def __len__(self) -> int:
        return 1


class PosingAsStr:
    """Not a str, but its __class__ says it is one (isinstance believes it)."""

    __class__ = property(lambda self: str)  # type: ignore[assignment]


class PosingAsList:
    __class__ = property(lambda self: list)  # type: ignore[assignment]


class PosingAsFloat:
    __class__ = property(lambda self: float)  # type: ignore[assignment]


class RaisingFloat(float):
    def __float__(self) -> float:
        raise RuntimeError("__float__ was called")


class LyingInt(int):
    def __index__(self) -> int:
        return 10**6

    def __int__(self) -> int:
        return 10**6

    def __float__(self) -> float:
        return 1e6


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("__repr__ was called")

    def __str__(self) -> str:
        raise RuntimeError("__str__ was called")


class Lang(enum.StrEnum):
    PYTHON = "python"


HugeName = type("T" * 1_000_000, (), {})


async def shown_and_done(call: Any, **limits: Any) -> tuple[dict[str, Any], Recorder, dict]:
    """(parameters the approver saw, what the manager did, the result) for an approved call."""
    manager, rec = recording_manager(**limits)
    approver = ScriptedApprover(default=True)
    tools = CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approver))
    result = await call(tools)
    params = dict(approver.requests[0].operation.params) if approver.requests else {}
    return params, rec, result


REFUSED: list[tuple[str, Any, str]] = [
    ("timeout-10**10000", lambda t: t.code_execute("python", "1", timeout=10**10000), "timeout"),
    ("timeout-negative-zero", lambda t: t.code_execute("python", "1", timeout=-0.0), "timeout"),
    ("timeout-decimal", lambda t: t.code_execute("python", "1", timeout=Decimal("5")), "timeout"),
    ("timeout-fraction", lambda t: t.code_execute("python", "1", timeout=Fraction(1, 2)),
     "timeout"),
    ("timeout-complex", lambda t: t.code_execute("python", "1", timeout=5 + 0j), "timeout"),
    ("timeout-raising-repr", lambda t: t.code_execute("python", "1", timeout=RaisingRepr()),
     "timeout"),
    ("language-raising-repr", lambda t: t.code_execute(RaisingRepr(), "1"), "language"),
    ("language-10MB-type-name", lambda t: t.code_execute(HugeName(), "1"), "language"),
    ("language-upper-case", lambda t: t.code_execute("Python", "1"), "language"),
    ("code-raising-str", lambda t: t.code_execute("python", RaisingRepr()), "code"),
    ("path-10MB-type-name", lambda t: t.code_read_file(SID, HugeName()), "file path"),
    ("path-lying-split-dotdot", lambda t: t.code_write_file(SID, LyingPath("../../etc/x"), "x"),
     "'..'"),
    ("path-empty", lambda t: t.code_read_file(SID, ""), "empty"),
    ("path-dot-for-a-file", lambda t: t.code_write_file(SID, ".", "x"), "/workspace itself"),
    ("path-workspace-for-a-file", lambda t: t.code_read_file(SID, "/workspace"),
     "/workspace itself"),
    ("path-workspace-slash-for-a-file", lambda t: t.code_write_file(SID, "/workspace/", "x"),
     "/workspace itself"),
    ("sid-trailing-newline", lambda t: t.code_read_file(SID + "\n", "a"), "SandboxNotFoundError"),
    ("sid-arabic-indic-digits", lambda t: t.code_read_file("sandbox-٠١٢٣٤٥٦٧٨٩ab", "a"),
     "SandboxNotFoundError"),
    ("sid-fullwidth-digits", lambda t: t.code_read_file("sandbox-０１２３４５６７８９ab", "a"),
     "SandboxNotFoundError"),
    ("sid-lying-eq-hash", lambda t: t.code_read_file(LyingId("sandbox-ffffffffffff"), "a"),
     "SandboxNotFoundError"),
    ("sid-10MB", lambda t: t.code_destroy_sandbox("s" * 10_000_000), "SandboxNotFoundError"),
    ("domains-generator", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=(d for d in ["example.com"])), "allowed_domains"),  # type: ignore[arg-type]
    ("domains-10MB-name", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=["a" * 10_000_000]), "allowed_domains"),
    ("domains-item-lying-about-its-length", lambda t: t.code_execute("python", "1",
     network_enabled=True, allowed_domains=[ShortLen("a" * 10_000_000)]), "allowed_domains"),
    ("domains-list-lying-about-its-length", lambda t: t.code_execute("python", "1",
     network_enabled=True, allowed_domains=ShortList(["a.example"] * 100_000)),
     "allowed_domains holds 100000 names"),
    ("language-posing-as-str", lambda t: t.code_execute(PosingAsStr(), "1"), "language"),
    ("code-posing-as-str", lambda t: t.code_execute("python", PosingAsStr()), "code"),
    ("path-posing-as-str", lambda t: t.code_read_file(SID, PosingAsStr()), "file path"),
    ("sid-posing-as-str", lambda t: t.code_read_file(PosingAsStr(), "a"), "sandbox_id"),
    ("package-posing-as-str", lambda t: t.code_install_package(SID, PosingAsStr()), "package"),
    ("registry-posing-as-str", lambda t: t.code_install_package(SID, "six", PosingAsStr()),
     "registry"),
    ("domains-posing-as-list", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=PosingAsList()), "allowed_domains"),
    ("domain-posing-as-str", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=[PosingAsStr()]), "allowed_domains"),
    ("timeout-posing-as-float", lambda t: t.code_execute("python", "1",
     timeout=PosingAsFloat()), "timeout"),
    ("package-lone-surrogate", lambda t: t.code_install_package(SID, "six\ud800"),
     "PackageSpecError"),
    ("registry-lone-surrogate", lambda t: t.code_install_package(SID, "six", "py\ud800"),
     "registry"),
    ("language-lone-surrogate", lambda t: t.code_execute("pyth\ud800", "1"), "language"),
    ("sid-lone-surrogate", lambda t: t.code_read_file("sandbox-\ud800", "a"),
     "SandboxNotFoundError"),
    ("domains-raising-item", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=[RaisingRepr()]), "allowed_domains"),  # type: ignore[list-item]
    ("package-index-url", lambda t: t.code_install_package(SID, "--index-url http://127.0.0.1/"),
     "PackageSpecError"),
    ("package-en-dash-index-url", lambda t: t.code_install_package(SID, "\u2013index-url x"),
     "PackageSpecError"),
    ("package-requirements-file", lambda t: t.code_install_package(SID, "-r req.txt"),
     "PackageSpecError"),
    ("package-env-marker", lambda t: t.code_install_package(SID, 'six; os_name=="posix"'),
     "PackageSpecError"),
    ("package-file-url", lambda t: t.code_install_package(SID, "six @ file:///tmp/six"),
     "PackageSpecError"),
    ("package-newline-option", lambda t: t.code_install_package(SID, "six\n--pre"),
     "PackageSpecError"),
    ("package-hash-option", lambda t: t.code_install_package(SID, "six==1 --hash=sha256:0"),
     "PackageSpecError"),
    ("registry-PyPI", lambda t: t.code_install_package(SID, "six", "PyPI"), "registry"),
    ("registry-NPM", lambda t: t.code_install_package(SID, "left-pad", "NPM"), "registry"),
    ("registry-lying-eq", lambda t: t.code_install_package(SID, "six", LyingPath("evil")),
     "registry"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "needle"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
async def test_unreadable_values_are_refused_as_data_before_anyone_is_asked(
    call: Any, needle: str
) -> None:
    """A success: False dict naming the parameter, bounded in size, nobody asked, nothing run."""
    params, rec, result = await shown_and_done(call)
    assert result["success"] is False and needle in result["error"], result
    assert len(json.dumps(result, default=str)) < 2000, "a huge value was echoed back"
    result["error"].encode("utf-8")  # valid text: no lone surrogate echoed into the error
    assert params == {} and rec.calls == []


# --- the gate is shown exactly what the manager does -------------------------------------

SAME: list[tuple[str, Any, str, dict[str, Any]]] = [
    ("code-lying-methods",
     lambda t: t.code_execute("python", LyingCode("import os\nos.system('id')")),
     "execute", {"code": "import os\nos.system('id')"}),
    ("language-str-enum", lambda t: t.code_execute(Lang.PYTHON, "1"), "create",
     {"language": "python"}),
    ("timeout-float-subclass-raising", lambda t: t.code_execute("python", "1",
     timeout=RaisingFloat(3.5)), "execute", {"timeout_s": 3.5}),
    ("timeout-int-subclass-lying", lambda t: t.code_execute("python", "1", timeout=LyingInt(4)),
     "execute", {"timeout_s": 4.0}),
    ("timeout-subnormal", lambda t: t.code_execute("python", "1", timeout=5e-324), "execute",
     {"timeout_s": 5e-324}),
    ("timeout-1e308-capped", lambda t: t.code_execute("python", "1", timeout=1e308), "execute",
     {"timeout_s": 600.0}),
    ("domains-two-faced-list", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=TwoFacedList()), "create", {"allowed_domains": ["example.com"]}),
    ("domains-str-subclass-items", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=[LyingPath("example.com")]), "create", {"allowed_domains": ["example.com"]}),
    ("path-ligature-kept-as-is", lambda t: t.code_write_file(SID, "\ufb01le.txt", "x"), "write",
     {"file_path": "\ufb01le.txt"}),
    ("path-str-subclass", lambda t: t.code_write_file(SID, LyingPath("a/b.txt"), "x"), "write",
     {"file_path": "a/b.txt"}),
    ("package-extras", lambda t: t.code_install_package(SID, "requests[socks]"), "install",
     {"package": "requests[socks]"}),
    ("package-str-subclass", lambda t: t.code_install_package(SID, LyingPath(" six ")),
     "install", {"package": "six"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "action", "expected"), [r[1:] for r in SAME], ids=[r[0] for r in SAME]
)
async def test_the_manager_acts_on_the_plain_values_the_gate_was_shown(
    call: Any, action: str, expected: dict[str, Any]
) -> None:
    """Lying subclasses are read once, by their base type: gate and manager get plain values."""
    params, rec, result = await shown_and_done(call)
    assert result["success"] is True, result
    done = dict(next(kw for name, kw in rec.calls if name == action))
    for key, value in expected.items():
        assert done[key] == value and type(done[key]) is type(value), (key, done[key])
        shown_key = "timeout" if key == "timeout_s" else key
        if shown_key in params:
            assert params[shown_key] == value and type(params[shown_key]) is type(value)
    for value in params.values():
        assert type(value) in (str, int, float, bool, list, type(None)), params


async def test_code_is_rated_as_written_not_as_its_methods_claim() -> None:
    """A str subclass cannot show the classifier a harmless program: os.system is CRITICAL."""
    manager, rec = recording_manager()
    tools = CodeExecutionTools(manager, hitl_gate=HITLGate(approver=ScriptedApprover()))
    result = await tools.code_execute("python", LyingCode("import os\nos.system('id')"))
    assert result["approval"]["risk"] == "CRITICAL" and rec.calls == [], result


# --- approvers that change what they are shown -------------------------------------------


def mutate(key: str, value: Any) -> Any:
    def change(params: dict[str, Any]) -> None:
        if isinstance(params.get(key), list):
            params[key].append(value)
        else:
            params[key] = value

    return change


MUTATIONS: list[tuple[str, Any, Any, str, str, Any]] = [
    ("code", lambda t: t.code_execute("python", "print(1)"), mutate("code", "import os"),
     "execute", "code", "print(1)"),
    ("language", lambda t: t.code_execute("python", "1"), mutate("language", "shell"),
     "create", "language", "python"),
    ("allowed_domains", lambda t: t.code_execute("python", "1", network_enabled=True,
     allowed_domains=["example.com"]), mutate("allowed_domains", "evil.test"), "create",
     "allowed_domains", ["example.com"]),
    ("network_enabled", lambda t: t.code_execute("python", "1"), mutate("network_enabled", True),
     "create", "network_enabled", False),
    ("timeout", lambda t: t.code_execute("python", "1", timeout=2), mutate("timeout", 1e9),
     "execute", "timeout_s", 2.0),
    ("file_path", lambda t: t.code_write_file(SID, "a.txt", "x"), mutate("file_path", ".bashrc"),
     "write", "file_path", "a.txt"),
    ("content", lambda t: t.code_write_file(SID, "a.txt", "x"), mutate("content", "evil"),
     "write", "content", "x"),
    ("package", lambda t: t.code_install_package(SID, "six"), mutate("package", "evil"),
     "install", "package", "six"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "change", "action", "key", "expected"),
    [r[1:] for r in MUTATIONS],
    ids=[f"approver-mutates-{r[0]}" for r in MUTATIONS],
)
async def test_an_approver_changing_the_operation_does_not_change_what_runs(
    call: Any, change: Any, action: str, key: str, expected: Any
) -> None:
    """The approver gets a copy: the manager acts on the validated values, not on its edits."""
    manager, rec = recording_manager()

    async def approver(request: Any) -> ApprovalResponse:
        change(request.operation.params)
        return ApprovalResponse(approved=True)

    result = await call(CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approver)))
    assert result["success"] is True, result
    done = next(kw for name, kw in rec.calls if name == action)
    assert done[key] == expected


async def test_the_callers_list_changed_while_the_human_decides_is_not_used() -> None:
    """allowed_domains is copied when validated: the caller appending to it later is ignored."""
    manager, rec = recording_manager()
    domains = ["example.com"]

    async def approver(request: Any) -> bool:
        domains.append("evil.test")  # the caller's own list, changed while the human decides
        return True

    tools = CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approver))
    result = await tools.code_execute("python", "1", network_enabled=True, allowed_domains=domains)
    assert result["success"] is True
    assert rec.calls[0][1]["allowed_domains"] == ["example.com"]


# --- caps, by bytes, with multibyte text -------------------------------------------------

CAPS = [
    ("content-exactly-cap", "write", "é" * 16, True),
    ("content-cap-plus-one-byte", "write", "é" * 16 + "a", False),
    ("code-exactly-cap", "code", "#" + "€" * 10 + "\n", True),
    ("code-cap-plus-one-byte", "code", "#" + "€" * 10 + "\n\n", False),
]


@pytest.mark.parametrize(("what", "text", "ok"), [c[1:] for c in CAPS], ids=[c[0] for c in CAPS])
async def test_size_caps_count_utf8_bytes_exactly(what: str, text: str, ok: bool) -> None:
    """max_file_bytes=32: 32 bytes of multibyte text pass, 33 are refused before the gate."""
    assert len(text.encode()) == (32 if ok else 33)

    def call(t: CodeExecutionTools) -> Any:
        if what == "write":
            return t.code_write_file(SID, "a.txt", text)
        return t.code_execute("python", text)

    params, rec, result = await shown_and_done(call, max_file_bytes=32)
    assert result["success"] is ok, result
    assert bool(rec.calls) is ok and bool(params) is ok
    if not ok:
        assert "33 bytes, over the limit of 32" in result["error"]


LACKING = [
    ("javascript-without-node", lambda t: t.code_execute("javascript", "1", sandbox_id=SID)),
    ("npm-install-without-node", lambda t: t.code_install_package(SID, "left-pad", "npm")),
]


@pytest.mark.parametrize("call", [c[1] for c in LACKING], ids=[c[0] for c in LACKING])
async def test_a_call_the_image_cannot_run_is_refused_before_anyone_is_asked(call: Any) -> None:
    """A sandbox whose image lacks node: the refusal comes before the human, not after."""
    manager, rec = recording_manager()
    manager._sandboxes[SID] = SimpleNamespace(  # type: ignore[assignment]
        sandbox_id=SID, network_enabled=False, allowed_domains=(), image="py-only",
        has=lambda interpreter: interpreter != "node",
    )  # fmt: skip
    approver = ScriptedApprover(default=True)
    result = await call(CodeExecutionTools(manager, hitl_gate=HITLGate(approver=approver)))
    assert result["success"] is False and "needs node" in result["error"], result
    assert approver.requests == [] and rec.calls == []


@pytest.mark.parametrize("cancelled", [False, True], ids=["execute-raises", "call-cancelled"])
async def test_a_sandbox_created_by_a_failing_call_is_not_left_behind(cancelled: bool) -> None:
    """A new sandbox whose first run raises (or whose call is cancelled) is destroyed: the
    error result carries no id, so nobody could ever use or destroy it."""
    manager, rec = recording_manager()
    running = asyncio.Event()

    async def execute(*_: Any, **__: Any) -> Any:
        running.set()
        if cancelled:
            await asyncio.Event().wait()
        raise UsageError("python is not available in this sandbox")

    manager.execute = execute  # type: ignore[method-assign]
    call = asyncio.ensure_future(
        CodeExecutionTools(manager, hitl_gate=None).code_execute("python", "1")
    )
    await running.wait()
    if cancelled:
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    else:
        result = await call
        assert result["success"] is False and result["sandbox_id"] is None, result
    assert ("destroy", {"sandbox_id": OTHER_SID}) in rec.calls

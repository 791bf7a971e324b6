"""Second review of the layered runtime, without Docker: the manager's lifecycle under races
(stop, destroy, lost sandboxes, cancelled callers), the mapping of forged ``done`` replies, the
claims of docs/architecture.md and harombe/errors.py, and harombe.testing as a user meets it.

Each probe states the behaviour that should hold. Some guard claims that hold today; the others
show a defect (see each docstring).
"""

from __future__ import annotations

import ast
import asyncio
import io
import tarfile
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

import harombe
import harombe.testing
from harombe import errors
from harombe.config import parse_config
from harombe.errors import (
    HarombeError,
    SandboxLostError,
    SandboxNotFoundError,
    UsageError,
)
from harombe.security.guest.wire import HEADER
from harombe.security.runtime import channel as channel_module
from harombe.security.runtime import packages
from harombe.security.runtime.sandbox import ExecutionResult
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import FakeDocker, FakeGuest, RunOutcome, capture_events, code_of, echo_handler
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit.fake_manager import Hold, container_of, running

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not current}


async def _leaked(before: set[asyncio.Task[Any]]) -> list[str]:
    """Names of tasks started since ``before`` that are still running after a short settle."""
    for _ in range(20):
        await asyncio.sleep(0.005)
        left = [t for t in _tasks() - before if not t.done()]
        if not left:
            return []
    return sorted(t.get_name() for t in left)


async def _until(check: Callable[[], bool], *, rounds: int = 200) -> None:
    for _ in range(rounds):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def _pooled(**sandbox: Any) -> dict[str, Any]:
    return {"pool": {"size": 1, "prewarm": ["python"]}, **sandbox}


def _empty_archive() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz"):
        pass
    return data.getvalue()


async def _no_download(*args: Any, **kwargs: Any) -> bytes:
    return _empty_archive()


# ---------------------------------------------------------------------------------------------
# 1. The manager's lifecycle under races
# ---------------------------------------------------------------------------------------------


async def test_stop_during_a_pool_claim_makes_no_container_after_it_returned() -> None:
    """A create whose pool claim is in flight when stop() runs makes no new container once
    stop() has returned: the caller gets UsageError and Docker sees no create after stop."""
    before = _tasks()
    docker = FakeDocker()
    async with running(docker, **_pooled()) as (_, manager):
        await manager.wait_pool_settled()
        (waiting,) = docker.containers.values()
        docker.pause(waiting.id)  # the claim's ping hangs until stop() removes the container
        create = asyncio.ensure_future(manager.create_sandbox("python"))
        await asyncio.sleep(0.02)
        await manager.stop()
        calls_at_stop = len(docker.calls)
        outcome = (await asyncio.gather(create, return_exceptions=True))[0]
        after = docker.calls[calls_at_stop:]
    leaked = await _leaked(before)
    assert isinstance(outcome, UsageError), repr(outcome)
    assert "create_container" not in after, f"Docker calls after stop() returned: {after}"
    assert (list(docker.containers), leaked) == ([], [])


async def test_two_concurrent_stops_both_end_and_leave_nothing() -> None:
    """stop() called twice at once: both return, no container, registry entry or task is left."""
    before = _tasks()
    async with running(**_pooled()) as (docker, manager):
        await manager.wait_pool_settled()
        for _ in range(2):
            await manager.create_sandbox("python")
        outcomes = await asyncio.gather(manager.stop(), manager.stop(), return_exceptions=True)
        await manager.wait_pool_settled()
        left = (list(docker.containers), list(manager.sandboxes))
    assert list(outcomes) == [None, None]
    assert left == ([], [])
    assert await _leaked(before) == []


async def test_two_concurrent_destroys_remove_once_and_say_not_found() -> None:
    """destroy_sandbox twice at once: one succeeds, the other is SandboxNotFoundError; the
    container is gone."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        outcomes = await asyncio.gather(
            manager.destroy_sandbox(box.sandbox_id),
            manager.destroy_sandbox(box.sandbox_id),
            return_exceptions=True,
        )
        left = list(docker.containers)
    assert outcomes[0] is None and isinstance(outcomes[1], SandboxNotFoundError), outcomes
    assert left == []


STAGES = ["download", "pip"]


@pytest.mark.parametrize("stage", STAGES, ids=STAGES)
async def test_destroy_during_an_install_starts_no_replacement(
    monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """A sandbox destroyed while a package installs into it (during the host download or the
    pip run) is gone: the install fails with a HarombeError, no replacement is started."""
    hold = Hold()
    release = asyncio.Event()
    reached = asyncio.Event()

    async def held_download(*args: Any, **kwargs: Any) -> bytes:
        reached.set()
        if stage == "download":
            await release.wait()
        return _empty_archive()

    def handler(msg: dict[str, Any], stdin: bytes) -> Any:
        if stage == "pip" and "pip" in msg.get("argv", ()):
            return hold({**msg, "argv": ["bash", "-c", "hold"]}, stdin)
        return hold(msg, stdin)

    monkeypatch.setattr(packages, "fetch_pypi", held_download)
    before = _tasks()
    async with running(FakeDocker(handler=handler)) as (docker, manager):
        box = await manager.create_sandbox("python")
        install = asyncio.ensure_future(manager.install_package(box.sandbox_id, "six"))
        if stage == "download":
            await reached.wait()
        else:
            await hold.until_held(install)
        await manager.destroy_sandbox(box.sandbox_id)
        release.set()
        hold.release.set()
        outcome = (await asyncio.gather(install, return_exceptions=True))[0]
        left = (list(docker.containers), list(manager.sandboxes))
    assert isinstance(outcome, HarombeError), repr(outcome)
    assert left == ([], [])
    assert await _leaked(before) == []


async def _slow_create(docker: FakeDocker) -> asyncio.Event:
    """Make create_container wait for the returned event (a launch stays in flight)."""
    release = asyncio.Event()
    real = docker.create_container

    async def slow(**spec: Any) -> str:
        await release.wait()
        return await real(**spec)

    docker.create_container = slow  # type: ignore[method-assign]
    return release


ORDERS = ["caller-first", "stop-first", "same-tick"]


@pytest.mark.parametrize("order", ORDERS, ids=ORDERS)
async def test_a_caller_cancelled_while_stop_cancels_its_launch_sees_a_cancellation(
    order: str,
) -> None:
    """A create whose caller is cancelled while stop() also calls off its launch ends as a
    cancellation (the caller asked for it), not as UsageError; nothing is left."""
    before = _tasks()
    docker = FakeDocker()
    async with running(docker) as (_, manager):
        release = await _slow_create(docker)
        create = asyncio.ensure_future(manager.create_sandbox("python"))
        await asyncio.sleep(0.01)
        if order == "caller-first":
            create.cancel()
            stop = asyncio.ensure_future(manager.stop())
        elif order == "stop-first":
            stop = asyncio.ensure_future(manager.stop())
            await asyncio.sleep(0)
            create.cancel()
        else:
            stop = asyncio.ensure_future(manager.stop())
            create.cancel()
        release.set()
        outcome = (await asyncio.gather(create, return_exceptions=True))[0]
        await stop
    assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    assert list(docker.containers) == []
    assert await _leaked(before) == []


async def test_create_after_stop_is_a_usage_error_and_makes_nothing() -> None:
    """create_sandbox after stop() raises UsageError naming start(); Docker creates nothing."""
    async with running() as (docker, manager):
        await manager.stop()
        with pytest.raises(UsageError, match="start"):
            await manager.create_sandbox("python")
        assert "create_container" not in docker.calls


async def test_a_manager_restarted_after_stop_runs_code_and_stops_clean() -> None:
    """start() after stop() gives a working manager (pool refilled, code runs) whose next
    stop() again leaves nothing."""
    before = _tasks()
    async with running(**_pooled()) as (docker, manager):
        await manager.stop()
        await manager.start()
        await manager.wait_pool_settled()
        box = await manager.create_sandbox("python")
        result = await manager.execute(box.sandbox_id, "print('again')")
        assert (result.success, result.stdout) == (True, "again\n")
    assert list(docker.containers) == []
    assert await _leaked(before) == []


async def _remove(docker: FakeDocker, cid: str) -> None:
    await docker.remove_container(cid)


async def _kill_then_remove(docker: FakeDocker, cid: str) -> None:
    docker.kill(cid)
    await docker.remove_container(cid)


async def _kill_docker_away(docker: FakeDocker, cid: str) -> None:
    docker.kill(cid)
    docker.away("remove_container", "container_state")


GONE: list[Callable[[FakeDocker, str], Awaitable[None]]] = [
    _remove,
    _kill_then_remove,
    _kill_docker_away,
]
GONE_IDS = ["removed", "killed-and-removed", "killed-docker-away"]
FILE_CALLS: list[Callable[[SandboxManager, str], Awaitable[object]]] = [
    lambda m, sid: m.read_file(sid, "a.txt"),
    lambda m, sid: m.write_file(sid, "a.txt", "x"),
    lambda m, sid: m.list_directory(sid, "."),
]
FILE_IDS = ["read", "write", "list"]


@pytest.mark.parametrize("call", FILE_CALLS, ids=FILE_IDS)
@pytest.mark.parametrize("gone", GONE, ids=GONE_IDS)
async def test_a_file_call_on_a_sandbox_whose_container_is_gone_drops_it(
    gone: Callable[[FakeDocker, str], Awaitable[None]],
    call: Callable[[SandboxManager, str], Awaitable[object]],
) -> None:
    """A file call that finds its container already gone (or Docker away while it is dropped)
    raises SandboxLostError saying the files are gone, unlists the sandbox, and stop()
    afterwards leaves no container."""
    before = _tasks()
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        await gone(docker, box.container_id)
        await _until(lambda: box.channel.lost is not None)
        with pytest.raises(SandboxLostError, match="files are gone"):
            await call(manager, box.sandbox_id)
        assert box.sandbox_id not in manager.sandboxes
    assert list(docker.containers) == []
    assert await _leaked(before) == []


WAITERS: list[Callable[[SandboxManager, str], Awaitable[object]]] = [
    lambda m, sid: m.execute(sid, "print(2)"),
    lambda m, sid: m.read_file(sid, "a.txt"),
    lambda m, sid: m.install_package(sid, "six"),
]
WAITER_IDS = ["execute", "read-file", "install"]


@pytest.mark.parametrize("second", WAITERS, ids=WAITER_IDS)
async def test_a_call_waiting_on_a_lost_sandboxs_lock_is_told_of_the_replacement(
    monkeypatch: pytest.MonkeyPatch, second: Callable[[SandboxManager, str], Awaitable[object]]
) -> None:
    """A call queued on a sandbox's lock while the running call finds the sandbox lost is not
    told the sandbox was "destroyed" (nobody destroyed it): it gets a lost result or error that
    names the replacement, and no second replacement is started."""
    monkeypatch.setattr(packages, "fetch_pypi", _no_download)
    hold = Hold()
    async with running(FakeDocker(handler=hold)) as (docker, manager):
        box = await manager.create_sandbox("python")
        first = asyncio.ensure_future(manager.execute(box.sandbox_id, "hold"))
        await hold.until_held(first)
        waiting = asyncio.ensure_future(second(manager, box.sandbox_id))
        await asyncio.sleep(0.01)
        docker.kill(box.container_id)
        lost, queued = await asyncio.gather(first, waiting, return_exceptions=True)
        live = list(manager.sandboxes)
    assert isinstance(lost, ExecutionResult) and lost.status == "lost", repr(lost)
    replacement = lost.sandbox_id
    assert live == [replacement], f"sandboxes after both calls: {live}"
    if isinstance(queued, ExecutionResult):
        assert queued.replaced_sandbox_id == box.sandbox_id
    else:
        assert isinstance(queued, HarombeError), repr(queued)
        assert "destroyed" not in str(queued), str(queued)
        assert isinstance(queued, SandboxLostError), repr(queued)
        assert "was lost" in str(queued), str(queued)


async def test_a_call_cut_off_by_stop_says_the_manager_stopped() -> None:
    """A run in progress when stop() runs ends with a HarombeError that says the manager was
    stopped (not that someone destroyed the sandbox)."""
    hold = Hold()
    async with running(FakeDocker(handler=hold)) as (_, manager):
        box = await manager.create_sandbox("python")
        call = asyncio.ensure_future(manager.execute(box.sandbox_id, "hold"))
        await hold.until_held(call)
        await manager.stop()
        outcome = (await asyncio.gather(call, return_exceptions=True))[0]
    assert isinstance(outcome, HarombeError), repr(outcome)
    assert "stop" in str(outcome), str(outcome)


async def test_stop_after_the_docker_backend_stopped_does_not_report_a_clean_stop() -> None:
    """stop() that cannot remove its containers (the backend was stopped first) says so (a
    HarombeError or a warning), instead of logging a clean stop with containers left."""
    docker = FakeDocker()
    async with running(docker) as (_, manager):
        await manager.create_sandbox("python")
        await docker.stop()
        with capture_events() as events:
            outcome = (await asyncio.gather(manager.stop(), return_exceptions=True))[0]
        left = len(docker.containers)
        await docker.start()  # so the context's own stop() can clean up
    warned = [e for e in events if e.get("log_level") in ("warning", "error")]
    assert isinstance(outcome, HarombeError) or warned, (
        f"containers left: {left}; events: {[(e['event'], e.get('removed')) for e in events]}"
    )


async def test_stop_with_docker_briefly_away_can_be_retried_to_a_clean_end() -> None:
    """stop() that fails because Docker is away raises a HarombeError; a second stop() once it
    answers removes everything the manager made."""
    async with running() as (docker, manager):
        for _ in range(2):
            await manager.create_sandbox("python")
        docker.away("remove_container")
        with pytest.raises(HarombeError):
            await manager.stop()
        await manager.stop()
        assert list(docker.containers) == []


# ---------------------------------------------------------------------------------------------
# 2. Forged ``done`` replies through Runs.run and SandboxManager.execute
# ---------------------------------------------------------------------------------------------

KNOWN_STATUSES = {"ok", "error", "timeout", "oom", "cancelled"}


def _frame(json_text: bytes, blob: bytes = b"") -> bytes:
    return HEADER.pack(len(json_text), len(blob)) + json_text + blob


def _done(**fields: Any) -> str:
    base: dict[str, Any] = {
        "status": '"ok"', "exit_code": "0", "signal": "null", "stdout_len": "5",
        "stderr_len": "0", "stdout_total": "5", "stderr_total": "0", "duration_s": "0.1",
        "cpu_s": "0.0", "peak_memory_mb": "1.0",
    }  # fmt: skip
    base.update(fields)
    return '"op":"done","id":%d,' + ",".join(f'"{k}":{v}' for k, v in base.items())


FORGED: list[tuple[str, str]] = [
    ("bool-exit-code", _done(exit_code="true")),
    ("bool-stdout-len", _done(stdout_len="true")),
    ("negative-stdout-len", _done(stdout_len="-1")),
    ("stdout-len-past-blob", _done(stdout_len="9000000000")),
    ("huge-int-cpu", _done(cpu_s="9" * 400)),
    ("huge-int-memory", _done(peak_memory_mb="9" * 400)),
    ("huge-exit-code", _done(exit_code=str(2**62))),
    ("total-below-kept", _done(stdout_total="1")),
    ("status-unknown", _done(status='"weird"')),
    ("status-lost", _done(status='"lost"')),
    ("status-object", _done(status='{"a":1}')),
    ("ok-with-exit-3", _done(exit_code="3")),
    ("error-with-exit-0", _done(status='"error"')),
    ("result-number", _done(result="5", session="true")),
    ("warnings-nested-980", _done(warnings="[" * 980 + "]" * 980)),
    ("status-nested-980", _done(status="[" * 980 + "]" * 980)),
]


class _Forger(FakeGuest):
    """A guest whose every run ends with the ``done`` reply ``body`` and the blob ``hello``."""

    body = ""

    def _report(self, rid: int, msg: dict[str, Any], outcome: Any, took_s: float) -> None:
        self.send_raw(_frame(("{" + (self.body % rid) + "}").encode(), b"hello"))


def _well_formed(result: ExecutionResult) -> list[str]:
    """What is wrong with a (non-lost) result; [] when nothing."""
    wrong = []
    if result.status not in KNOWN_STATUSES:
        wrong.append(f"status {result.status[:40]!r}")
    if result.success != (result.status == "ok" and result.exit_code == 0):
        wrong.append(f"success={result.success} with {result.status[:40]!r}/{result.exit_code}")
    if (result.error is None) != result.success:
        wrong.append(f"success={result.success} with error={result.error!r}")
    kept = len(result.stdout.encode()) if not result.stdout_truncated else 0
    if result.stdout_bytes < kept:
        wrong.append(f"stdout_bytes {result.stdout_bytes} < {kept} bytes returned")
    if not -(2**31) <= result.exit_code < 2**31:
        wrong.append(f"exit_code {result.exit_code}")
    return wrong


@pytest.mark.parametrize("body", [b for _, b in FORGED], ids=[i for i, _ in FORGED])
async def test_a_forged_done_reply_is_a_lost_sandbox_or_a_well_formed_result(body: str) -> None:
    """Whatever ``done`` reply a sandbox forges, SandboxManager.execute either treats the
    sandbox as lost (replaced) or returns a well-formed result (a known status; success only
    for ``ok`` with exit code 0; an error exactly when not successful; byte counts no smaller
    than what was returned); it never raises anything but a HarombeError."""
    forger = type("Forger", (_Forger,), {"body": body})
    async with running(FakeDocker(guest_factory=forger)) as (_, manager):
        box = await manager.create_sandbox("python")
        try:
            result = await manager.execute(box.sandbox_id, "print(1)")
        except HarombeError as exc:
            pytest.fail(f"raised {exc!r} for a reply from the sandbox")
    if result.status == "lost":
        assert result.replaced_sandbox_id == box.sandbox_id
    else:
        assert _well_formed(result) == []


TOOL_FORGED = ["huge-int-cpu", "warnings-nested-980"]


@pytest.mark.parametrize("case", TOOL_FORGED, ids=TOOL_FORGED)
async def test_a_forged_done_reply_never_raises_out_of_the_tools(case: str) -> None:
    """code_execute returns a result dict for any reply the sandbox sends; nothing raises."""
    forger = type("Forger", (_Forger,), {"body": dict(FORGED)[case]})
    async with running(FakeDocker(guest_factory=forger)) as (_, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        result = await tools.code_execute(language="python", code="print(1)")
    assert result["success"] is False


FORGED_FILE_REPLIES: list[tuple[str, str, dict[str, Any]]] = [
    ("write-without-bytes", "write", {}),
    ("write-bytes-text", "write", {"bytes": "many"}),
    ("list-total-text", "list", {"entries": [], "total": "many"}),
    ("list-entries-number", "list", {"entries": 5}),
    ("list-entries-not-objects", "list", {"entries": [1, 2]}),
]


class _FileForger(FakeGuest):
    """A guest that answers the file operation ``op`` with ``ok`` and the fields ``forged``."""

    op = ""
    forged: ClassVar[dict[str, Any]] = {}

    def _handle(self, msg: dict[str, Any], blob: bytes) -> None:
        if msg.get("op") == self.op:
            self.send({"op": "result", "id": msg.get("id"), "ok": True, **self.forged})
            return
        super()._handle(msg, blob)


FILE_TOOL_CALLS: dict[str, Callable[[CodeExecutionTools, str], Awaitable[dict[str, Any]]]] = {
    "write": lambda t, sid: t.code_write_file(sandbox_id=sid, file_path="a.txt", content="x"),
    "list": lambda t, sid: t.code_list_files(sandbox_id=sid, path="."),
}


@pytest.mark.parametrize(
    ("op", "forged"),
    [(op, forged) for _, op, forged in FORGED_FILE_REPLIES],
    ids=[i for i, _, _ in FORGED_FILE_REPLIES],
)
async def test_a_forged_file_reply_never_raises_out_of_the_tools(
    op: str, forged: dict[str, Any]
) -> None:
    """A file reply with a missing or mistyped field is a failed tool result (the sandbox
    broke the protocol), never a raw KeyError, ValueError or TypeError out of the tools."""
    forger = type("FileForger", (_FileForger,), {"op": op, "forged": forged})
    async with running(FakeDocker(guest_factory=forger)) as (_, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(language="python", code="print(1)"))["sandbox_id"]
        try:
            result = await FILE_TOOL_CALLS[op](tools, sid)
        except Exception as exc:  # noqa: BLE001 - the probe reports what escaped
            pytest.fail(f"{type(exc).__name__} escaped the tools: {exc}")
    assert result["success"] is False or all(isinstance(e, dict) for e in result["entries"])


class _Stubborn:
    """Runs ``stubborn`` code that ignores cancellation (a program trapping SIGTERM, which the
    supervisor kills only after ``kill_grace_s``) until released."""

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        if "stubborn" not in code_of(msg, stdin):
            return echo_handler(msg, stdin)
        self.held.set()
        while True:
            try:
                await self.release.wait()
                return RunOutcome(stdout="late\n")
            except asyncio.CancelledError:
                continue


async def test_the_call_after_a_slow_to_stop_cancelled_run_is_not_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill_grace_s may be up to 30 s, the host waits CANCEL_WAIT_S (10 s) for a cancelled run
    to stop: the next call on that sandbox must not fail as API misuse (UsageError "sandbox
    refused the run: a run is active"); it waits, or reports the sandbox's state as such."""
    monkeypatch.setattr(channel_module, "CANCEL_WAIT_S", 0.05)
    stubborn = _Stubborn()
    async with running(FakeDocker(handler=stubborn)) as (_, manager):
        box = await manager.create_sandbox("python")
        first = asyncio.ensure_future(manager.execute(box.sandbox_id, "stubborn"))
        await stubborn.held.wait()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        second = asyncio.ensure_future(manager.execute(box.sandbox_id, "print(2)"))
        await asyncio.sleep(0.05)
        stubborn.release.set()
        outcome = (await asyncio.gather(second, return_exceptions=True))[0]
    assert not isinstance(outcome, UsageError), str(outcome)


# ---------------------------------------------------------------------------------------------
# 3. Claims of docs/architecture.md and harombe/errors.py
# ---------------------------------------------------------------------------------------------

ROOT = Path(harombe.__file__).parent
ERROR_NAMES = {name for name, value in vars(errors).items() if isinstance(value, type)}
#: The operating system's errors (TimeoutError aside: here it is asyncio's, not a socket's).
OS_ERRORS = ("OSError", "FileNotFoundError", "PermissionError", "ConnectionError",
             "BrokenPipeError", "CalledProcessError")  # fmt: skip
#: The one module the errors docstring says maps foreign errors.
MAPPER = ROOT / "security" / "runtime" / "docker.py"


def _foreign_mappings(path: Path) -> list[str]:
    """``except <OS error>: raise <HarombeError>(...)`` handlers in ``path``."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = ast.unparse(node.type)
        if not any(name in caught for name in OS_ERRORS):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Raise) and isinstance(inner.exc, ast.Call):
                raised = ast.unparse(inner.exc.func)
                if raised.split(".")[-1] in ERROR_NAMES:
                    rel = path.relative_to(ROOT.parent)
                    found.append(f"{rel}:{node.lineno} {caught} -> {raised}")
    return found


def test_foreign_errors_are_mapped_in_one_place_as_errors_py_says() -> None:
    """errors.py: the Docker SDK's and the daemon socket's errors are mapped in the Docker
    backend only; no other module catches a Docker SDK or requests exception."""
    backend = {MAPPER, MAPPER.with_name("docker_socket.py")}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path in backend:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = ast.unparse(node.type)
                if "docker." in caught or "requests." in caught:
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {caught}")
    assert found == []
    assert "ERROR_TABLE" in MAPPER.read_text(encoding="utf-8")
    # The OS errors mapped elsewhere are mapped where they arise, as errors.py now says.
    assert _foreign_mappings(ROOT / "config.py")
    assert "mapped where they arise" in (ROOT / "errors.py").read_text(encoding="utf-8")


async def test_collaborators_never_call_back_into_the_manager() -> None:
    """architecture.md: "collaborators … take a Sandbox and their own collaborators, never the
    manager" and "a call travels one way": no collaborator (the warm pool included) holds a
    callable bound to the manager."""
    manager = SandboxManager(FakeDocker(), config=parse_config({}))
    held = []
    for name in ("pool", "launcher", "runs", "files", "installs", "networks"):
        part = getattr(manager, name)
        for attr, value in vars(part).items():
            if getattr(value, "__self__", None) is manager:
                held.append(f"{name}.{attr} -> SandboxManager.{value.__name__}")
    assert held == []


async def test_the_route_one_frame_out_one_frame_back_per_run() -> None:
    """architecture.md, step 4: a run is one frame out (and one back); a launch is create →
    attach → start → hello, in that order."""
    async with running() as (docker, manager):
        box = await manager.create_sandbox("python")
        order = [c for c in docker.calls if c in ("create_container", "attach", "start_container")]
        guest = docker.guest(box.container_id)
        sent = len(guest.requests)
        await manager.execute(box.sandbox_id, "print(1)")
        frames = guest.requests[sent:]
    assert order[-3:] == ["create_container", "attach", "start_container"]
    assert [f["op"] for f in frames] == ["run"]


async def test_one_tool_called_event_per_call_even_when_the_sandbox_is_lost() -> None:
    """architecture.md, step 6: one ``tool.called`` event per tool call, a lost and replaced
    sandbox included."""
    hold = Hold()
    async with running(FakeDocker(handler=hold)) as (docker, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(language="python", code="print(1)"))["sandbox_id"]
        with capture_events() as events:
            call = asyncio.ensure_future(
                tools.code_execute(language="python", code="hold", sandbox_id=sid)
            )
            await hold.until_held(call)
            cid = container_of(docker, sid)
            assert cid is not None
            docker.kill(cid)
            result = await call
    assert result["status"] == "lost"
    assert [e["event"] for e in events].count("tool.called") == 1


# ---------------------------------------------------------------------------------------------
# 4. harombe.testing as a user meets it
# ---------------------------------------------------------------------------------------------


def _docstring_example() -> str:
    doc = harombe.testing.__doc__ or ""
    example = doc.split("Example::", 1)[1]
    return textwrap.dedent(example.strip("\n")).replace("\\\\n", "\\n")


async def test_the_testing_docstring_example_runs_as_written() -> None:
    """The example in harombe/testing/__init__.py's docstring passes as written (its default
    config included), and leaves no container or task behind."""
    before = _tasks()
    scope: dict[str, Any] = {}
    exec(compile(_docstring_example(), "<harombe.testing example>", "exec"), scope)
    await scope["test_my_agent_reports_failures"]()
    assert await _leaked(before) == []


async def test_a_fake_fault_of_cancellation_is_refused_or_not_read_as_stop() -> None:
    """FakeDocker.fail takes any BaseException; a CancelledError raised by a Docker call (which
    real Docker never raises while nobody cancels) must not make create_sandbox report that
    stop() ran: either fail() refuses it or the error is not STOPPED_DURING_CREATE."""
    async with running() as (docker, manager):
        try:
            docker.fail("create_container", asyncio.CancelledError())
        except HarombeError:
            return  # refused: fine
        outcome = (await asyncio.gather(manager.create_sandbox("python"),
                                        return_exceptions=True))[0]  # fmt: skip
        running_still = manager._started
    assert running_still
    assert not (isinstance(outcome, UsageError) and "stopped" in str(outcome)), str(outcome)


async def test_a_paused_pooled_sandbox_is_skipped_by_the_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pooled sandbox paused from outside (FakeDocker.pause) is not handed out: the claim's
    ping fails, and the caller gets a live, cold-started sandbox."""
    from harombe.security.runtime import launcher

    monkeypatch.setattr(launcher, "CLAIM_PING_TIMEOUT_S", 0.05)
    async with running(**_pooled()) as (docker, manager):
        await manager.wait_pool_settled()
        (waiting,) = docker.containers.values()
        docker.pause(waiting.id)
        box = await manager.create_sandbox("python")
        result = await manager.execute(box.sandbox_id, "print(3)")
        await manager.wait_pool_settled()
    assert box.container_id != waiting.id
    assert (result.success, result.stdout) == (True, "3\n")

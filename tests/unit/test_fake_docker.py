"""harombe.testing's FakeDocker and FakeGuest: a DockerBackend and a supervisor, no Docker."""

from __future__ import annotations

import ast
import asyncio
import io
import tarfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.config import DEFAULT_IMAGE
from harombe.errors import (
    DockerUnavailableError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxLostError,
    UsageError,
)
from harombe.security.guest.wire import FrameDecoder, encode
from harombe.security.runtime.backend import DockerBackend, Stdio
from harombe.testing import FakeDocker, FakeGuest, FakeStdio, RunOutcome, code_of, echo_handler

GUEST = Path(__file__).resolve().parents[2] / "harombe" / "security" / "guest"
Frame = tuple[dict[str, Any], bytes]


class Wire:
    """The host's end of one fake container: send requests, read frames."""

    def __init__(self, stdio: FakeStdio) -> None:
        self.stdio = stdio
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []

    async def send(self, msg: dict[str, Any], blob: bytes = b"") -> None:
        await self.stdio.write(encode(msg, blob))

    async def next(self) -> Frame:
        while not self.frames:
            item = await asyncio.wait_for(self.stdio.read(), 5)
            assert item is not None, "the output ended"
            self.frames += self.decoder.feed(item[1])
        return self.frames.pop(0)

    async def ask(self, msg: dict[str, Any], blob: bytes = b"") -> Frame:
        await self.send(msg, blob)
        return await self.next()


async def started(docker: FakeDocker, guest: FakeGuest | None = None) -> tuple[str, Wire]:
    """A started container (with ``guest`` if given), attached; its hello already read."""
    if guest is not None:
        docker.guest_factory = lambda: guest
    cid = await docker.create_container(image=DEFAULT_IMAGE, name=None, runtime="runsc")
    wire = Wire(await docker.attach(cid))
    await docker.start_container(cid)
    hello, _ = await wire.next()
    assert hello["op"] == "hello"
    return cid, wire


def run_msg(rid: int, code: str = "", **extra: Any) -> dict[str, Any]:
    return {"op": "run", "id": rid, "argv": ["bash", "-c", code, "bash"], "timeout_s": 30,
            "max_output_bytes": 1 << 20, "max_memory_mb": 512, **extra}  # fmt: skip


# The fake as a DockerBackend.


def test_fake_docker_is_a_docker_backend() -> None:
    """FakeDocker satisfies the protocol the runtime is written against, and so does its stdio."""
    fake = FakeDocker()
    assert isinstance(fake, DockerBackend)
    box: DockerBackend = fake  # what mypy checks in harombe/testing/docker.py
    assert box.started is False


async def test_every_call_before_start_is_refused_like_the_real_one() -> None:
    """Until start(), calls fail with the guide's 'Docker manager not started' UsageError."""
    fake = FakeDocker()
    with pytest.raises(UsageError, match="Docker manager not started"):
        await fake.runtimes()
    await fake.start()
    assert "runsc" in await fake.runtimes()
    await fake.stop()
    assert fake.started is False


async def test_images_are_names_and_unknown_ones_are_not_found(docker: FakeDocker) -> None:
    """image_id knows the configured names; an unknown one is ImageNotFoundError; tags add names."""
    assert (await docker.image_id(DEFAULT_IMAGE)).startswith("sha256:")
    with pytest.raises(ImageNotFoundError):
        await docker.image_id("nope:latest")
    assert await docker.image_exists("nope:latest") is False
    await docker.tag_image(DEFAULT_IMAGE, "mine", "v1")
    assert await docker.image_exists("mine:v1")
    with pytest.raises(ImageNotFoundError):
        await docker.tag_image("absent:1", "x", "y")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"image": "absent:1", "runtime": "runsc"}, ImageNotFoundError),
        ({"image": DEFAULT_IMAGE, "runtime": "runc-unknown"}, RuntimeNotAvailableError),
    ],
    ids=["unknown-image", "unregistered-runtime"],
)
async def test_create_refuses_what_docker_refuses(
    docker: FakeDocker, spec: dict[str, Any], error: type[Exception]
) -> None:
    """A create names the missing image or runtime, and makes nothing."""
    with pytest.raises(error):
        await docker.create_container(**spec)
    assert docker.containers == {}


async def test_a_container_name_is_taken_until_removed(docker: FakeDocker) -> None:
    """As in Docker, two containers cannot share a name; removal frees it."""
    cid = await docker.create_container(image=DEFAULT_IMAGE, name="harombe-x")
    with pytest.raises(DockerUnavailableError, match="already in use"):
        await docker.create_container(image=DEFAULT_IMAGE, name="harombe-x")
    await docker.remove_container(cid)
    await docker.create_container(image=DEFAULT_IMAGE, name="harombe-x")


async def test_list_containers_filters_by_labels_like_docker(docker: FakeDocker) -> None:
    """Every label must match; an empty value matches any value of that key."""
    a = await docker.create_container(image=DEFAULT_IMAGE, labels={"k": "1", "o": "a"})
    b = await docker.create_container(image=DEFAULT_IMAGE, labels={"k": "2", "o": "a"})
    await docker.create_container(image=DEFAULT_IMAGE, labels={"o": "b"})
    assert {c.id for c in await docker.list_containers({"k": "1"})} == {a}
    assert {c.id for c in await docker.list_containers({"k": "", "o": "a"})} == {a, b}
    assert await docker.list_containers({"k": "3"}) == []


async def test_remove_container_is_idempotent_and_ends_the_guest(docker: FakeDocker) -> None:
    """Removing twice is fine; the container's output ends and its state is gone."""
    cid, wire = await started(docker)
    await docker.remove_container(cid)
    await docker.remove_container(cid)
    assert await wire.stdio.read() is None
    with pytest.raises(SandboxLostError):
        await docker.container_state(cid)


@pytest.mark.parametrize(
    ("fault", "state"),
    [
        (lambda d, c: d.kill(c), {"Status": "exited", "Running": False, "ExitCode": 137}),
        (lambda d, c: d.kill(c, oom=True), {"OOMKilled": True, "Running": False}),
        (lambda d, c: d.kill(c, exit_code=3), {"Status": "exited", "ExitCode": 3}),
        (lambda d, c: d.pause(c), {"Status": "paused", "Paused": True, "Running": True}),
    ],
    ids=["killed", "oom-killed", "exited-3", "paused"],
)
async def test_faults_show_in_the_container_state(
    docker: FakeDocker, fault: Callable[[FakeDocker, str], None], state: dict[str, Any]
) -> None:
    """kill() and pause() leave the State Docker would report."""
    cid, _ = await started(docker)
    fault(docker, cid)
    got = await docker.container_state(cid)
    assert {k: got[k] for k in state} == state


async def test_a_running_container_pid_is_never_a_host_process(docker: FakeDocker) -> None:
    """Pid is above Linux's largest pid, so nothing on the host is ever touched through it."""
    cid, _ = await started(docker)
    pid = (await docker.container_state(cid))["Pid"]
    assert pid >= 4_194_304 and not await asyncio.to_thread(Path(f"/proc/{pid}").exists)


async def test_killed_container_ends_its_stdio(docker: FakeDocker) -> None:
    """After kill(), reads end and writes raise SandboxLostError, as a dead attach does."""
    cid, wire = await started(docker)
    docker.kill(cid)
    assert await wire.stdio.read() is None
    with pytest.raises(SandboxLostError):
        await wire.send({"op": "ping", "id": 1})


async def test_fail_raises_for_the_next_n_calls_only(docker: FakeDocker) -> None:
    """fail() is a fault for the next N calls of one method; the rest are untouched."""
    docker.fail("list_containers", DockerUnavailableError("away"), times=2)
    for _ in range(2):
        with pytest.raises(DockerUnavailableError, match="away"):
            await docker.list_containers({})
    assert await docker.list_containers({}) == []
    assert docker.calls.count("list_containers") == 3
    with pytest.raises(UsageError):
        docker.fail("no_such_method", DockerUnavailableError("x"))


async def test_networks_are_listed_by_label_and_removed_once_unused(docker: FakeDocker) -> None:
    """A network with a running container stays (as in Docker); an absent one is no error."""
    net_id, gateway = await docker.create_network("net-a", labels={"harombe.network": "s"})
    assert gateway.endswith(".1") and (await docker.network_bridge(net_id)).startswith("br-")
    assert [n for n, _ in await docker.list_networks({"harombe.network": ""})] == [net_id]
    cid = await docker.create_container(image=DEFAULT_IMAGE, network_mode="net-a")
    await docker.start_container(cid)
    assert (await docker.container_address(cid, "net-a")).endswith(".2")
    with pytest.raises(DockerUnavailableError, match="active endpoints"):
        await docker.remove_network(net_id)
    await docker.remove_container(cid)
    await docker.remove_network(net_id)
    await docker.remove_network(net_id)
    assert docker.networks == {}


# The guest's side of the wire protocol.


def _dict_keys(path: Path, function: str) -> set[str]:
    """The string keys of the dict literals in ``function`` of a guest source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return {
        k.value
        for d in ast.walk(fn)
        if isinstance(d, ast.Dict)
        for k in d.keys
        if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


async def test_hello_carries_the_supervisors_fields(docker: FakeDocker) -> None:
    """The greeting has every field of the real supervisor's hello(), interpreters included."""
    cid, _ = await started(docker)
    info = docker.guest(cid).info
    assert set(info) == _dict_keys(GUEST / "supervisor.py", "hello")
    assert all(info["interpreters"][name] for name in ("python3", "node", "bash"))


async def test_done_carries_the_supervisors_fields(docker: FakeDocker) -> None:
    """A run's reply has every field of the real send_done() and Output.fields()."""
    _, wire = await started(docker)
    reply, _ = await wire.ask(run_msg(7, "echo hi"))
    real = _dict_keys(GUEST / "supervisor_runs.py", "send_done")
    real |= _dict_keys(GUEST / "supervisor_runs.py", "fields")
    assert real <= set(reply) and reply["id"] == 7 and reply["op"] == "done"


async def test_a_session_done_carries_the_session_fields(docker: FakeDocker) -> None:
    """A session run's reply has the keywords the real SessionRun.report() adds."""
    tree = ast.parse((GUEST / "supervisor_sessions.py").read_text(encoding="utf-8"))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.send_done"
    ]
    real = {k.arg for call in calls for k in call.keywords if k.arg}
    _, wire = await started(docker)
    msg = {**run_msg(8), "session": True, "language": "python"}
    reply, _ = await wire.ask(msg, b"1")
    assert real and real <= set(reply) and reply["session"] is True


@pytest.mark.parametrize(
    ("msg", "reply"),
    [
        ({"op": "ping"}, {"op": "result", "ok": True}),
        ({"op": "warm", "language": "python"}, {"op": "result", "ok": True}),
        ({"op": "cancel", "target": 99}, {"op": "result", "ok": True}),
        ({"op": "nonsense"}, {"op": "result", "ok": False, "error": "UnknownOp"}),
    ],
    ids=["ping", "warm", "cancel-nothing", "unknown-op"],
)
async def test_simple_ops_are_answered_with_the_request_id(
    docker: FakeDocker, msg: dict[str, Any], reply: dict[str, Any]
) -> None:
    """Each request gets a ``result`` carrying its own id."""
    _, wire = await started(docker)
    got, _ = await wire.ask({**msg, "id": 41})
    assert got["id"] == 41 and {k: got[k] for k in reply} == reply


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "exit_code"),
    [
        ("print('hi')\nprint(1, 2)", "hi\n1 2\n", "", 0),
        ("import sys\nprint('e', file=sys.stderr)\nexit(4)", "", "e\n", 4),
        ("raise ValueError('bad')", "", "Traceback (most recent call last):\nValueError: bad\n", 1),
        ("print(x)  # not a literal: ignored", "", "", 0),
        ("def broken(:", "", "SyntaxError: invalid syntax\n", 1),
    ],
    ids=["prints", "stderr-and-exit", "raise", "non-literal", "syntax-error"],
)
def test_echo_handler_python(code: str, stdout: str, stderr: str, exit_code: int) -> None:
    """The default handler's Python: literal prints, exit codes, raises; the rest is ignored."""
    outcome = echo_handler({"argv": ["python3", "-"]}, code.encode())
    assert (outcome.stdout, outcome.stderr, outcome.exit_code) == (stdout, stderr, exit_code)


@pytest.mark.parametrize(
    ("msg", "stdin", "stdout", "exit_code", "result"),
    [
        ({"argv": ["bash", "-c", "echo a b\necho e >&2\nexit 2"]}, b"", "a b\n", 2, None),
        ({"argv": ["node", "-"]}, b"console.log('js');\nprocess.exit(5);", "js\n", 5, None),
        ({"session": True, "language": "python"}, b"print('s')\n6 * 7\n42", "s\n", 0, "42"),
        ({"argv": ["python3", "-m", "pip", "install", "six"]}, b"", "", 0, None),
    ],
    ids=["shell", "javascript", "session-result", "other-program"],
)
def test_echo_handler_languages(
    msg: dict[str, Any], stdin: bytes, stdout: str, exit_code: int, result: str | None
) -> None:
    """Shell echo/exit, JavaScript console.log/process.exit, a session's last literal."""
    outcome = echo_handler(msg, stdin)
    assert (outcome.stdout, outcome.exit_code, outcome.result) == (stdout, exit_code, result)


async def test_run_output_is_capped_and_streamed_before_done(docker: FakeDocker) -> None:
    """With ``stream``, ``out`` frames come first; output past max_output_bytes is counted only."""
    _, wire = await started(docker)
    await wire.send(run_msg(3, "echo one\necho two\necho three", stream=True, max_output_bytes=8))
    frames = [await wire.next() for _ in range(3)]
    assert [(m["op"], m["stream"], b) for m, b in frames[:2]] == [
        ("out", "stdout", b"one\n"),
        ("out", "stdout", b"two\n"),
    ]
    done, blob = frames[2]
    assert done["op"] == "done" and blob == b"one\ntwo\n"
    assert (done["stdout_len"], done["stdout_total"]) == (8, 14)


async def test_handler_gets_the_request_and_its_blob(docker: FakeDocker) -> None:
    """A replacing handler sees the run request and the code it carries."""
    seen: list[str] = []

    def handler(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        seen.append(code_of(msg, stdin))
        return RunOutcome(stdout=b"\xff", status="oom", exit_code=137)

    _, wire = await started(docker, FakeGuest(handler))
    done, blob = await wire.ask({**run_msg(1), "argv": ["python3", "-"]}, b"x = 1")
    assert seen == ["x = 1"] and blob == b"\xff"
    assert (done["status"], done["exit_code"], done["signal"]) == ("oom", 137, 9)


async def test_cancel_ends_the_run_and_a_second_run_is_busy(docker: FakeDocker) -> None:
    """While a run hangs a second one is refused as Busy; cancel ends the first as cancelled."""
    entered = asyncio.Event()

    async def hang(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("never")

    _, wire = await started(docker, FakeGuest(hang))
    await wire.send(run_msg(1))
    await entered.wait()
    busy, _ = await wire.ask(run_msg(2))
    assert (busy["id"], busy["ok"], busy["error"]) == (2, False, "Busy")
    await wire.send({"op": "cancel", "target": 1, "id": 0})
    replies = {msg["id"]: msg for msg, _ in [await wire.next(), await wire.next()]}
    assert replies[0]["ok"] is True
    assert (replies[1]["op"], replies[1]["status"], replies[1]["exit_code"]) == (
        "done",
        "cancelled",
        143,
    )


async def test_a_run_past_its_timeout_is_reported_as_timeout(docker: FakeDocker) -> None:
    """The guest enforces ``timeout_s`` as the supervisor does: status timeout, SIGTERM's code."""

    async def hang(msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        await asyncio.Event().wait()
        raise AssertionError("never")

    _, wire = await started(docker, FakeGuest(hang))
    done, _ = await wire.ask(run_msg(1, timeout_s=0.01))
    assert (done["status"], done["exit_code"]) == ("timeout", 143)


async def test_paused_guest_answers_after_unpause(docker: FakeDocker) -> None:
    """A paused container answers nothing; its answers come once it is unpaused."""
    cid, wire = await started(docker)
    docker.pause(cid)
    await wire.send({"op": "ping", "id": 5})
    read = asyncio.ensure_future(wire.next())
    await asyncio.sleep(0.01)
    assert not read.done()
    docker.unpause(cid)
    reply, _ = await read
    assert reply["id"] == 5


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(
    ("msg", "blob", "error"),
    [
        ({"op": "read", "path": "../etc/passwd", "max_bytes": 10}, b"", "WorkspacePathError"),
        ({"op": "write", "path": "a/../../x"}, b"x", "WorkspacePathError"),
        ({"op": "write", "path": "/etc/x"}, b"x", "WorkspacePathError"),
        ({"op": "read", "path": "missing", "max_bytes": 10}, b"", "FileNotFoundError"),
        ({"op": "read", "path": ".", "max_bytes": 10}, b"", "IsADirectoryError"),
        ({"op": "untar", "root": "/tmp/w"}, _tar({"../up": b"x"}), "WorkspacePathError"),
        ({"op": "untar", "root": "/tmp/w"}, b"not a tar", "TarError"),
    ],
    ids=["read-above", "write-above", "absolute", "missing", "directory", "tar-escape", "not-tar"],
)
async def test_file_requests_refused_like_the_supervisor(
    docker: FakeDocker, msg: dict[str, Any], blob: bytes, error: str
) -> None:
    """Refusals come back as ``ok: false`` with the supervisor's error kind."""
    _, wire = await started(docker)
    reply, _ = await wire.ask({"root": "/workspace", **msg, "id": 9}, blob)
    assert (reply["id"], reply["ok"], reply["error"]) == (9, False, error)


async def test_files_are_written_read_listed_and_untarred(docker: FakeDocker) -> None:
    """write/read/list/untar work on a dict the test can inspect and seed."""
    cid, wire = await started(docker)
    ws = {"root": "/workspace"}
    written, _ = await wire.ask({**ws, "op": "write", "path": "d/./a.txt", "id": 1}, b"abc")
    assert written["bytes"] == 3
    docker.guest(cid).files["/workspace/d/b.bin"] = b"\x00"
    read, data = await wire.ask(
        {**ws, "op": "read", "path": "d/../d/a.txt", "max_bytes": 9, "id": 2}
    )
    assert (read["ok"], data) == (True, b"abc")
    listed, _ = await wire.ask({**ws, "op": "list", "path": "d", "id": 3})
    assert [(e["name"], e["type"], e["size"]) for e in listed["entries"]] == [
        ("a.txt", "file", 3),
        ("b.bin", "file", 1),
    ]
    untar, _ = await wire.ask({"op": "untar", "root": "/tmp/w", "id": 4}, _tar({"p/q.py": b"q"}))
    assert untar["members"] == 1 and docker.guest(cid).files["/tmp/w/p/q.py"] == b"q"


async def test_stdio_is_the_protocol_type(docker: FakeDocker) -> None:
    """attach() returns a Stdio; a closed one reads as ended."""
    cid = await docker.create_container(image=DEFAULT_IMAGE)
    stdio = await docker.attach(cid)
    assert isinstance(stdio, Stdio)
    stdio.close()
    assert await stdio.read() is None


async def test_the_documented_example_runs() -> None:
    """The example in harombe.testing's docstring works as written."""
    import harombe.testing

    example = textwrap.dedent((harombe.testing.__doc__ or "").split("Example::", 1)[1])
    namespace: dict[str, Any] = {}
    exec(compile(example, "harombe.testing example", "exec"), namespace)
    await namespace["test_my_agent_reports_failures"]()


async def test_a_run_cancelled_in_the_same_breath_is_still_reported(docker: FakeDocker) -> None:
    """A cancel that arrives before the run has begun still gets the run its ``done``."""
    _, wire = await started(docker)
    await wire.stdio.write(
        encode(run_msg(1, "echo x")) + encode({"op": "cancel", "target": 1, "id": 0})
    )
    replies = {msg["id"]: msg for msg, _ in [await wire.next(), await wire.next()]}
    assert replies[1]["status"] == "cancelled" and replies[0]["ok"] is True

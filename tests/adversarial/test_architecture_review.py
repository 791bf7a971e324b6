"""Review probes of the layered architecture, without Docker: the Docker seam and its error
table, the architecture guards, FakeDocker against the real backend, the wire codec as the host
reads it, config honesty, the streaming tool's parameters, and the manager's composition.

Each probe states the behaviour that should hold. Some guard claims that hold today; the others
show a defect (see each docstring).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import textwrap
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import docker.errors
import pytest
import requests
import requests.exceptions

from harombe.config import DEFAULT_IMAGE, parse_config
from harombe.errors import (
    ConfigError,
    DockerUnavailableError,
    HarombeError,
    ImageNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
    UsageError,
)
from harombe.security.approval.gate import HITLGate
from harombe.security.guest.wire import HEADER, MAX_JSON_BYTES, FrameDecoder, ProtocolError
from harombe.security.runtime import packages
from harombe.security.runtime.channel import Channel
from harombe.security.runtime.docker import DockerManager, translate
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import FakeDocker, FakeGuest, ScriptedApprover
from harombe.tools.code_execution import CodeExecutionTools
from tests.unit import test_architecture as arch
from tests.unit.fake_manager import Hold, config, container_of, running

# ---------------------------------------------------------------------------------------------
# 1. The Docker seam: DockerManager over a stand-in SDK client (no daemon)
# ---------------------------------------------------------------------------------------------


def _api_error(status: int, text: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(text, response=response, explanation=text)


def _manager_with(client: mock.MagicMock) -> DockerManager:
    """A DockerManager whose SDK client is ``client`` (what start() would have made)."""
    manager = DockerManager("unix:///nonexistent/docker.sock")
    manager._client = client
    manager._pool = ThreadPoolExecutor(2, thread_name_prefix="review-docker")
    return manager


async def test_remove_container_removes_even_when_the_unpause_conflicts() -> None:
    """remove_container removes a container that was paused at inspect even when the unpause
    answers 409 (it was unpaused meanwhile): a 409 from unpause is not 'another removal'."""
    client = mock.MagicMock()
    client.api.inspect_container.return_value = {"State": {"Paused": True}}
    client.api.unpause.side_effect = _api_error(409, "Container abc is not paused")
    manager = _manager_with(client)
    try:
        await manager.remove_container("abc")
    finally:
        await manager.stop()
    assert client.api.remove_container.called, "the container was never removed"


async def test_import_image_refuses_a_missing_archive_before_asking_docker(tmp_path: Path) -> None:
    """import_image of an archive that does not exist fails before any Docker call (the SDK
    would send a missing path to the daemon as a URL to download), with an error that is not
    'Docker unavailable'."""
    client = mock.MagicMock()
    client.images.get.return_value.id = "sha256:feed"
    manager = _manager_with(client)
    try:
        with pytest.raises(HarombeError) as caught:
            await manager.import_image(tmp_path / "missing.tar", repository="r", tag="t")
    finally:
        await manager.stop()
    assert not client.api.import_image_from_file.called
    assert not isinstance(caught.value, DockerUnavailableError)


async def test_a_missing_network_at_start_is_not_reported_as_a_gone_container() -> None:
    """A start that fails because the container's network is missing does not say the
    container is gone (it is still there, created): the 404 is about the network."""
    client = mock.MagicMock()
    client.api.start.side_effect = docker.errors.NotFound(
        '404 Client Error: Not Found ("network harombe-net-x not found")'
    )
    manager = _manager_with(client)
    try:
        with pytest.raises(HarombeError) as caught:
            await manager.start_container("abc")
    finally:
        await manager.stop()
    assert "container is gone" not in str(caught.value), str(caught.value)


FOREIGN_ERRORS: list[tuple[BaseException, type[HarombeError]]] = [
    (docker.errors.ImageNotFound("No such image: x"), ImageNotFoundError),
    (requests.exceptions.ConnectionError("refused"), DockerUnavailableError),
    (requests.exceptions.ReadTimeout("slow"), DockerUnavailableError),
    (requests.exceptions.ConnectTimeout("slow"), DockerUnavailableError),
    (requests.exceptions.ChunkedEncodingError("cut"), DockerUnavailableError),
    (requests.exceptions.JSONDecodeError("bad", "doc", 0), DockerUnavailableError),
    (_api_error(500, "boom"), DockerUnavailableError),
    (docker.errors.InvalidArgument("bad"), DockerUnavailableError),
    (BrokenPipeError(32, "pipe"), DockerUnavailableError),
    (TimeoutError("t"), DockerUnavailableError),
    (EOFError("eof"), DockerUnavailableError),
    (asyncio.IncompleteReadError(b"", 8), DockerUnavailableError),
]
FOREIGN_IDS = [
    "image-not-found", "requests-connection", "read-timeout", "connect-timeout",
    "chunked-encoding", "json-decode", "api-500", "invalid-argument", "broken-pipe",
    "timeout", "eof", "incomplete-read",
]  # fmt: skip


@pytest.mark.parametrize(("exc", "kind"), FOREIGN_ERRORS, ids=FOREIGN_IDS)
def test_translate_maps_foreign_errors_to_harombe_errors(
    exc: BaseException, kind: type[HarombeError]
) -> None:
    """Every Docker, requests or socket error the SDK can raise becomes a harombe error."""
    assert isinstance(translate(exc, what="probing"), kind)


# ---------------------------------------------------------------------------------------------
# 1b. The architecture guards of tests/unit/test_architecture.py, fed with code that breaks them
# ---------------------------------------------------------------------------------------------


def _imports(tmp_path: Path, module: str, source: str) -> list[arch.Import]:
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return list(arch.imports_of(module, path))


def _runs_docker_cli(source: str) -> bool:
    """test_nothing_runs_the_docker_cli's check, applied to ``source``."""
    return bool(arch.docker_cli_lines(textwrap.dedent(source)))


IMPURE_POLICY = [
    "def f():\n    from os import path\n    return path\n",
    "import os.path\n",
    "import importlib\nclock = importlib.import_module('time')\n",
    "clock = __import__('time')\n",
    "def read(p):\n    return open(p).read()\n",
    "import uuid\nTOKEN = uuid.uuid4().hex\n",
]
IMPURE_IDS = [
    "from-os-in-function",
    "import-os-path",
    "importlib-time",
    "dunder-import",
    "builtin-open",
    "uuid4",
]


@pytest.mark.parametrize("source", IMPURE_POLICY, ids=IMPURE_IDS)
def test_the_policy_purity_guard_catches_io_and_clocks(tmp_path: Path, source: str) -> None:
    """test_policy_is_pure's check flags every way a policy module can reach I/O, a clock or
    randomness, not only a plain ``import os``."""
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    assert arch.impurities("harombe.security.policy.probe", path), "the guard lets this through"


DOCKER_CLI = [
    "import subprocess\nsubprocess.run(['docker', 'ps'])\n",
    "import asyncio\nasync def f():\n    await asyncio.create_subprocess_exec('docker', 'ps')\n",
    "import subprocess\nsubprocess.run('docker import x.tar', shell=True)\n",
    "import subprocess\nsubprocess.run(['/usr/bin/docker', 'ps'])\n",
    "import shutil, subprocess\nsubprocess.run([shutil.which('docker'), 'ps'])\n",
]
DOCKER_CLI_IDS = ["argv-list", "create-subprocess-exec", "shell-string", "absolute-path", "which"]


@pytest.mark.parametrize("source", DOCKER_CLI, ids=DOCKER_CLI_IDS)
def test_the_docker_cli_guard_catches_every_way_to_run_docker(source: str) -> None:
    """test_nothing_runs_the_docker_cli flags the docker program however it is started."""
    assert _runs_docker_cli(source), "the docker-CLI guard lets this through"


SEAM_BYPASSES = [
    ("harombe.security.runtime.pool", "import docker\n", ("docker", "requests")),
    ("harombe.security.runtime.pool", "import importlib\nsdk = importlib.import_module('docker')\n",
     ("docker", "requests")),
    ("harombe.security.policy.probe", "from harombe.tools import params\n", None),
    ("harombe.security.policy.probe",
     "import importlib\nparams = importlib.import_module('harombe.tools.params')\n", None),
]  # fmt: skip
SEAM_IDS = ["import-docker", "importlib-docker", "policy-imports-tools", "policy-importlib-tools"]


@pytest.mark.parametrize(("module", "source", "sdk"), SEAM_BYPASSES, ids=SEAM_IDS)
def test_the_seam_and_layer_guards_catch_dynamic_imports(
    tmp_path: Path, module: str, source: str, sdk: tuple[str, ...] | None
) -> None:
    """The one-Docker-seam and layer checks see an import however it is written."""
    found = _imports(tmp_path, module, source)
    if sdk is not None:
        assert any(imp.target.split(".")[0] in sdk for imp in found), "SDK import not seen"
    else:
        internal = [
            arch.resolve(i.target, arch.ALL) for i in found if i.target.startswith("harombe")
        ]
        assert any(arch.room(t) not in arch.ALLOWED["policy"] for t in internal), "not seen"


#: Standard-library modules that read the OS, randomness or run code, beyond arch.IMPURE.
ALSO_IMPURE = {"uuid", "importlib", "ctypes", "multiprocessing", "select", "selectors", "mmap",
               "fcntl", "http", "logging", "platform", "getpass"}  # fmt: skip
IMPURE_BUILTINS = {"open", "__import__", "input", "print", "exec", "eval"}


def test_policy_modules_draw_no_randomness_and_open_nothing() -> None:
    """No policy module imports a source of randomness or I/O (``uuid`` reads the OS's random
    source), nor calls ``open``/``__import__``/``input``/``print``: policy is pure."""
    bad = []
    for name, path in arch.ALL.items():
        if arch.room(name) != "policy":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for imp in arch.imports_of(name, path):
            if imp.target.split(".")[0] in ALSO_IMPURE:
                bad.append(f"{name}:{imp.line} imports {imp.target}")
        for node in ast.walk(tree):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Name) and called.id in IMPURE_BUILTINS:
                bad.append(f"{name}:{called.lineno} calls {called.id}()")
    assert bad == []


# ---------------------------------------------------------------------------------------------
# 2. FakeDocker against the real backend
# ---------------------------------------------------------------------------------------------


async def _fake() -> FakeDocker:
    fake = FakeDocker()
    await fake.start()
    return fake


async def test_fake_tag_gives_the_same_image_id() -> None:
    """As in Docker, a tag names the same image: its id is the source image's id."""
    fake = await _fake()
    await fake.tag_image(DEFAULT_IMAGE, "harombe/sandbox", "review")
    assert await fake.image_id("harombe/sandbox:review") == await fake.image_id(DEFAULT_IMAGE)


async def test_fake_start_refuses_a_container_whose_network_is_missing() -> None:
    """As in Docker (404 'network … not found' at start), a container whose network_mode
    names no network does not start."""
    fake = await _fake()
    cid = await fake.create_container(image=DEFAULT_IMAGE, network_mode="harombe-net-gone")
    with pytest.raises(HarombeError):
        await fake.start_container(cid)


async def test_fake_import_image_refuses_a_missing_archive(tmp_path: Path) -> None:
    """import_image of an archive that does not exist fails, as it must with the real daemon."""
    fake = await _fake()
    with pytest.raises(HarombeError):
        await fake.import_image(tmp_path / "missing.tar", repository="r", tag="t")


FAKE_MISSING: list[tuple[str, Callable[[FakeDocker], Any]]] = [
    ("container_state", lambda d: d.container_state("0" * 64)),
    ("start_container", lambda d: d.start_container("0" * 64)),
    ("attach", lambda d: d.attach("0" * 64)),
    ("container_address", lambda d: d.container_address("0" * 64, "n")),
]


@pytest.mark.parametrize(("method", "call"), FAKE_MISSING, ids=[m for m, _ in FAKE_MISSING])
async def test_fake_calls_on_a_missing_container_raise_sandbox_lost(
    method: str, call: Callable[[FakeDocker], Any]
) -> None:
    """The backend protocol: a missing container is SandboxLostError (the live probes check the
    real DockerManager against the same rule)."""
    fake = await _fake()
    with pytest.raises(SandboxLostError):
        await call(fake)


# ---------------------------------------------------------------------------------------------
# 3. The wire codec, as the host reads what a sandbox sends
# ---------------------------------------------------------------------------------------------


def _frame(json_text: bytes, blob: bytes = b"") -> bytes:
    return HEADER.pack(len(json_text), len(blob)) + json_text + blob


HOSTILE_FRAMES = [
    _frame(b'{"id":1,"x":' + b"1" * 10**6 + b"}"),
    _frame(b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    _frame(b'{"a":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"),
    _frame(b'{"id":1,"x":NaN,"y":-Infinity}'),
    _frame(b'{"id":1,"id":2}'),
    _frame(b'{"id":1,"x":"\xff\xfe"}'),
    _frame(b'{"id":1,"x":"\\ud800"}'),
    _frame(b"[1,2,3]"),
    _frame(b'"text"'),
    _frame(b"{} trailing"),
    _frame(b""),
    HEADER.pack(0xFFFFFFFF, 0xFFFFFFFF) + b"{}",
    HEADER.pack(2, MAX_JSON_BYTES * 100) + b"{}",
]
HOSTILE_IDS = [
    "million-digit-int", "deep-list", "deep-object", "nan-infinity", "duplicate-keys",
    "invalid-utf8", "lone-surrogate", "array", "string", "trailing-data", "empty",
    "header-4gib", "header-huge-blob",
]  # fmt: skip


@pytest.mark.parametrize("data", HOSTILE_FRAMES, ids=HOSTILE_IDS)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])
def test_the_host_decoder_ends_hostile_frames_as_protocol_errors(data: bytes, split: bool) -> None:
    """A hostile frame is a ProtocolError or a decoded dict, never another exception; fed one
    byte at a time it decodes the same way, and a huge header is refused from the header."""
    decoder = FrameDecoder()
    chunks = [data[i : i + 1] for i in range(min(len(data), 4096))] if split else [data]
    if split and len(data) > 4096:
        chunks.append(data[4096:])
    try:
        frames = [frame for chunk in chunks for frame in decoder.feed(chunk)]
    except ProtocolError:
        with pytest.raises(ProtocolError):  # whole, it is refused too
            FrameDecoder().feed(data)
        return
    assert all(type(msg) is dict for msg, _ in frames)
    assert decoder.buffered <= MAX_JSON_BYTES
    # One byte at a time decodes as whole (compared by repr: NaN is not equal to itself).
    assert repr(frames) == repr(FrameDecoder().feed(data))


def test_one_capped_frame_costs_the_host_bounded_memory() -> None:
    """Decoding one frame within the caps costs the host at most a few times the frame: a
    sandbox's 8 MiB of ``[{},{},…]`` must not become hundreds of megabytes on the host."""
    body = b'{"a":[' + b",".join([b"{}"] * ((MAX_JSON_BYTES - 16) // 3)) + b"]}"
    data = _frame(body)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with contextlib.suppress(ProtocolError):
            decoder.feed(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 8 * MAX_JSON_BYTES, f"{peak / 2**20:.0f} MiB for one {len(data) >> 20} MiB frame"


class _Stdio:
    """Stdio that plays back ``chunks`` and then ends."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        for chunk in chunks:
            self._queue.put_nowait((1, chunk))
        self.closed = False

    async def read(self) -> tuple[int, bytes] | None:
        return None if self.closed else await self._queue.get()

    async def write(self, data: bytes) -> None:
        if self.closed:
            raise SandboxLostError("closed")

    def close(self) -> None:
        self.closed = True
        self._queue.put_nowait(None)


@pytest.mark.parametrize("data", HOSTILE_FRAMES[:3] + HOSTILE_FRAMES[5:6] + HOSTILE_FRAMES[7:],
                         ids=HOSTILE_IDS[:3] + HOSTILE_IDS[5:6] + HOSTILE_IDS[7:])  # fmt: skip
async def test_a_hostile_frame_ends_the_channel_as_a_lost_sandbox(data: bytes) -> None:
    """A frame out of protocol ends the channel: waiting and later requests get
    SandboxLostError, the read loop ends, nothing else escapes."""
    stdio = _Stdio([data])
    channel = Channel(stdio, sandbox_id="sandbox-0123456789ab")
    for _ in range(50):
        if channel.lost:
            break
        await asyncio.sleep(0.01)
    assert channel.lost and "protocol" in channel.lost
    with pytest.raises(SandboxLostError):
        await channel.request({"op": "ping"}, timeout_s=1)
    await channel.close()


_DONE = (
    '"op":"done","id":%d,"status":"ok","exit_code":0,"signal":null,"stdout_len":0,'
    '"stderr_len":0,"stdout_total":0,"stderr_total":0,"duration_s":0.1,"cpu_s":0.0,'
    '"peak_memory_mb":1.0'
)
FORGED_DONE = [
    _DONE.replace('"exit_code":0', '"exit_code":NaN'),
    _DONE.replace('"stdout_total":0', '"stdout_total":1e999'),
    _DONE.replace('"stdout_len":0,', ""),
    _DONE.replace('"stdout_len":0', '"stdout_len":"x"'),
    _DONE + ',"warnings":7',
    _DONE.replace('"cpu_s":0.0', '"cpu_s":"fast"'),
    _DONE.replace('"exit_code":0', '"exit_code":null').replace('"ok"', '"error"'),
]
FORGED_IDS = [
    "nan-exit-code", "infinite-total", "missing-stdout-len", "text-length", "int-warnings",
    "text-cpu", "null-exit-code",
]  # fmt: skip


class _Forger(FakeGuest):
    """A guest whose every run ends with the ``done`` reply ``body`` (``%d``: the run's id)."""

    body = ""

    def _report(self, rid: int, msg: dict[str, Any], outcome: Any, took_s: float) -> None:
        text = ("{" + (self.body % rid) + "}").encode()
        self.send_raw(_frame(text))


@pytest.mark.parametrize("body", FORGED_DONE, ids=FORGED_IDS)
async def test_a_malformed_done_reply_never_raises_out_of_the_tools(body: str) -> None:
    """The tools never raise for what a sandbox sends: a ``done`` reply with wrong types,
    non-finite numbers or missing fields is a failed (or lost) result, not a raw ValueError,
    KeyError, TypeError or OverflowError from result mapping."""
    forger = type("Forger", (_Forger,), {"body": body})
    async with running(FakeDocker(guest_factory=forger)) as (_, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        result = await tools.code_execute(language="python", code="print(1)")
    assert result["success"] is False


# ---------------------------------------------------------------------------------------------
# 4. Config honesty
# ---------------------------------------------------------------------------------------------

BAD_USERS = ["", "0:0", "0", "root", "1000:x", "-1:-1", "1000:1000:1000", " 1000:1000"]
BAD_USER_IDS = ["empty", "root-ids", "root-uid", "name", "text-gid", "negative", "three",
                "space"]  # fmt: skip


@pytest.mark.parametrize("user", BAD_USERS, ids=BAD_USER_IDS)
def test_sandbox_user_must_be_a_non_root_uid_gid(user: str) -> None:
    """security.sandbox.user is documented as the uid:gid user code runs as, apart from the
    root supervisor: an empty value (the supervisor then runs user code as itself, root),
    root, a name or a malformed pair is refused with a ConfigError."""
    with pytest.raises(ConfigError):
        parse_config({"security": {"sandbox": {"user": user}}})


def _registries(pypi: list[str]) -> dict[str, Any]:
    return {"security": {"sandbox": {"network": {"allowed_registries": {"pypi": pypi}}}}}


BAD_REGISTRIES = [
    ["--index-url=https://evil.example/simple"],
    ["https://mirror.example/simple --trusted-host evil.example"],
    ["https://mirror.example/simple\n--index-url=https://evil.example"],
    ["ftp://mirror.example/simple"],
    ["file:///etc/passwd"],
    ["mirror.example/simple"],
    ["https:///simple"],
    ["https://" + "a" * 200_000 + ".example/simple"],
    [f"https://mirror{i}.example/simple" for i in range(5_000)],
]
BAD_REGISTRY_IDS = [
    "option", "space-option", "newline", "ftp", "file", "no-scheme", "no-host", "200kB-url",
    "5000-entries",
]  # fmt: skip


@pytest.mark.parametrize("urls", BAD_REGISTRIES, ids=BAD_REGISTRY_IDS)
def test_allowed_registries_refuses_what_pip_cannot_use(urls: list[str]) -> None:
    """Registry URLs that are not one plain http(s) URL, or that cannot reach pip at all (one
    environment string is capped at 128 KiB by Linux: a 200 kB URL, or 5,000 extra indexes
    joined into PIP_EXTRA_INDEX_URL, fail every install), are refused at load."""
    with pytest.raises(ConfigError):
        parse_config(_registries(urls))


WRONG_CONFIGS: list[Any] = [
    {"security": {}},
    "config/harombe.yaml",
    Path("config/harombe.yaml"),
    parse_config({}).security.sandbox,
]


@pytest.mark.parametrize("value", WRONG_CONFIGS, ids=["dict", "str-path", "path", "sub-model"])
def test_sandbox_manager_refuses_a_config_of_the_wrong_type(value: Any) -> None:
    """SandboxManager(config=...) takes a HarombeConfig and nothing else."""
    with pytest.raises(UsageError):
        SandboxManager(FakeDocker(), config=value)


async def test_sandboxes_switched_off_refuse_to_start() -> None:
    """security.sandbox.enabled: false makes start() raise a ConfigError; nothing starts."""
    fake = await _fake()
    manager = SandboxManager(fake, config=config(enabled=False))
    with pytest.raises(ConfigError):
        await manager.start()
    assert fake.containers == {}


@pytest.mark.parametrize("stream", [False, True], ids=["execute", "stream"])
async def test_the_gate_sees_the_configured_default_network(stream: bool) -> None:
    """With network.enabled_by_default: true, a call that leaves network_enabled out is shown
    to the gate as network-enabled (execute and stream alike)."""
    approver = ScriptedApprover(default=False)
    async with running(network={"enabled_by_default": True}) as (_, manager):
        tools = CodeExecutionTools(manager, HITLGate(approver=approver))
        if stream:
            items = [i async for i in tools.code_execute_stream("python", "print(1)")]
            result = items[-1]
        else:
            result = await tools.code_execute("python", "print(1)")
    assert result["success"] is False
    assert approver.requests and approver.requests[0].operation.params["network_enabled"] is True


# ---------------------------------------------------------------------------------------------
# 5. code_execute_stream takes code_execute's parameters
# ---------------------------------------------------------------------------------------------


def test_the_stream_has_execute_parameters_but_on_output() -> None:
    """One definition: the stream's signature is code_execute's without on_output."""
    execute = inspect.signature(CodeExecutionTools.code_execute).parameters
    stream = inspect.signature(CodeExecutionTools.code_execute_stream).parameters
    assert list(stream) == [p for p in execute if p != "on_output"]
    assert all(stream[p] == execute[p] for p in stream)


WRONG_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("python", "print(1)"), {"on_output": print}),
    (("python",), {}),
    (("python", "print(1)", None, 5, None, None, True), {}),
    (("python", "print(1)"), {"bogus": 1}),
    (("python", "print(1)"), {"language": "python"}),
]
WRONG_CALL_IDS = ["on-output", "missing-code", "fresh-positional", "unknown", "twice"]


@pytest.mark.parametrize(("args", "kwargs"), WRONG_CALLS, ids=WRONG_CALL_IDS)
async def test_a_wrong_stream_call_fails_when_made_as_execute_does(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A call code_execute refuses with TypeError when it is made, the stream refuses the same
    way at the same moment (not later, at the first iteration)."""
    tools = CodeExecutionTools(SandboxManager(FakeDocker(), config=config()), hitl_gate=None)
    if "on_output" not in kwargs:  # code_execute takes on_output; the stream must not
        with pytest.raises(TypeError):
            tools.code_execute(*args, **kwargs).close()
    with pytest.raises(TypeError):
        tools.code_execute_stream(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# 6. The manager's composition: lost, destroyed, stopped
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["create_container", "image_id"])
async def test_a_create_in_flight_when_stop_runs_leaves_nothing_running(step: str) -> None:
    """stop() means stopped: a sandbox whose creation was under way when stop() ran is not
    left running (or registered) once that creation finishes."""
    fake = FakeDocker()
    release = asyncio.Event()
    real = getattr(fake, step)

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await release.wait()
        return await real(*args, **kwargs)

    setattr(fake, step, slow)
    async with running(fake) as (_, manager):
        create = asyncio.ensure_future(manager.create_sandbox("python"))
        await asyncio.sleep(0.05)
        await manager.stop()
        release.set()
        await asyncio.gather(create, return_exceptions=True)
        await manager.wait_pool_settled()
        leftover = [c.status for c in fake.containers.values()]
        registered = list(manager.sandboxes)
    assert (leftover, registered) == ([], [])


async def test_destroying_a_sandbox_under_a_call_starts_no_replacement() -> None:
    """A sandbox destroyed on purpose while a call runs in it is gone: the call fails, and no
    replacement sandbox is started in its place."""
    hold = Hold()
    async with running(FakeDocker(handler=hold)) as (fake, manager):
        box = await manager.create_sandbox("python")
        call = asyncio.ensure_future(manager.execute(box.sandbox_id, "hold"))
        await hold.until_held(call)
        await manager.destroy_sandbox(box.sandbox_id)
        outcome = (await asyncio.gather(call, return_exceptions=True))[0]
        live, containers = list(manager.sandboxes), len(fake.containers)
    assert (live, containers) == ([], 0), f"replaced by a new sandbox: {outcome!r}"


async def test_a_sandbox_a_file_call_finds_lost_is_not_kept_as_live() -> None:
    """A file call that finds its sandbox dead leaves no dead sandbox listed as live: the
    manager drops it (or replaces it, as execute and install do)."""
    async with running() as (fake, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(language="python", code="print(1)"))["sandbox_id"]
        cid = container_of(fake, sid)
        assert cid is not None
        fake.kill(cid)
        await asyncio.sleep(0.01)
        result = await tools.code_read_file(sandbox_id=sid, file_path="a.txt")
        live = list(manager.sandboxes)
    assert result["success"] is False and "SandboxLostError" in result["error"]
    assert sid not in live


async def test_a_sandbox_lost_during_install_is_replaced_like_one_lost_during_execute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lost during an install: the result names the replacement and the lost id, the old id's
    error says which sandbox replaced it (as for execute)."""

    async def no_download(*args: Any, **kwargs: Any) -> bytes:
        return b""

    monkeypatch.setattr(packages, "fetch_pypi", no_download)
    async with running() as (fake, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        sid = (await tools.code_execute(language="python", code="print(1)"))["sandbox_id"]
        cid = container_of(fake, sid)
        assert cid is not None
        fake.kill(cid)
        await asyncio.sleep(0.01)
        result = await tools.code_install_package(sandbox_id=sid, package="six")
        assert result["success"] is False and result["replaced_sandbox_id"] == sid
        new = result["sandbox_id"]
        assert new != sid and new in manager.sandboxes
        with pytest.raises(SandboxNotFoundError, match=new):
            manager.get(sid)

"""Adversarial review of ``@sandbox`` against real gVisor: a hostile function uses the session
interpreter it runs in to forge its answer (crash, freeze or alter the host), or leaves a
process behind for the next call; callers call from threads and after ``shutdown()``."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from harombe import decorator, sandbox
from harombe.config import load_config
from harombe.errors import SerializationError
from harombe.security.docker_manager import DockerManager
from harombe.security.runtime.sandbox import LABEL_OWNER

pytestmark = pytest.mark.integration

#: How long a child process gets for one decorated call (a few seconds when all is well).
CHILD_DEADLINE_S = 30.0
POISON = "harombe_review_poisoned"


@pytest.fixture(scope="module", autouse=True)
def _fresh_runner() -> Iterator[None]:
    """One private loop for this module, shut down (its sandboxes removed) at the end. The
    config's gate is off: these probes are about isolation (one starts a process on purpose,
    which the gate rates CRITICAL)."""
    off = {**os.environ, "HAROMBE__SECURITY__HITL__ENABLED": "false"}
    decorator.configure(config=load_config(environ=off))
    yield
    decorator.shutdown()


@sandbox()
def look_for_traces() -> dict[str, bool]:
    """What an earlier call could have left: a sleeping process, a file in /tmp or /workspace."""
    import os

    cmdlines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines.append(f.read())
        except OSError:
            pass
    return {
        "process": any(b"harombe-review-sleeper" in line for line in cmdlines),
        "tmp": os.path.exists("/tmp/harombe-review-marker"),
        "workspace": os.path.exists("/workspace/harombe-review-marker"),
    }


@sandbox()
def leave_a_process_behind() -> bool:
    """Start a detached process that outlives this call; True once it is seen running."""
    import os
    import subprocess
    import time

    script = "exec -a harombe-review-sleeper sleep 300"
    subprocess.Popen(["bash", "-c", script], start_new_session=True)
    for name in ("/tmp/harombe-review-marker", "/workspace/harombe-review-marker"):
        with open(name, "w") as f:
            f.write("left behind")
    for _ in range(100):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"harombe-review-sleeper" in f.read():
                        return True
            except OSError:
                pass
        time.sleep(0.05)
    return False


def test_a_process_left_running_is_invisible_to_the_next_call() -> None:
    """A detached process and files of call N are not seen by call N+1."""
    nothing = {"process": False, "tmp": False, "workspace": False}
    assert look_for_traces() == nothing
    assert leave_a_process_behind() is True
    assert look_for_traces() == nothing


@sandbox()
def forge_an_attribute_on_counter() -> None:
    """Replace the session's answer encoder, so the runner writes a pickle that BUILDs on
    collections.Counter (the host reads only JSON: it must refuse it)."""
    import harombe_encode  # type: ignore[import-not-found]

    head = b"\x80\x02}(X\x04\x00\x00\x00kindX\x06\x00\x00\x00returnX\x05\x00\x00\x00value"
    name = b"harombe_review_poisoned"
    data = (
        head + b"ccollections\nCounter\nN}X" + len(name).to_bytes(4, "little") + name
        + b"K\x07s\x86b0K\x01u."
    )  # fmt: skip
    harombe_encode.answer = lambda *args, **kwargs: data


def test_a_forged_answer_cannot_change_a_host_class() -> None:
    """After a call whose answer BUILDs on Counter, the host's Counter is unchanged (and
    the call is refused: the answer is not JSON)."""
    try:
        with pytest.raises(SerializationError, match="not valid JSON"):
            forge_an_attribute_on_counter()
        assert POISON not in vars(collections.Counter)
    finally:
        if POISON in vars(collections.Counter):
            delattr(collections.Counter, POISON)


HEAD_EXPR = r'b"\x80\x02}(X\x04\x00\x00\x00kindX\x06\x00\x00\x00returnX\x05\x00\x00\x00value"'
JSON_HEAD_EXPR = """b'{"kind":"return","value":'"""
CHILD = r"""
from harombe import sandbox
from harombe.errors import HarombeError
from harombe.security.runtime.sandbox import process_owner
print(process_owner(), flush=True)

@sandbox(timeout_sec=60)
def hostile():
    import harombe_encode
    data = FORGE
    harombe_encode.answer = lambda *args, **kwargs: data

try:
    hostile()
    print("accepted", flush=True)
except HarombeError as exc:
    print("refused", type(exc).__name__, flush=True)
"""

FORGES = {
    "deep-frozenset": pytest.param(
        r'HEAD + b"cbuiltins\nfrozenset\n((N" + b"\x85" * 1_000_000 + b"ltRu."',
        id="deep-frozenset",
    ),
    "shared-tuple-hash": pytest.param(
        r'HEAD + b"}N" + b"2\x86" * 64 + b"K\x01su."', id="shared-tuple-hash"
    ),
    "json-deep-tuple-key": pytest.param(
        r"""JSON_HEAD + b'{"s":[' + b'{"t":[' * 1_000_000 + b']}' * 1_000_000 + b']}}'""",
        id="json-deep-tuple-key",
    ),
    "json-colliding-ints": pytest.param(
        r"""JSON_HEAD + b'{"s":[' + ",".join(str(i * ((1 << 61) - 1))
        for i in range(1, 200_001)).encode() + b']}}'""",
        id="json-colliding-ints",
    ),
}


def _run(script: str) -> tuple[str, int | None, str]:
    """Run ``script``; its owner line, exit code (None: killed at the deadline), the rest."""
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    ) as child:  # fmt: skip
        try:
            out, _ = child.communicate(timeout=CHILD_DEADLINE_S)
            code: int | None = child.returncode
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
            code = None
    owner, _, rest = out.partition("\n")
    return owner.strip(), code, rest


async def _remove_leftovers(docker_manager: DockerManager, owner: str) -> None:
    """A killed or crashed child removes nothing: take its containers away here."""
    if owner:
        for info in await docker_manager.list_containers({LABEL_OWNER: owner}):
            await docker_manager.remove_container(info.id)


@pytest.mark.parametrize("forge", list(FORGES.values()))
async def test_a_forged_answer_neither_crashes_nor_freezes_the_caller(
    forge: str, docker_manager: DockerManager
) -> None:
    """A function that forges a hashing bomb as its answer gets its call refused; the
    caller's process lives on and exits normally."""
    forge = forge.replace("JSON_HEAD", JSON_HEAD_EXPR).replace("HEAD", HEAD_EXPR)
    script = textwrap.dedent(CHILD).replace("FORGE", forge)
    owner, code, rest = await asyncio.to_thread(_run, script)
    try:
        assert code is not None, "the caller's process froze decoding the answer"
        assert code == 0, f"the caller's process died (exit {code})"
        assert rest.startswith("refused SerializationError")
    finally:
        await _remove_leftovers(docker_manager, owner)


@sandbox()
def whoami(tag: int) -> tuple[int, bool]:
    """The tag it was given, and whether an earlier call left its mark in this sandbox."""
    import os

    marker = "/workspace/harombe-review-whoami"
    seen = os.path.exists(marker)
    with open(marker, "w") as f:
        f.write(str(tag))
    return tag, seen


def test_concurrent_calls_from_threads_each_get_their_own_sandbox() -> None:
    """Calls from four threads at once each return their own argument from their own sandbox."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(whoami, range(4)))
    assert answers == [(0, False), (1, False), (2, False), (3, False)]


def test_a_call_after_shutdown_starts_afresh() -> None:
    """shutdown() between two calls: the second call still runs, in a new sandbox."""
    first = whoami(1)
    decorator.shutdown()
    assert (first, whoami(2)) == ((1, False), (2, False))

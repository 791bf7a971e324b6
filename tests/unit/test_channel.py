"""The host's Channel over a FakeDocker container: routing, streaming, loss, greeting; no Docker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.config import DEFAULT_IMAGE
from harombe.errors import SandboxLostError, SandboxStartError
from harombe.security.guest.wire import HEADER, encode
from harombe.security.runtime.channel import Channel
from harombe.testing import FakeDocker, FakeGuest, RunOutcome


class Gate:
    """A run handler that reports each run it enters and holds it until released."""

    def __init__(self) -> None:
        self.entered: asyncio.Queue[str] = asyncio.Queue()
        self.release: dict[str, asyncio.Event] = {}

    async def __call__(self, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        name = stdin.decode()
        self.release[name] = asyncio.Event()
        await self.entered.put(name)
        await self.release[name].wait()
        return RunOutcome(stdout=f"{name} done\n")


async def open_channel(
    docker: FakeDocker, guest: FakeGuest | None = None, *, hello_s: float | None = 5.0, **kw: Any
) -> tuple[str, Channel]:
    """A started container with a channel attached; its greeting awaited unless hello_s is None."""
    if guest is not None:
        docker.guest_factory = lambda: guest
    cid = await docker.create_container(image=DEFAULT_IMAGE)
    channel = Channel(await docker.attach(cid), sandbox_id="sandbox-0123456789ab", **kw)
    await docker.start_container(cid)
    if hello_s is not None:
        await channel.hello(timeout_s=hello_s)
    return cid, channel


@pytest.fixture
async def closing() -> AsyncIterator[list[Channel]]:
    channels: list[Channel] = []
    yield channels
    for channel in channels:
        await channel.close()


def run(code: str = "", **extra: Any) -> dict[str, Any]:
    return {"op": "run", "argv": ["python3", "-"], "timeout_s": 30,
            "max_output_bytes": 1 << 20, "max_memory_mb": 512, **extra}  # fmt: skip


async def test_hello_returns_the_supervisors_greeting(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """hello() returns what the supervisor said about itself."""
    _, channel = await open_channel(docker, hello_s=None)
    closing.append(channel)
    info = await channel.hello(timeout_s=5)
    assert info["op"] == "hello" and info["interpreters"]["python3"]


async def test_replies_are_routed_by_id_whatever_their_order(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A ping sent while a run is in progress is answered first; each caller gets its own reply."""
    gate = Gate()
    _, channel = await open_channel(docker, FakeGuest(gate))
    closing.append(channel)
    running = asyncio.ensure_future(channel.request(run(), b"slow", timeout_s=5))
    assert await gate.entered.get() == "slow"
    ping, _ = await channel.request({"op": "ping"}, timeout_s=5)
    assert ping["op"] == "result" and ping["ok"] is True and not running.done()
    gate.release["slow"].set()
    reply, blob = await running
    assert reply["op"] == "done" and blob == b"slow done\n"
    assert reply["id"] != ping["id"]


async def test_a_reply_for_no_waiting_request_is_ignored(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """Replies with an unknown or malformed id change nothing; the channel stays usable."""
    cid, channel = await open_channel(docker)
    closing.append(channel)
    guest = docker.guest(cid)
    for rid in (999, "1", None):
        guest.send({"op": "result", "id": rid, "ok": False})
    reply, _ = await channel.request({"op": "ping"}, timeout_s=5)
    assert reply["ok"] is True and channel.lost is None


async def test_streamed_output_reaches_the_callback_before_the_reply(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """Every ``out`` frame of a streaming run goes to its callback, in order, before ``done``."""
    guest = FakeGuest(lambda m, s: RunOutcome(stdout="a\nb\n", stderr="w\n"))
    _, channel = await open_channel(docker, guest)
    closing.append(channel)
    chunks: list[tuple[str, bytes]] = []

    async def on_output(stream: str, data: bytes) -> None:
        chunks.append((stream, data))

    reply, blob = await channel.request(run(stream=True), timeout_s=5, on_output=on_output)
    assert chunks == [("stdout", b"a\n"), ("stdout", b"b\n"), ("stderr", b"w\n")]
    assert reply["stdout_total"] == 4 and blob == b"a\nb\nw\n"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (HEADER.pack(4096, 0), "over the caps"),
        (HEADER.pack(0, 1 << 30), "over the caps"),
        (HEADER.pack(4, 0) + b"[1] ", "not a JSON object"),
        (HEADER.pack(3, 0) + b"{x}", "not JSON"),
    ],
    ids=["json-over-cap", "blob-over-cap", "json-array", "garbage"],
)
async def test_a_frame_out_of_protocol_ends_the_channel_as_lost(
    docker: FakeDocker, closing: list[Channel], raw: bytes, reason: str
) -> None:
    """An oversized or malformed frame fails the waiting request and every later one."""
    gate = Gate()
    cid, channel = await open_channel(docker, FakeGuest(gate), max_json_bytes=1024)
    closing.append(channel)
    waiting = asyncio.ensure_future(channel.request(run(), b"x", timeout_s=5))
    await gate.entered.get()
    docker.guest(cid).send_raw(raw)
    with pytest.raises(SandboxLostError, match=f"broke the protocol: it sent .*{reason}"):
        await waiting
    assert channel.lost is not None
    with pytest.raises(SandboxLostError):
        await channel.request({"op": "ping"}, timeout_s=5)


async def test_streamed_output_over_the_blob_cap_ends_the_channel(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """The streamed output of one run counts against the blob cap like a single frame."""
    guest = FakeGuest(lambda m, s: RunOutcome(stdout="x" * 40 + "\n" + "y" * 40 + "\n"))
    _, channel = await open_channel(docker, guest, max_blob_bytes=64)
    closing.append(channel)
    with pytest.raises(SandboxLostError, match="streamed output"):
        await channel.request(run(stream=True), timeout_s=5, on_output=lambda s, d: None)


async def test_a_killed_container_fails_the_waiting_request_with_its_stderr(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """The stream's end is the sandbox lost; the supervisor's last stderr is in the reason."""
    gate = Gate()
    cid, channel = await open_channel(docker, FakeGuest(gate))
    closing.append(channel)
    waiting = asyncio.ensure_future(channel.request(run(), b"x", timeout_s=5))
    await gate.entered.get()
    docker.guest(cid).send_raw(b"supervisor: fatal\n", stream=2)
    await asyncio.sleep(0)  # the stderr bytes are read before the end
    docker.kill(cid)
    with pytest.raises(SandboxLostError, match=r"container stopped.*supervisor: fatal"):
        await waiting
    assert "supervisor: fatal" in channel.stderr_tail


async def test_a_request_without_reply_in_time_ends_the_channel(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A paused sandbox that misses the reply timeout is treated as lost, never trusted again."""
    cid, channel = await open_channel(docker)
    closing.append(channel)
    docker.pause(cid)
    with pytest.raises(SandboxLostError, match="stopped answering"):
        await channel.request({"op": "ping"}, timeout_s=0.01)
    assert channel.lost is not None


async def test_cancelling_a_run_request_cancels_the_run_in_the_sandbox(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A caller that gives up sends ``cancel`` and waits until the run has stopped."""
    gate = Gate()
    cid, channel = await open_channel(docker, FakeGuest(gate))
    closing.append(channel)
    waiting = asyncio.ensure_future(channel.request(run(), b"x", timeout_s=5))
    await gate.entered.get()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    requests = docker.guest(cid).requests
    assert requests[-1]["op"] == "cancel" and requests[-1]["target"] == requests[-2]["id"]
    reply, _ = await channel.request({"op": "ping"}, timeout_s=5)  # idle again, still usable
    assert reply["ok"] is True


async def test_no_greeting_in_time_is_a_start_error(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A supervisor that never says hello fails the start with SandboxStartError."""
    _, channel = await open_channel(docker, FakeGuest(greet=False), hello_s=None)
    closing.append(channel)
    with pytest.raises(SandboxStartError, match="did not answer within"):
        await channel.hello(timeout_s=0.01)


async def test_exit_before_the_greeting_is_a_start_error(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A container that exits before its greeting fails the start, naming python3 as the need."""
    cid, channel = await open_channel(docker, FakeGuest(greet=False), hello_s=None)
    closing.append(channel)
    docker.kill(cid, exit_code=127)
    with pytest.raises(SandboxStartError, match=r"exited while starting.*python3"):
        await channel.hello(timeout_s=5)


async def test_frames_split_or_joined_by_the_stream_are_decoded_alike(
    docker: FakeDocker, closing: list[Channel]
) -> None:
    """A greeting cut across reads, joined to the next frame, is still one greeting."""
    guest = FakeGuest(greet=False)
    _, channel = await open_channel(docker, guest, hello_s=None)
    closing.append(channel)
    data = encode(guest.info) + encode({"op": "result", "id": 999, "ok": True})
    for start in range(0, len(data), 7):
        guest.send_raw(data[start : start + 7])
    assert (await channel.hello(timeout_s=5))["op"] == "hello"
    reply, _ = await channel.request({"op": "ping"}, timeout_s=5)
    assert reply["ok"] is True and channel.lost is None

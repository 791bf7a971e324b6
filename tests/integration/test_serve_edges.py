"""``harombe serve`` as a process, on real gVisor, at its edges: a broken profile file is reported
at start and only its profile refused; request heads that never finish are closed after
``service.header_timeout_s``; a request with both Content-Length and Transfer-Encoding is
refused and its connection closed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harombe.security.runtime.docker import DockerManager

#: The fips tutorial's exercise: a visualization profile listing matplotlib's pyplot module.
TUTORIAL_EXERCISE = (
    "extends: data-science\nimports:\n  additional: [matplotlib, matplotlib.pyplot]\n"
)
HEADER_TIMEOUT_S = 2.0
SLOW_CONNECTIONS = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(directory: Path, **service: Any) -> Path:
    profiles = directory / "profiles"
    profiles.mkdir(exist_ok=True)
    (profiles / "viz.yaml").write_text(TUTORIAL_EXERCISE, encoding="utf-8")
    (profiles / "stats.yaml").write_text("extends: minimal\n", encoding="utf-8")
    config = {
        "security": {"hitl": {"enabled": False}, "sandbox": {"pool": {"size": 1}},
                     "profiles": {"directory": str(profiles)}},
        "service": {"request_profiles": ["viz", "stats"],
                    "header_timeout_s": HEADER_TIMEOUT_S, **service},
    }  # fmt: skip
    path = directory / "harombe.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def spawn(config: Path, port: int, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harombe", "serve", "--config", str(config), "--port", str(port),
        env={**os.environ, **env}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def serve(config: Path) -> AsyncIterator[tuple[str, list[str]]]:
    """A running ``harombe serve``: its base URL and the stderr lines it printed at start."""
    port = free_port()
    process = await spawn(config, port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base) as http:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/v1/health")).json()["status"] == "ok":
                        break
                assert process.returncode is None, f"harombe serve exited {process.returncode}"
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("harombe serve did not come up within 60 s")
        assert process.stderr is not None
        lines = []
        while True:  # what it printed before serving: up to the approvals page line
            line = (await asyncio.wait_for(process.stderr.readline(), 10)).decode()
            lines.append(line)
            if line.startswith("approvals page:") or not line:
                break
        yield base, lines
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0


async def test_a_broken_profile_is_reported_and_only_it_is_refused(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """serve prints the broken file and its fix at start; minimal and the good user profile
    run code in gVisor; a call naming the broken profile is told it is disabled, and why."""
    async with serve(write_config(tmp_path)) as (base, lines):
        warned = [line for line in lines if line.startswith("harombe serve: warning")]
        assert len(warned) == 1 and "profile 'viz' disabled" in warned[0]
        assert "viz.yaml" in warned[0]
        assert "write 'matplotlib'" in warned[0]
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            ran = await http.post("/execute", json={"code": "print(6*7)"})
            assert ran.status_code == 200 and ran.json()["stdout"] == "42\n", ran.text
            stats = await http.post("/execute", json={"code": "print(1)", "profile": "stats"})
            assert stats.status_code == 200 and stats.json()["stdout"] == "1\n", stats.text
            refused = await http.post("/execute", json={"code": "print(1)", "profile": "viz"})
            assert refused.status_code == 503
            assert "profile 'viz' is disabled" in refused.json()["error"]
            assert "matplotlib.pyplot" in refused.json()["error"]
            made = await http.post("/v1/sandboxes", json={"profile": "viz"})
            assert made.status_code == 503 and made.json()["kind"] == "ConfigError"
            for answer in (refused, made):
                assert str(tmp_path) not in answer.text


async def test_serve_refuses_to_start_under_a_broken_profile(tmp_path: Path) -> None:
    """SANDBOX_PROFILE naming the broken profile: serve exits at once with the file and fix."""
    process = await spawn(write_config(tmp_path), free_port(), SANDBOX_PROFILE="viz")
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode != 0
    text = stderr.decode()
    assert "harombe serve: SANDBOX_PROFILE names profile 'viz', which is disabled" in text
    assert str(tmp_path / "profiles" / "viz.yaml") in text and "write 'matplotlib'" in text


async def open_slow(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent part of a request head and nothing more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    await writer.drain()
    return reader, writer


async def closed_answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded wait)."""
    return await asyncio.wait_for(reader.read(), HEADER_TIMEOUT_S + 30)


async def test_connections_that_never_finish_their_head_are_closed(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """60 connections holding a partial request head are each answered 408 and closed after
    the header timeout; the service answers others meanwhile and afterwards."""
    async with serve(write_config(tmp_path)) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        slow = [await open_slow(port) for _ in range(SLOW_CONNECTIONS)]
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            assert (await http.get("/v1/health")).status_code == 200
            answers = await asyncio.gather(*(closed_answer(reader) for reader, _ in slow))
            for _, writer in slow:
                writer.close()
            assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
            assert (await http.get("/v1/health")).status_code == 200


async def test_a_slow_second_head_on_a_kept_alive_connection_is_closed(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """After a first request is answered, the next head on the same connection is timed too."""
    async with serve(write_config(tmp_path)) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 30)
        assert first.startswith(b"HTTP/1.1 200 ")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the end
        assert (await closed_answer(reader)).startswith(b"HTTP/1.1 408 ")
        writer.close()


SMUGGLED = [
    ("te-then-cl", b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n"),
    ("cl-then-te", b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"),
    ("mixed-case", b"content-length: 4\r\ntransfer-encoding: chunked\r\n"),
]


@pytest.mark.parametrize("headers", [s[1] for s in SMUGGLED], ids=[s[0] for s in SMUGGLED])
async def test_content_length_with_transfer_encoding_is_refused_and_closed(
    docker_manager: DockerManager, tmp_path: Path, headers: bytes
) -> None:
    """A request carrying both framings is answered 400 and the connection closed; the
    body is never handed to the app (no run)."""
    async with serve(write_config(tmp_path)) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"code": "print(1)"}'
        writer.write(
            b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + headers + b"\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        )  # fmt: skip
        await writer.drain()
        answer = await closed_answer(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"connection: close" in answer.lower() and b'"stdout"' not in answer

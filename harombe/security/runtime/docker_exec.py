"""Interactive execs on a pseudo-terminal (``harombe shell``), made on the daemon's unix socket
directly, as :mod:`.docker_socket` attaches to a container: create the exec, start it with an
HTTP upgrade, then the terminal's raw bytes both ways; a resize and the exit status are short
requests on their own connections.

:class:`TerminalExecs` gives :class:`~harombe.security.runtime.docker.DockerManager` its
``exec_interactive`` without the SDK (which :mod:`.docker` alone imports). Errors: a container or
exec that is gone or stopped is :class:`~harombe.errors.SandboxLostError`; a socket that fails,
a daemon that refuses or does not answer within :data:`REQUEST_TIMEOUT_S` is
:class:`~harombe.errors.DockerUnavailableError`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import structlog

from harombe.errors import DockerUnavailableError, HarombeError, SandboxLostError
from harombe.security.runtime.docker_socket import FIX_DAEMON, AttachedStdio, upgrade

log = structlog.get_logger(__name__)

#: How long a create, resize or inspect may take before the daemon counts as unreachable.
REQUEST_TIMEOUT_S = 30.0
#: Docker holds back typed bytes that begin its detach sequence (by default Ctrl-P Ctrl-Q, which
#: would delay readline's Ctrl-P); this one is three keys nobody types in a row.
DETACH_KEYS = "ctrl-^,ctrl-],ctrl-^"
#: Tries of the first resize (Docker refuses one that comes before the process runs).
RESIZE_TRIES = 5
#: Docker's answers for a container that is gone (404) or not running / paused (409).
GONE = (404, 409)


async def request(
    path: str, method: str, url: str, *, what: str, body: Mapping[str, Any] | None = None
) -> Any:
    """One HTTP/1.0 request on the daemon socket at ``path``; the JSON answer (None if empty).

    HTTP/1.0, so the daemon sends the whole answer and closes: no chunks, no keep-alive."""
    payload = json.dumps(body).encode() if body is not None else b""
    writer = None
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(
                f"{method} {url} HTTP/1.0\r\nHost: docker\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            answer = await reader.read()
    except TimeoutError:
        raise DockerUnavailableError(
            f"the Docker daemon at {path} did not answer within {REQUEST_TIMEOUT_S:g}s while "
            f"{what}; it may be hung or overloaded: {FIX_DAEMON}"
        ) from None
    except OSError as exc:
        raise _socket_error(path, what, exc) from None
    finally:
        if writer is not None:
            writer.close()
    return _answer(answer, what=what)


def _socket_error(path: str, what: str, exc: OSError) -> DockerUnavailableError:
    text = f"Docker socket error at {path} while {what}: {exc.strerror or repr(exc)}"
    return DockerUnavailableError(f"{text}; {FIX_DAEMON}")


def _answer(answer: bytes, *, what: str) -> Any:
    """The JSON body of an HTTP answer; its status mapped to a harombe error."""
    head, _, content = answer.partition(b"\r\n\r\n")
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    code = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    try:
        data = json.loads(content) if content.strip() else None
    except ValueError:
        data = None
    if 200 <= code < 300:
        return data
    message = data.get("message") if isinstance(data, dict) else content[:200].decode("latin-1")
    if code in GONE:
        raise SandboxLostError(f"the sandbox is gone or not running while {what}: {message}")
    raise DockerUnavailableError(
        f"Docker refused {what} (HTTP {code or 'answer unreadable'}): {message}"
    )


class ExecTerminal(AttachedStdio):
    """A running exec's pseudo-terminal: one raw byte stream (no stream frames), reported as
    stdout; :meth:`resize` and :meth:`exit_code` are requests of their own."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, path: str,
        exec_id: str,
    ) -> None:  # fmt: skip
        super().__init__(reader, writer)
        self.path = path
        self.exec_id = exec_id

    async def read(self) -> tuple[int, bytes] | None:
        """Next ``(1, bytes)`` the terminal wrote; ``None`` once the exec's stream has ended."""
        try:
            data = await self._reader.read(1 << 16)
        except ConnectionError:
            return None
        return (1, data) if data else None

    async def resize(self, *, rows: int, cols: int) -> None:
        """Resize the pseudo-terminal; its foreground process group gets SIGWINCH."""
        await request(
            self.path, "POST", f"/exec/{quote(self.exec_id)}/resize?h={rows:d}&w={cols:d}",
            what=f"resizing terminal {self.exec_id[:12]}",
        )  # fmt: skip

    async def exit_code(self) -> int | None:
        """The exec's exit status (0-255); ``None`` while its process runs or before Docker
        has one. An answer that is not such a status is :class:`DockerUnavailableError`."""
        found = await request(
            self.path, "GET", f"/exec/{quote(self.exec_id)}/json",
            what=f"inspecting exec {self.exec_id[:12]}",
        )  # fmt: skip
        if not isinstance(found, dict) or found.get("Running"):
            return None
        code = found.get("ExitCode")
        if code is None:  # not started, or not yet reaped: no status to report
            return None
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
            raise DockerUnavailableError(
                f"Docker reported an unreadable exit status {str(code)[:40]!r} for exec "
                f"{self.exec_id[:12]}"
            )
        return code


class TerminalExecs:
    """``exec_interactive`` of the Docker backend, for a class that knows its ``socket_path``."""

    @property
    def socket_path(self) -> str:
        raise NotImplementedError

    async def exec_interactive(
        self,
        container_id: str,
        cmd: Sequence[str],
        *,
        user: str,
        env: Mapping[str, str],
        workdir: str,
        size: tuple[int, int],
    ) -> ExecTerminal:
        """Start ``cmd`` in the running container as ``user`` with exactly ``env`` (nothing of
        the image's), in ``workdir``, on a new pseudo-terminal of ``size`` (rows, columns)."""
        path, what = self.socket_path, f"starting {cmd[0]!r} on a terminal in {container_id[:12]}"
        spec = {
            "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Tty": True,
            "Cmd": list(cmd), "User": user, "WorkingDir": workdir, "DetachKeys": DETACH_KEYS,
            "Env": [f"{key}={value}" for key, value in env.items()], "ConsoleSize": list(size),
        }  # fmt: skip
        created = await request(
            path, "POST", f"/containers/{quote(container_id)}/exec", what=what, body=spec
        )
        if not isinstance(created, dict) or not isinstance(created.get("Id"), str):
            raise DockerUnavailableError(f"Docker gave no exec id while {what}: {created!r}")
        exec_id = created["Id"]
        start = json.dumps({"Detach": False, "Tty": True, "ConsoleSize": list(size)}).encode()
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                reader, writer = await upgrade(
                    path, f"/exec/{quote(exec_id)}/start", what=f"the exec {exec_id[:12]}",
                    body=start,
                )  # fmt: skip
        except HarombeError:
            raise
        except TimeoutError:
            raise DockerUnavailableError(
                f"the Docker daemon at {path} did not start the exec within "
                f"{REQUEST_TIMEOUT_S:g}s while {what}; {FIX_DAEMON}"
            ) from None
        except OSError as exc:
            raise _socket_error(path, what, exc) from None
        terminal = ExecTerminal(reader, writer, path=path, exec_id=exec_id)
        await _first_size(terminal, size)
        return terminal


async def _first_size(terminal: ExecTerminal, size: tuple[int, int]) -> None:
    """Give the new terminal its size (runsc ignores the start's ``ConsoleSize``). Docker may
    refuse while the process is still being started: a few tries, then it keeps Docker's."""
    for attempt in range(RESIZE_TRIES):
        try:
            await terminal.resize(rows=size[0], cols=size[1])
            return
        except HarombeError as exc:
            if attempt == RESIZE_TRIES - 1:
                log.warning("terminal.resize_failed", exec_id=terminal.exec_id[:12], error=str(exc))
            else:
                await asyncio.sleep(0.05 * (attempt + 1))

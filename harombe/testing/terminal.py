"""FakeTerminal: the pseudo-terminal :meth:`FakeDocker.exec_interactive
<harombe.testing.FakeDocker.exec_interactive>` hands out, a line-echoing stand-in for a shell.

It echoes what is typed as a terminal does (``\\r`` becomes ``\\r\\n``), answers each line with
the line itself, and ends like a shell: ``exit N`` ends with status N, Ctrl-D (``\\x04``) at
the start of a line with 0. Ctrl-C (``\\x03``) shows ``^C`` and a new line. Resizes are
recorded in :attr:`FakeTerminal.sizes`. Nothing is run.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

from harombe.errors import SandboxLostError

EXIT = re.compile(r"^exit(?:\s+(\d+))?$")


class FakeTerminal:
    """One fake exec on a pseudo-terminal; see the module docstring."""

    def __init__(
        self,
        exec_id: str,
        *,
        container_id: str,
        cmd: Sequence[str],
        user: str,
        env: Mapping[str, str],
        workdir: str,
        size: tuple[int, int],
    ) -> None:
        self.exec_id = exec_id
        self.container_id = container_id
        self.cmd = list(cmd)
        self.user = user
        self.env = dict(env)
        self.workdir = workdir
        self.sizes: list[tuple[int, int]] = [size]
        self.typed = bytearray()  # every byte written, in order
        self.status: int | None = None
        self._line = bytearray()
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._out.put_nowait(b"$ ")

    async def read(self) -> tuple[int, bytes] | None:
        data = await self._out.get()
        if data is None:
            self._out.put_nowait(None)  # every later read sees the end too
            return None
        return 1, data

    async def write(self, data: bytes) -> None:
        if self.status is not None:
            raise SandboxLostError("the terminal is closed: its process has exited")
        self.typed += data
        for byte in data:
            self._key(bytes([byte]))

    def _key(self, key: bytes) -> None:
        if self.status is not None:
            return
        if key == b"\x03":
            self._line.clear()
            self._out.put_nowait(b"^C\r\n$ ")
        elif key == b"\x04" and not self._line:
            self.end(0)
        elif key in (b"\r", b"\n"):
            line = self._line.decode(errors="replace").strip()
            self._line.clear()
            self._out.put_nowait(b"\r\n")
            if found := EXIT.match(line):
                self.end(int(found.group(1) or 0))
            else:
                self._out.put_nowait(f"{line}\r\n$ ".encode() if line else b"$ ")
        else:
            self._line += key
            self._out.put_nowait(key)

    def end(self, status: int) -> None:
        """The process exits with ``status``: the stream ends."""
        if self.status is None:
            self.status = status
            self._out.put_nowait(None)

    def close(self) -> None:
        self._out.put_nowait(None)

    async def resize(self, *, rows: int, cols: int) -> None:
        self.sizes.append((rows, cols))

    async def exit_code(self) -> int | None:
        return self.status

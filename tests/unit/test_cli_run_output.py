"""`harombe run`'s output on terminals (no Docker): whichever stream is a terminal, the
program cannot leave it restyled (hidden text, colours) after the command ends."""

from __future__ import annotations

import io
import sys

import pytest

from harombe.cli.run import Output
from harombe.cli.screen import RESET


class Stream(io.TextIOWrapper):
    """A text stream over bytes that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8")
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def shown(self) -> bytes:
        self.flush()
        return self.buffer.getvalue()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stdout_tty", "stderr_tty", "written_to"),
    [(True, True, "stderr"), (True, False, "stdout"), (False, True, "stderr")],
    ids=["both-terminals", "stdout-terminal-only", "stderr-terminal-only"],
)
async def test_a_hidden_style_is_reset_on_the_terminal(
    monkeypatch: pytest.MonkeyPatch, stdout_tty: bool, stderr_tty: bool, written_to: str
) -> None:
    """Text hidden by SGR 8 on the program's terminal stream is reset when the run ends."""
    streams = {"stdout": Stream(stdout_tty), "stderr": Stream(stderr_tty)}
    monkeypatch.setattr(sys, "stdout", streams["stdout"])
    monkeypatch.setattr(sys, "stderr", streams["stderr"])
    output = Output()
    output.write("stdout" if stdout_tty else "stderr", b"\x1b[8mhidden\n")
    output.finish()
    assert streams[written_to].shown().endswith(RESET)

"""Ready-made approvers for :class:`~harombe.security.approval.gate.HITLGate`.

* :func:`deny_all` — says no to everything (a safe default for unattended runs).
* :func:`approve_up_to` — approves up to a risk level and denies above it.
* :class:`TerminalApprover` — asks a person on a terminal: shows the tool, risk, reasons and the
  code with line numbers, counts down, and treats anything but a yes (including silence) as no.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import termios
import unicodedata
from collections.abc import Callable
from typing import TextIO

from harombe.security.approval.gate import ApprovalRequest, ApprovalResponse, RiskLevel

#: Parameters shown as code blocks rather than ``key: value`` lines.
CODE_PARAMS = ("code", "content")


def deny_all(request: ApprovalRequest) -> ApprovalResponse:
    """Deny every request."""
    return ApprovalResponse(False, approver="deny_all", comment="deny_all approves nothing")


def approve_up_to(level: RiskLevel | str) -> Callable[[ApprovalRequest], ApprovalResponse]:
    """An approver that approves requests at ``level`` or below and denies the rest."""
    limit = RiskLevel.parse(level)
    name = f"approve_up_to({limit})"

    def approver(request: ApprovalRequest) -> ApprovalResponse:
        if request.risk <= limit:
            return ApprovalResponse(True, approver=name)
        return ApprovalResponse(False, approver=name, comment=f"{request.risk} is above {limit}")

    approver.__name__ = name
    return approver


def render_request(request: ApprovalRequest, *, max_code_lines: int = 60) -> str:
    """The text a person sees: tool, sandbox, risk, reasons, parameters, numbered code; control
    and invisible characters shown escaped (``\\x1b``, ``\\u202e``), so the call's own text
    cannot erase, move over or hide a line of what is shown."""
    op = request.operation
    lines = [
        "",
        f"── approval needed: {op.tool_name} ── risk {request.risk} ──",
        f"sandbox: {op.sandbox_id or '(new sandbox)'}",
        "why:",
        *(f"  - {reason}" for reason in request.reasons),
    ]
    for key, value in op.params.items():
        if key not in CODE_PARAMS and key != "sandbox_id" and value not in (None, [], ""):
            lines.append(f"{key}: {value}")
    for key in CODE_PARAMS:
        text = op.params.get(key)
        if isinstance(text, str):
            code_lines = text.splitlines() or [""]
            width = len(str(len(code_lines)))
            lines.append(f"{key}:")
            for number, line in enumerate(code_lines[:max_code_lines], start=1):
                lines.append(f"  {number:>{width}} │ {line}")
            if len(code_lines) > max_code_lines:
                lines.append(f"  … {len(code_lines) - max_code_lines} more lines not shown")
    return "\n".join(_shown(line) for line in lines) + "\n"


#: Control, format (bidirectional, zero-width), separator and surrogate characters.
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _shown(line: str) -> str:
    """``line`` with its control and invisible characters but tabs escaped."""
    if line.isprintable():
        return line
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if char != "\t" and unicodedata.category(char) in _UNSAFE
        else char
        for char in line
    )


class TerminalApprover:
    """Ask on a terminal. ``y``/``yes`` approves once, ``s``/``sandbox`` approves these same
    findings for the rest of the sandbox's life (a new finding is asked about again); anything
    else, end of input or the timeout denies.

    Prompts are serialised (one question on screen at a time). Type-ahead is discarded before
    each question so a stray Enter or ``y`` typed earlier cannot answer it. If ``input_fd`` is
    not a terminal the request is denied at once: nobody is there to answer.
    """

    name = "terminal"

    def __init__(
        self,
        *,
        input_fd: int | None = None,
        output: TextIO | None = None,
        reminder_every_s: float = 10.0,
        max_code_lines: int = 60,
    ) -> None:
        self.input_fd = sys.stdin.fileno() if input_fd is None else input_fd
        self.output = output or sys.stderr
        self.reminder_every_s = reminder_every_s
        self.max_code_lines = max_code_lines
        self._lock = asyncio.Lock()

    def _write(self, text: str) -> None:
        self.output.write(text)
        self.output.flush()

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        if not os.isatty(self.input_fd):
            return ApprovalResponse(
                False, approver=self.name, comment="no terminal to ask on (input is not a tty)"
            )
        async with self._lock:
            termios.tcflush(self.input_fd, termios.TCIFLUSH)
            self._write(render_request(request, max_code_lines=self.max_code_lines))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + request.timeout_s
            line: asyncio.Future[str] = loop.create_future()
            buffer = bytearray()

            def readable() -> None:
                chunk = os.read(self.input_fd, 1024)
                buffer.extend(chunk)
                if (not chunk or b"\n" in buffer) and not line.done():
                    line.set_result(buffer.split(b"\n", 1)[0].decode(errors="replace"))

            loop.add_reader(self.input_fd, readable)
            try:
                while True:
                    left_s = max(0.0, deadline - loop.time())
                    self._write(
                        f"Approve? [y]es / [s]andbox (yes for this sandbox) / [N]o "
                        f"— denied in {math.ceil(left_s)} s: "
                    )
                    try:
                        answer = await asyncio.wait_for(
                            asyncio.shield(line), min(self.reminder_every_s, left_s)
                        )
                        break
                    except TimeoutError:
                        if loop.time() >= deadline:
                            self._write("\nno answer: denied\n")
                            return ApprovalResponse(False, approver=self.name, comment="timeout")
                        self._write("\n")
            except asyncio.CancelledError:
                self._write("\nno answer in time: denied\n")
                raise
            finally:
                loop.remove_reader(self.input_fd)
        choice = answer.strip().lower()
        if choice in ("y", "yes"):
            self._write("approved\n")
            return ApprovalResponse(True, approver=self.name)
        if choice in ("s", "sandbox"):
            self._write("approved for this sandbox\n")
            return ApprovalResponse(True, scope="sandbox", approver=self.name)
        self._write("denied\n")
        return ApprovalResponse(False, approver=self.name, comment=f"answered {choice or 'no'!r}")

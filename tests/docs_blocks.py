"""The shell blocks of README.md and docs/*.md, their markers, commands and shown output.

Pure: reads text, never runs anything (``tests/integration/test_docs_runnable.py`` runs the
blocks). The convention, as docs/architecture.md ("Docs that run") states it:

- A *shell block* is a fenced block whose language is one of ``SHELL_LANGUAGES``, or any other
  fenced block with a line that starts with ``curl `` or ``$ ``.
- Every shell block carries a marker, an HTML comment (invisible on GitHub) on the nearest
  non-blank line before its fence: ``<!-- runnable -->``, ``<!-- runnable: serve timeout=60 -->``
  or ``<!-- not-runnable: REASON -->``. An unmarked shell block is an error.
- In a ``bash``/``sh``/``shell`` block, a command is a line that is not a comment, with the lines
  a trailing ``\\`` or an open quote continues (here-documents are refused). The ``#`` lines
  starting in column 0 right after a command are its expected output (``# `` removed); so is a
  trailing comment that starts with ``{`` or ``[``. Other comments (indented, or before the
  first command) are prose.
- In a ``console`` block, ``$ `` lines are commands and the lines up to the next one their
  expected output.
- Expected output that starts with ``{`` or ``[`` is JSON, compared as values; else text,
  compared line by line. ``…`` is the placeholder for what differs from run to run: inside a
  string or a text line it matches any run of characters; as a bare JSON value it matches any
  value; as a bare member of an object it allows further keys; as the last element of an array,
  further elements.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "zsh", "console", "shell-session"})
ELLIPSIS = "…"
DEFAULT_TIMEOUT_S = 30.0

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^<!--\s*(?P<kind>runnable|not-runnable)\s*(?::(?P<rest>.*?))?\s*-->$")
_LOOKS_LIKE_MARKER = re.compile(r"^<!--\s*(not[-_ ]?)?run", re.IGNORECASE)
_ANY = "\x00harombe-docs-any"  # a bare … in JSON, after parsing
_MORE = "\x00harombe-docs-more"  # a bare … member of an object or last element of an array


class DocsBlockError(ValueError):
    """A shell block of the docs that is unmarked, or whose marker or content cannot be read."""


@dataclass(frozen=True)
class Marker:
    runnable: bool
    serve: bool = False  # needs `harombe serve` on 127.0.0.1:8000
    timeout_s: float = DEFAULT_TIMEOUT_S  # for the block's commands, serve's start not included
    reason: str = ""  # why a block is not runnable


@dataclass(frozen=True)
class Expected:
    kind: Literal["json", "text"]
    text: str


@dataclass(frozen=True)
class Step:
    """One command of a block, verbatim (continuation lines included), and its shown output."""

    command: str
    line: int  # 1-based line in the file
    expected: Expected | None = None

    @property
    def starts_serve(self) -> bool:
        return is_serve_command(self.command)


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # the opening fence's line, 1-based
    language: str
    body: str
    marker: Marker | None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def is_shell(self) -> bool:
        if self.language in SHELL_LANGUAGES:
            return True
        return any(re.match(r"\s*(\$ |curl\s)", line) for line in self.body.splitlines())

    def steps(self) -> list[Step]:
        """The block's commands and expected outputs; raises DocsBlockError if unreadable."""
        first = self.line + 1
        if self.language in {"console", "shell-session"}:
            steps = _console_steps(self.body, first, self.where)
        else:
            steps = _script_steps(self.body, first, self.where)
        if not steps:
            raise DocsBlockError(f"{self.where}: the block has no command")
        _check_serve(steps, self)
        return steps


# --- finding blocks and markers -------------------------------------------------------------


def fenced_blocks(text: str, path: str) -> list[Block]:
    """Every fenced code block of a markdown text, with the marker before it if any."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        if end == len(lines):
            raise DocsBlockError(f"{path}:{i + 1}: a code fence that is never closed")
        body = "\n".join(_dedent(line, indent) for line in lines[i + 1 : end])
        info = opening["info"].strip().split()
        language = info[0].lower() if info else ""
        marker = _marker_before(lines, i, f"{path}:{i + 1}")
        blocks.append(Block(path, i + 1, language, body, marker))
        i = end + 1
    return blocks


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def _dedent(line: str, indent: int) -> str:
    cut = min(indent, len(line) - len(line.lstrip()))
    return line[cut:]


def _marker_before(lines: list[str], fence_index: int, where: str) -> Marker | None:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    text = lines[j].strip()
    if not _LOOKS_LIKE_MARKER.match(text):
        return None
    found = _MARKER.match(text)
    if not found:
        raise DocsBlockError(
            f"{where}: unreadable marker {text!r}; write <!-- runnable -->, "
            "<!-- runnable: serve timeout=60 --> or <!-- not-runnable: REASON -->"
        )
    return parse_marker(found["kind"], found["rest"] or "", where)


def parse_marker(kind: str, rest: str, where: str) -> Marker:
    """A marker's options: ``serve`` and ``timeout=SECONDS``; a not-runnable's reason."""
    rest = rest.strip()
    if kind == "not-runnable":
        if not rest:
            raise DocsBlockError(f"{where}: <!-- not-runnable: REASON --> needs its reason")
        return Marker(runnable=False, reason=rest)
    serve, timeout_s = False, DEFAULT_TIMEOUT_S
    for option in rest.split():
        if option == "serve":
            serve = True
        elif option.startswith("timeout="):
            try:
                timeout_s = float(option.removeprefix("timeout="))
            except ValueError:
                timeout_s = -1.0
            if not 0 < timeout_s <= 600:
                raise DocsBlockError(f"{where}: {option}: give seconds, 0 < timeout ≤ 600")
        else:
            raise DocsBlockError(
                f"{where}: unknown runnable option {option!r}; the options are serve, timeout=S"
            )
    return Marker(runnable=True, serve=serve, timeout_s=timeout_s)


def doc_files(root: Path) -> list[Path]:
    """README.md and docs/*.md, in a fixed order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def shell_blocks(root: Path) -> list[Block]:
    """Every shell block of the docs; raises DocsBlockError naming each unmarked one, and if a
    marker stands before a block that is not a shell block."""
    found: list[Block] = []
    problems: list[str] = []
    for file in doc_files(root):
        for block in fenced_blocks(file.read_text(encoding="utf-8"), str(file.relative_to(root))):
            if block.is_shell:
                found.append(block)
                if block.marker is None:
                    problems.append(
                        f"{block.where}: a shell block with no marker; put <!-- runnable --> "
                        "(or <!-- runnable: serve -->) or <!-- not-runnable: REASON --> on the "
                        "line before its fence"
                    )
            elif block.marker is not None:
                problems.append(f"{block.where}: a marker before a block that is not shell")
    if problems:
        raise DocsBlockError("\n".join(problems))
    return found


# --- commands and expected output -----------------------------------------------------------


def _script_steps(body: str, first_line: int, where: str) -> list[Step]:
    lines = body.splitlines()
    steps: list[Step] = []
    shown: list[str] | None = None  # the expected lines of the last command, while they run on

    def close() -> None:
        nonlocal shown
        if shown is not None and shown:
            last = steps[-1]
            if last.expected is not None:
                raise DocsBlockError(
                    f"{where}: line {last.line}: expected output both in a trailing comment "
                    "and on the lines after; keep one"
                )
            steps[-1] = Step(last.command, last.line, _expected("\n".join(shown), where))
        shown = None

    i = 0
    while i < len(lines):
        raw = lines[i]
        if not raw.strip():
            close()
            i += 1
        elif raw.startswith("#"):
            if shown is not None:
                shown.append(raw[2:] if raw.startswith("# ") else raw[1:])
            i += 1
        elif raw.lstrip().startswith("#"):
            i += 1  # an indented comment goes on with the prose of the line above
        else:
            close()
            start = i
            while i + 1 < len(lines) and _goes_on(lines[start : i + 1]):
                i += 1
            command = "\n".join(lines[start : i + 1])
            _refuse_heredoc(command, first_line + start, where)
            comment = trailing_comment(command)
            expected = None
            if comment is not None and comment.lstrip().startswith(("{", "[")):
                expected = _expected(comment.strip(), where)
            steps.append(Step(command, first_line + start, expected))
            shown = []
            i += 1
    close()
    return steps


def _console_steps(body: str, first_line: int, where: str) -> list[Step]:
    lines = body.splitlines()
    steps: list[Step] = []
    shown: list[str] = []

    def close() -> None:
        text = "\n".join(shown).rstrip("\n")
        if steps and text:
            last = steps[-1]
            if last.expected is not None:
                raise DocsBlockError(f"{where}: line {last.line}: expected output shown twice")
            steps[-1] = Step(last.command, last.line, _expected(text, where))
        shown.clear()

    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            close()
            start = i
            while i + 1 < len(lines) and _goes_on([lines[start][2:], *lines[start + 1 : i + 1]]):
                i += 1
            command = "\n".join([lines[start][2:], *lines[start + 1 : i + 1]])
            _refuse_heredoc(command, first_line + start, where)
            comment = trailing_comment(command)
            expected = None
            if comment is not None and comment.lstrip().startswith(("{", "[")):
                expected = _expected(comment.strip(), where)
            steps.append(Step(command, first_line + start, expected))
        elif steps:
            shown.append(lines[i])
        elif lines[i].strip():
            raise DocsBlockError(f"{where}: output before the first `$ ` command")
        i += 1
    close()
    return steps


def _goes_on(lines: list[str]) -> bool:
    """A command continues on the next line after a trailing ``\\`` or inside open quotes."""
    trailing = len(lines[-1]) - len(lines[-1].rstrip("\\"))
    return trailing % 2 == 1 or _scan("\n".join(lines)).quote_open


def _refuse_heredoc(command: str, line: int, where: str) -> None:
    if _scan(command).heredoc:
        raise DocsBlockError(
            f"{where}: line {line}: a here-document cannot be split into commands; "
            "use a quoted argument or a file"
        )


def _expected(text: str, where: str) -> Expected:
    if text.lstrip().startswith(("{", "[")):
        try:
            expected_json(text)
        except ValueError as e:
            raise DocsBlockError(f"{where}: expected output is not JSON: {e}") from None
        return Expected("json", text)
    return Expected("text", text)


def trailing_comment(command: str) -> str | None:
    """The text after an unquoted ``#`` that starts a word on the command's last line."""
    start = _scan(command).comment_at
    return None if start is None else command[start + 1 :]


@dataclass(frozen=True)
class _Scanned:
    comment_at: int | None  # the ``#`` of a comment on the last line
    quote_open: bool  # the text ends inside quotes: the command goes on
    heredoc: bool  # ``<<`` outside quotes and comments


def _scan(text: str) -> _Scanned:
    """Reads shell text as bash quotes and comments it (no expansions)."""
    quote: str | None = None
    escaped = in_comment = heredoc = False
    comment_at: int | None = None
    previous = "\n"
    for index, char in enumerate(text):
        if in_comment:
            if char == "\n":
                in_comment, comment_at = False, None
        elif escaped:
            escaped = False
        elif quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            quote = None if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and previous.isspace():
            in_comment, comment_at = True, index
        elif (
            text.startswith("<<", index) and previous != "<" and text[index + 2 : index + 3] != "<"
        ):
            heredoc = True  # `<<WORD`, not the here-string `<<<`
        previous = char
    return _Scanned(comment_at, quote is not None, heredoc)


def is_serve_command(command: str) -> bool:
    """``harombe serve`` (by any path, with options or variable assignments before it) and
    nothing else: no pipes, no second command."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return False
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if len(words) < 2 or Path(words[0]).name != "harombe" or words[1] != "serve":
        return False
    return not any(word in {"|", "&&", "||", ";", "&"} for word in words)


def _check_serve(steps: list[Step], block: Block) -> None:
    serving = [s for s in steps if s.starts_serve]
    if serving and (block.marker is None or not block.marker.serve):
        raise DocsBlockError(
            f"{block.where}: line {serving[0].line} starts harombe serve: mark the block "
            "<!-- runnable: serve --> (the test starts that line in the background)"
        )
    if len(serving) > 1:
        raise DocsBlockError(f"{block.where}: more than one harombe serve")
    if serving and serving[0].expected is not None:
        raise DocsBlockError(f"{block.where}: harombe serve runs on; it has no output to check")


# --- comparing output -----------------------------------------------------------------------


def expected_json(text: str) -> Any:
    """Expected JSON with its bare ``…`` placeholders turned into sentinels; raises ValueError."""
    out: list[str] = []
    stack: list[str] = []
    in_string = escaped = False
    last = ""  # the last significant character outside strings
    for char in text:
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string, last = False, '"'
            continue
        if char == ELLIPSIS:
            member = bool(stack) and stack[-1] == "{" and last in "{,"
            sentinel = json.dumps(_MORE if member else _ANY)  # \u0000 escaped, valid JSON
            out.append(f"{sentinel}: 0" if member else sentinel)
            last = '"'
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and stack:
            stack.pop()
        if not char.isspace():
            last = char
        out.append(char)
    return json.loads("".join(out))


def mismatch(expected: Expected, stdout: str) -> str | None:
    """Why ``stdout`` is not the output shown, or None when it is."""
    if expected.kind == "json":
        try:
            actual = json.loads(stdout)
        except ValueError:
            return f"stdout is not JSON: {stdout[:500]!r}"
        return json_mismatch(expected_json(expected.text), actual, "$")
    want = expected.text.rstrip("\n").split("\n")
    got = stdout.rstrip("\n").split("\n") if stdout else []
    for number, (w, g) in enumerate(zip(want, got, strict=False), 1):
        if not _text_matches(w, g):
            return f"line {number}: shown {w!r}, got {g!r}"
    if len(want) != len(got):
        return f"{len(want)} lines shown, {len(got)} printed: {stdout[:500]!r}"
    return None


def json_mismatch(want: Any, got: Any, at: str) -> str | None:
    """The first difference between expected (with sentinels) and actual JSON values."""
    if want == _ANY:
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{at}: shown an object, got {got!r}"
        more = want.get(_MORE) is not None
        keys = [k for k in want if k != _MORE]
        missing = [k for k in keys if k not in got]
        extra = [k for k in got if k not in want]
        if missing or (extra and not more):
            return f"{at}: keys shown {sorted(keys)}, got {sorted(got)}"
        for key in keys:
            found = json_mismatch(want[key], got[key], f"{at}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(got, list):
            return f"{at}: shown an array, got {got!r}"
        open_ended = bool(want) and want[-1] == _ANY
        head = want[:-1] if open_ended else want
        if len(got) < len(head) or (len(got) != len(head) and not open_ended):
            return f"{at}: {len(head)} elements shown, got {len(got)}"
        for index, item in enumerate(head):
            found = json_mismatch(item, got[index], f"{at}[{index}]")
            if found:
                return found
        return None
    if isinstance(want, str):
        if isinstance(got, str) and _text_matches(want, got):
            return None
        return f"{at}: shown {want!r}, got {got!r}"
    if isinstance(want, bool) or isinstance(got, bool):
        return None if want is got else f"{at}: shown {want!r}, got {got!r}"
    return None if want == got else f"{at}: shown {want!r}, got {got!r}"


def _text_matches(want: str, got: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in want.split(ELLIPSIS))
    return re.fullmatch(pattern, got, re.DOTALL) is not None

"""Shell words and commands, read the way the shell reads them (for risk analysis only).

The lexer undoes quoting (``"r"m``, ``r\\m`` and ``$'\\x72m'`` are all ``rm``), drops comments,
records command substitutions (``$(…)``, backticks, ``<(…)``) without running them, takes
here-document bodies, and splits commands at ``; & && || |`` and newlines, keeping each command's
pipeline predecessors. It never expands anything: a word with an expansion is marked dynamic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OPERATORS = ("&>>", "<<<", "<<-", ";;&", ";;", "&&", "||", "|&", ">>", ">|", "<>", ">&", "<&",
             "&>", "<<", "|", "&", ";", "(", ")", "<", ">")  # fmt: skip
REDIRECTS = {"&>>", "<<<", "<<-", ">>", ">|", "<>", ">&", "<&", "&>", "<<", "<", ">"}
_ANSI_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                 "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip


_HEX = {width: re.compile(rf"[0-9a-fA-F]{{1,{width}}}") for width in (2, 4, 8)}
_OCTAL = re.compile(r"[0-7]{0,2}")


class ShellSyntaxError(ValueError):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Word:
    text: str
    line: int
    dynamic: bool = False  # contains an expansion whose value is only known at run time
    substitutions: list[str] = field(default_factory=list)  # $(…), `…`, <(…) bodies


@dataclass
class Command:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, Word]] = field(default_factory=list)
    heredoc: str | None = None
    piped_in: bool = False
    upstream: list[Command] = field(default_factory=list)  # earlier stages of its pipeline


class _Lexer:
    def __init__(self, src: str) -> None:
        self.src = src
        self.i = 0
        self.line = 1

    def error(self, message: str) -> ShellSyntaxError:
        return ShellSyntaxError(message, self.line)

    def peek(self, n: int = 0) -> str:
        j = self.i + n
        return self.src[j] if j < len(self.src) else ""

    def take(self) -> str:
        ch = self.src[self.i]
        self.i += 1
        if ch == "\n":
            self.line += 1
        return ch

    def balanced(self, open_: str, close: str) -> str:
        """Text up to the ``close`` matching an already consumed ``open_``, quotes respected."""
        depth, start = 1, self.i
        while self.i < len(self.src):
            ch = self.take()
            if ch == "\\":
                if self.i < len(self.src):
                    self.take()
            elif ch == "'" and open_ != "`":
                self._skip_until("'")
            elif ch == '"' and open_ != "`":
                self._skip_double()
            elif ch == open_ and open_ != close:
                depth += 1
            elif ch == close:
                depth -= 1
                if depth == 0:
                    return self.src[start : self.i - 1]
        raise self.error(f"unterminated {open_}")

    def _skip_until(self, end: str) -> None:
        while self.i < len(self.src):
            if self.take() == end:
                return
        raise self.error(f"unterminated {end}")

    def _skip_double(self) -> None:
        while self.i < len(self.src):
            ch = self.take()
            if ch == "\\":
                self.take()
            elif ch == '"':
                return
        raise self.error('unterminated "')

    def dollar(self, word: Word) -> str:
        """Consume an expansion after ``$``; a lone ``$`` is literal text."""
        nxt = self.peek()
        if nxt == "(":
            self.take()
            if self.peek() == "(":  # $(( arithmetic )): no commands, but not literal either
                self.take()
                self.balanced("(", ")")
                if self.peek() == ")":
                    self.take()
            else:
                word.substitutions.append(self.balanced("(", ")"))
        elif nxt == "{":
            self.take()
            self.balanced("{", "}")
        elif nxt.isalpha() or nxt == "_":
            while self.peek().isalnum() or self.peek() == "_":
                self.take()
        elif nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.take()
        else:
            return "$"
        word.dynamic = True
        return ""

    def ansi_c(self) -> str:
        out: list[str] = []
        while True:
            if self.i >= len(self.src):
                raise self.error("unterminated $'")
            ch = self.take()
            if ch == "'":
                return "".join(out)
            if ch != "\\":
                out.append(ch)
                continue
            esc = self.take() if self.i < len(self.src) else ""
            if esc in _ANSI_ESCAPES:
                out.append(_ANSI_ESCAPES[esc])
            elif esc in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[esc]
                digits = _HEX[width].match(self.src, self.i)
                if digits:
                    self.i += len(digits.group())
                    out.append(chr(int(digits.group(), 16)))
            elif esc.isdigit():
                digits = _OCTAL.match(self.src, self.i)
                assert digits is not None
                self.i += len(digits.group())
                out.append(chr(int(esc + digits.group(), 8) & 0xFF))
            else:
                out.append("\\" + esc)

    def word(self) -> Word:
        word = Word("", self.line)
        text: list[str] = []
        while self.i < len(self.src):
            ch = self.peek()
            if ch in " \t\n;&|()<>" and not (ch in "<>" and self.peek(1) == "(" and not text):
                break
            self.take()
            if ch == "\\":
                nxt = self.take() if self.i < len(self.src) else ""
                if nxt != "\n":
                    text.append(nxt)
            elif ch == "'":
                start = self.i
                self._skip_until("'")
                text.append(self.src[start : self.i - 1])
            elif ch == "$" and self.peek() == "'":
                self.take()
                text.append(self.ansi_c())
            elif ch == '"':
                text.append(self.double_quoted(word))
            elif ch == "$":
                text.append(self.dollar(word))
            elif ch == "`":
                word.substitutions.append(self.balanced("`", "`"))
                word.dynamic = True
            elif ch in "<>" and self.peek() == "(":
                self.take()
                body = self.balanced("(", ")")
                # >(…) reads what the command writes: its body is fed generated input, as if
                # piped (``tee >(sh)`` runs the output as code).
                word.substitutions.append(body if ch == "<" else f"cat | {body}")
                word.dynamic = True
            else:
                text.append(ch)
        word.text = "".join(text)
        return word

    def double_quoted(self, word: Word) -> str:
        out: list[str] = []
        while True:
            if self.i >= len(self.src):
                raise self.error('unterminated "')
            ch = self.take()
            if ch == '"':
                return "".join(out)
            if ch == "\\" and self.peek() in '$`"\\\n':
                nxt = self.take()
                if nxt != "\n":
                    out.append(nxt)
            elif ch == "$":
                out.append(self.dollar(word))
            elif ch == "`":
                word.substitutions.append(self.balanced("`", "`"))
                word.dynamic = True
            else:
                out.append(ch)

    def heredoc_body(self, delimiter: str, strip_tabs: bool) -> str:
        """Lines after the current one up to ``delimiter``; consumes them."""
        end = self.src.find("\n", self.i)
        if end < 0:
            return ""
        body: list[str] = []
        pos = end + 1
        while pos <= len(self.src):
            nl = self.src.find("\n", pos)
            line = self.src[pos : nl if nl >= 0 else len(self.src)]
            check = line.lstrip("\t") if strip_tabs else line
            pos = (nl + 1) if nl >= 0 else len(self.src) + 1
            if check == delimiter:
                break
            body.append(line)
        # Splice the body out so the lexer resumes after the delimiter line.
        self.src = self.src[: end + 1] + "\n" * (len(body) + 1) + self.src[pos:]
        return "\n".join(body)


def parse(src: str) -> list[Command]:
    """Simple commands in ``src``, in order; raises :class:`ShellSyntaxError` if unreadable."""
    lx = _Lexer(src)
    commands: list[Command] = []
    pipeline: list[Command] = []
    current = Command()

    def close(*, piped: bool) -> None:
        nonlocal current, pipeline
        if current.words or current.redirects or current.heredoc is not None:
            commands.append(current)
            pipeline = [*pipeline, current] if piped else []
        elif not piped:
            pipeline = []
        current = Command(piped_in=piped and bool(pipeline), upstream=list(pipeline))

    while lx.i < len(lx.src):
        ch = lx.peek()
        if ch in " \t":
            lx.take()
        elif ch == "\\" and lx.peek(1) == "\n":
            lx.take(), lx.take()
        elif ch == "#":
            while lx.i < len(lx.src) and lx.peek() != "\n":
                lx.take()
        elif ch == "\n":
            lx.take()
            close(piped=False)
        elif ch in ";&|()<>" and not (ch in "<>" and lx.peek(1) == "("):
            op = next(o for o in OPERATORS if lx.src.startswith(o, lx.i))
            for _ in op:
                lx.take()
            if op in REDIRECTS:
                while lx.peek() in (" ", "\t"):
                    lx.take()
                target = lx.word()
                if op in ("<<", "<<-"):
                    current.heredoc = lx.heredoc_body(target.text, strip_tabs=op == "<<-")
                elif op == "<<<":
                    current.heredoc = None if target.dynamic else target.text
                    current.redirects.append((op, target))
                else:
                    current.redirects.append((op, target))
            else:
                close(piped=op in ("|", "|&"))
        else:
            word = lx.word()
            if word.text.isdigit() and not word.dynamic and lx.peek() in ("<", ">"):
                continue  # the file-descriptor number of a redirection such as 2>
            current.words.append(word)
    close(piped=False)
    return commands

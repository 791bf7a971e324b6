"""JavaScript tokens, for risk analysis only: strings decoded, template literals split into
their text and their ``${…}`` code, comments dropped, regular-expression literals recognised,
identifier escapes undone (``\\u0065val`` is ``eval``). Nothing is evaluated."""

from __future__ import annotations

import re
from dataclasses import dataclass

_REGEX_AFTER_WORDS = {"return", "typeof", "instanceof", "in", "of", "new", "delete", "void",
                      "throw", "case", "do", "else", "yield", "await"}  # fmt: skip
_PUNCT = ("?.", "...", "=>", "(", ")", "[", "]", "{", "}", ".", ",", ";", ":", "?", "=", "+", "-",
          "*", "%", "!", "~", "<", ">", "&", "|", "^", "/")  # fmt: skip
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT))
_SPACE = re.compile(r"\s+")
_ASCII_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"[0-9A-Za-z_.]+")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


class JSSyntaxError(ValueError):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Token:
    kind: str  # name, str, num, punct, regex
    value: str
    line: int


class Tokenizer:
    def __init__(self, src: str) -> None:
        self.src = src
        self.i = 0
        self.line = 1
        self.tokens: list[Token] = []
        self.braces: list[str] = []  # "{" for blocks, "`" for a template's ${ … }

    def error(self, message: str) -> JSSyntaxError:
        return JSSyntaxError(message, self.line)

    def char(self) -> str:
        ch = self.src[self.i]
        self.i += 1
        if ch == "\n":
            self.line += 1
        return ch

    def escape(self) -> str:
        """Decode one escape after a consumed backslash (strings and identifiers)."""
        if self.i >= len(self.src):
            raise self.error("unterminated escape")
        ch = self.char()
        if ch == "u":
            if self.src.startswith("{", self.i):
                end = self.src.find("}", self.i)
                if end < 0:
                    raise self.error("bad \\u{} escape")
                digits, self.i = self.src[self.i + 1 : end], end + 1
            else:
                digits, self.i = self.src[self.i : self.i + 4], self.i + 4
            try:
                return chr(int(digits, 16))
            except ValueError:
                raise self.error("bad \\u escape") from None
        if ch == "x":
            digits, self.i = self.src[self.i : self.i + 2], self.i + 2
            try:
                return chr(int(digits, 16))
            except ValueError:
                raise self.error("bad \\x escape") from None
        if ch == "\n":
            return ""
        return _SIMPLE_ESCAPES.get(ch, ch)

    def regex_allowed(self) -> bool:
        if not self.tokens:
            return True
        last = self.tokens[-1]
        if last.kind == "name":
            return last.value in _REGEX_AFTER_WORDS
        return last.kind == "punct" and last.value not in (")", "]", "}")

    def run(self) -> list[Token]:
        while self.i < len(self.src):
            ch = self.src[self.i]
            line = self.line
            if ch.isspace():
                match = _SPACE.match(self.src, self.i)
                assert match is not None
                self.line += match.group().count("\n")
                self.i = match.end()
            elif self.src.startswith("//", self.i):
                end = self.src.find("\n", self.i)
                self.i = len(self.src) if end < 0 else end
            elif self.src.startswith("/*", self.i):
                end = self.src.find("*/", self.i + 2)
                if end < 0:
                    raise self.error("unterminated /* comment")
                self.line += self.src.count("\n", self.i, end)
                self.i = end + 2
            elif ch in "'\"":
                self.char()
                self.tokens.append(Token("str", self.string(ch), line))
            elif ch == "`":
                self.char()
                self.template(line)
            elif ch == "}" and self.braces and self.braces[-1] == "`":
                self.braces.pop()
                self.char()
                self.template(line)
            elif ch == "/" and self.regex_allowed():
                self.char()
                self.regex(line)
            elif ch.isalpha() or ch in "_$\\" or ord(ch) > 127:
                match = _ASCII_NAME.match(self.src, self.i)
                end = match.end() if match else self.i
                if match and not (
                    end < len(self.src) and (self.src[end] == "\\" or ord(self.src[end]) > 127)
                ):
                    self.i = end
                    self.tokens.append(Token("name", match.group(), line))
                else:
                    self.tokens.append(Token("name", self.name(), line))
            elif ch.isdigit():
                match = _NUMBER.match(self.src, self.i)
                assert match is not None
                self.i += len(match.group())
                self.tokens.append(Token("num", match.group(), line))
            else:
                found = _PUNCT_RE.match(self.src, self.i)
                punct = found.group() if found else ch
                self.i += len(punct)
                if punct == "?." and self.src.startswith(("(", "["), self.i):
                    continue  # f?.(x) is a call and o?.[k] a lookup: no member follows
                if punct == "{":
                    self.braces.append("{")
                elif punct == "}" and self.braces:
                    self.braces.pop()
                self.tokens.append(Token("punct", "." if punct == "?." else punct, line))
        if any(b == "`" for b in self.braces):
            raise self.error("unterminated template literal")
        return self.tokens

    def string(self, quote: str) -> str:
        out: list[str] = []
        while True:
            if self.i >= len(self.src) or self.src[self.i] == "\n":
                raise self.error("unterminated string")
            ch = self.char()
            if ch == quote:
                return "".join(out)
            out.append(self.escape() if ch == "\\" else ch)

    def template(self, line: int) -> None:
        """Literal text up to the closing backtick or the next ``${`` (whose code follows)."""
        out = []
        while True:
            if self.i >= len(self.src):
                raise self.error("unterminated template literal")
            ch = self.char()
            if ch == "`":
                break
            if ch == "\\":
                out.append(self.escape())
            elif ch == "$" and self.src.startswith("{", self.i):
                self.i += 1
                self.braces.append("`")
                break
            else:
                out.append(ch)
        self.tokens.append(Token("str", "".join(out), line))

    def regex(self, line: int) -> None:
        in_class = False
        while True:
            if self.i >= len(self.src) or self.src[self.i] == "\n":
                raise self.error("unterminated regular expression")
            ch = self.char()
            if ch == "\\":
                self.char()
            elif ch == "[":
                in_class = True
            elif ch == "]":
                in_class = False
            elif ch == "/" and not in_class:
                break
        while self.i < len(self.src) and self.src[self.i].isalpha():
            self.i += 1
        self.tokens.append(Token("regex", "", line))

    def name(self) -> str:
        """An identifier, its ``\\u`` escapes undone. Any other backslash outside a string is
        a syntax error: raised, as the scan would otherwise stand on it for ever."""
        out = []
        while self.i < len(self.src):
            ch = self.src[self.i]
            if ch == "\\" and not self.src.startswith("\\u", self.i):
                raise self.error("a backslash outside a string that does not start a \\u escape")
            if ch == "\\":
                self.i += 1
                out.append(self.escape())
            elif ch.isalnum() or ch in "_$" or ord(ch) > 127:
                out.append(self.char())
            else:
                break
        return "".join(out)

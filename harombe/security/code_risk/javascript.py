"""Dangerous constructs in JavaScript, found through its tokens.

The tokenizer knows strings (decoding their escapes), template literals (whose ``${…}`` parts are
code), comments, regular-expression literals and identifier escapes (``\\u0065val`` is ``eval``),
so a word inside a string or comment is never a finding and an escaped name does not hide one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harombe.security.code_risk import Finding

#: Modules whose import means running programs or strings as code.
DANGEROUS_MODULES = {
    "child_process": "child_process runs other programs",
    "vm": "vm runs strings as code",
    "inspector": "inspector evaluates code in the running process",
    "worker_threads": "worker_threads can run strings as code",
}
#: Names that lead past the module system to the process's internals.
INTERNALS = {"mainModule", "binding", "_linkedBinding", "dlopen", "_load", "constructor"}
GLOBAL_OBJECTS = {"globalThis", "global", "window", "self", "process", "module"}
REFLECTED = (
    INTERNALS
    | {
        "eval",
        "Function",
        "require",
        "getBuiltinModule",
        "createRequire",
        "execve",
        "runInNewContext",
        "runInThisContext",
    }
    | DANGEROUS_MODULES.keys()
)
#: Strings that name a way to code execution wherever they appear (``const c = 'constructor';
#: [][c][c](…)``): the string is the only trace the scan can see.
TELLTALE_STRINGS = {"constructor", "__proto__", "Function", "getBuiltinModule", "createRequire",
                    "mainModule", "_linkedBinding", "dlopen", "_load"}  # fmt: skip
#: Global objects whose members can be looked up by name once they are handed to a function.
_LOOKUP_GLOBALS = {"globalThis", "global", "window", "self"}
TIMERS = {"setTimeout", "setInterval", "setImmediate"}
#: Functions that load a module by name, like ``require``.
LOADERS = {"require", "getBuiltinModule"}
#: Member names that run programs or strings as code whatever object they are reached on (the
#: object may be child_process or vm obtained some way the scan cannot follow).
DANGEROUS_MEMBERS = {
    "execSync": "execSync() runs a shell command", "execFileSync": "execFileSync() runs a "
    "program", "execFile": "execFile() runs a program", "spawnSync": "spawnSync() runs a "
    "program", "spawn": "spawn() runs a program", "execve": "execve() replaces the process",
    "runInNewContext": "runInNewContext() runs a string as code", "runInThisContext":
    "runInThisContext() runs a string as code", "runInContext": "runInContext() runs a string "
    "as code", "compileFunction": "compileFunction() builds a function from a string",
    "createRequire": "createRequire() makes a require whose loads are not checked",
}  # fmt: skip
#: Names that, assembled from pieces (``'ev' + 'al'``), mean the assembly is hiding them.
ASSEMBLED = REFLECTED | {"child_process", "node:child_process", "getBuiltinModule", "exec",
                         "execSync", "spawn", "process", "global", "globalThis"}  # fmt: skip
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


class _Tokenizer:
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
        out = []
        while self.i < len(self.src):
            ch = self.src[self.i]
            if ch == "\\" and self.src.startswith("\\u", self.i):
                self.i += 1
                out.append(self.escape())
            elif ch.isalnum() or ch in "_$" or ord(ch) > 127:
                out.append(self.char())
            else:
                break
        return "".join(out)


def _module(spec: str) -> str:
    return spec.removeprefix("node:").split("/", 1)[0]


def _matching(tokens: list[Token], i: int) -> int:
    """The index of the ``)`` closing the ``(`` at ``i`` (or the last token)."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].kind == "punct" and tokens[j].value in ("(", "[", "{"):
            depth += 1
        elif tokens[j].kind == "punct" and tokens[j].value in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    return len(tokens) - 1


def _aliases(tokens: list[Token]) -> tuple[set[str], set[str], set[str]]:
    """Names bound to a global object (``const g = globalThis``), to ``createRequire``
    (``import {createRequire as cr}``) and to a loader (``const r = createRequire(…)``)."""
    globals_, loaders, creators = set(GLOBAL_OBJECTS), set(LOADERS), {"createRequire"}
    for i in range(len(tokens) - 2):
        if tokens[i].value == "createRequire" and tokens[i + 1].value == "as":
            creators.add(tokens[i + 2].value)
    for i in range(1, len(tokens) - 2):
        name, op, value = tokens[i - 1], tokens[i], tokens[i + 1]
        if name.kind != "name" or op.value != "=" or op.kind != "punct" or value.kind != "name":
            continue
        after = tokens[i + 2].value
        if value.value in globals_ and after not in (".", "[", "("):
            globals_.add(name.value)
        elif value.value in creators and after == "(":
            loaders.add(name.value)
        elif (
            after == "." and i + 4 < len(tokens) and tokens[i + 3].value in creators
            and tokens[i + 4].value == "("
        ):  # fmt: skip
            loaders.add(name.value)  # r = m.createRequire(…), whatever m is
    return globals_, loaders, creators


def _assembled(tokens: list[Token], i: int) -> tuple[str, int] | None:
    """A string built from literal pieces starting at ``i`` (``'ev' + 'al'``,
    ``['ev', 'al'].join('')``): its value and how many pieces, or ``None``."""
    pieces = [tokens[i].value]
    j = i
    while (j + 2 < len(tokens) and tokens[j + 1].value == "+" and tokens[j + 1].kind == "punct"
           and tokens[j + 2].kind == "str"):  # fmt: skip
        pieces.append(tokens[j + 2].value)
        j += 2
    if len(pieces) > 1:
        return "".join(pieces), len(pieces)
    if i > 0 and tokens[i - 1].value == "[":
        j = i
        while j + 2 < len(tokens) and tokens[j + 1].value == "," and tokens[j + 2].kind == "str":
            pieces.append(tokens[j + 2].value)
            j += 2
        if len(pieces) > 1 and [t.value for t in tokens[j + 1 : j + 4]] == ["]", ".", "join"]:
            sep = tokens[j + 5] if j + 5 < len(tokens) else None
            joiner = sep.value if sep is not None and sep.kind == "str" else ","
            return joiner.join(pieces), len(pieces)
    return None


def _scan(tokens: list[Token]) -> list[Finding]:
    findings: list[Finding] = []
    global_names, loaders, creators = _aliases(tokens)

    def at(i: int) -> Token:
        return tokens[i] if 0 <= i < len(tokens) else Token("eof", "", 0)

    def add(tok: Token, construct: str, detail: str) -> None:
        findings.append(Finding(construct, detail, tok.line))

    def module_ref(tok: Token, spec: Token, end: Token) -> None:
        """``require(spec)`` / ``import(spec)``: literal specs are checked, others are flagged."""
        if spec.kind == "str" and end.value == ")":
            why = DANGEROUS_MODULES.get(_module(spec.value))
            if why:
                add(tok, "import", f"loads {spec.value}: {why}")
        else:
            add(tok, "computed-name", f"{tok.value}() loads a module computed at run time")

    def create_require(i: int, tok: Token) -> None:
        """``createRequire(…)('x')`` is ``require('x')``; bound to a name it is a loader
        (found by :func:`_aliases`); anything else hides what it loads."""
        if at(i + 1).value != "(":
            if at(i - 1).value not in ("{", ",", "as") or at(i + 1).value not in ("}", ",", "as"):
                add(tok, "computed-name", "createRequire is passed around, so what it loads is "
                    "unknown")  # fmt: skip
            return
        end = _matching(tokens, i + 1)
        if at(end + 1).value == "(":
            module_ref(tok, at(end + 2), at(end + 3))
        elif at(i - 1).value != "=" and not (at(i - 1).value == "." and at(i - 3).value == "="):
            add(tok, "computed-name", "createRequire() makes a require whose loads are unknown")

    for i, tok in enumerate(tokens):
        prev, nxt = at(i - 1), at(i + 1)
        member = prev.kind == "punct" and prev.value == "."
        if tok.kind == "name" and tok.value in creators:
            create_require(i, tok)
        elif tok.kind == "name" and tok.value == "Function" and prev.value != "instanceof":
            # Also as a key: ``const { Function: F } = globalThis`` destructures it.
            add(tok, "eval", "the Function constructor builds a function from a string")
        elif tok.kind == "name" and member and tok.value == "constructor":
            # x.constructor.name and comparisons are type checks; anything else may be the
            # Function constructor reached from a function value ((()=>{}).constructor).
            if not ((nxt.value == "." and at(i + 2).value == "name")
                    or nxt.value in ("===", "==", "!==", "!=", "=")):  # fmt: skip
                add(tok, "eval", ".constructor may reach the Function constructor")
        elif tok.kind == "name" and member and tok.value in DANGEROUS_MEMBERS:
            add(tok, "call", f".{tok.value}: {DANGEROUS_MEMBERS[tok.value]}")
        elif tok.kind == "name" and member:
            if tok.value in LOADERS and nxt.value == "(":
                module_ref(tok, at(i + 2), at(i + 3))
            elif tok.value in LOADERS and nxt.value != ".":
                add(tok, "computed-name", f"{tok.value} is passed around, so what it loads "
                    "is unknown")  # fmt: skip
            elif tok.value in ("eval", "Function") and at(i - 2).value in global_names:
                add(tok, "eval", f"{at(i - 2).value}.{tok.value} runs a string as code")
            elif (
                at(i - 2).value == "Reflect" and tok.value in ("get", "getOwnPropertyDescriptor")
                and nxt.value == "(" and at(i + 2).value in global_names
            ):  # fmt: skip
                add(tok, "computed-name", f"Reflect.{tok.value}({at(i + 2).value}, …) looks "
                    "up a global by name")  # fmt: skip
            elif tok.value in INTERNALS and (tok.value != "constructor" or nxt.value == "("):
                add(tok, "escape", f".{tok.value} reaches past the module system")
        elif tok.kind == "name":
            if nxt.value == ":" and prev.value in ("{", ",") and tok.value != "Function":
                if tok.value == "eval" and at(i + 2).value != "false":
                    add(tok, "eval", "eval as a key: a Worker's eval: true, or eval destructured")
                continue  # an object key
            if tok.value == "eval":
                add(tok, "eval", "eval runs a string as code")
            elif (tok.value in loaders or tok.value == "import") and nxt.value == "(":
                module_ref(tok, at(i + 2), at(i + 3))
            elif (
                tok.value in loaders
                and nxt.value == "."
                and at(i + 2).value in ("call", "apply", "bind")
            ):
                add(tok, "computed-name", f"{tok.value}.{at(i + 2).value} loads a module the "
                    "scan cannot see")  # fmt: skip
            elif (
                tok.value in loaders and nxt.value not in (".", "=")
                and prev.value not in ("{", ",", "as")
            ):  # fmt: skip
                add(tok, "computed-name", f"{tok.value} is passed around, so what it loads "
                    "is unknown")  # fmt: skip
            elif tok.value in ("from", "import") and nxt.kind == "str":
                why = DANGEROUS_MODULES.get(_module(nxt.value))
                if why:
                    add(tok, "import", f"imports {nxt.value}: {why}")
            elif tok.value in TIMERS and nxt.kind == "str":
                add(tok, "eval", f"{tok.value} with a tagged template runs it as code")
            elif tok.value in TIMERS and nxt.value == "(" and at(i + 2).kind == "str":
                add(tok, "eval", f"{tok.value}() with a string runs it as code")
            elif (
                (tok.value in _LOOKUP_GLOBALS or tok.value in global_names - GLOBAL_OBJECTS)
                and prev.value in ("(", ",") and nxt.value in (")", ",")
                and at(i - 2).value not in ("log", "info", "warn", "error", "debug")
            ):  # fmt: skip
                add(tok, "computed-name", f"hands {tok.value} to a function that can look up "
                    "any global by name")  # fmt: skip
            elif tok.value in global_names and nxt.value == "[":
                key, close = at(i + 2), at(i + 3)
                if key.kind != "str" or close.value != "]":
                    detail = f"{tok.value}[…] looks up a name computed at run time"
                    add(tok, "computed-name", detail)
        elif tok.kind == "str" and (prev.value, nxt.value) == ("[", "]") and tok.value in REFLECTED:
            add(tok, "escape", f"[{tok.value!r}] reaches {tok.value} by name")
        elif (
            tok.kind == "str"
            and _module(tok.value) in DANGEROUS_MODULES
            and (tok.value.removeprefix("node:") == _module(tok.value))
            and prev.value not in ("from", "import")
            and not (prev.value == "(" and at(i - 2).value in loaders | {"import"})
        ):
            # However it reaches a loader (a variable, .call, an object), the name is the tell.
            add(
                tok,
                "import",
                f"names the module {tok.value}: {DANGEROUS_MODULES[_module(tok.value)]}",
            )
        elif tok.kind == "str" and tok.value in TELLTALE_STRINGS:
            add(tok, "escape", f"the string {tok.value!r} names a way to run code")
        elif tok.kind == "str" and not (prev.value == "+" and at(i - 2).kind == "str"):
            built = _assembled(tokens, i)
            if built and built[0] in ASSEMBLED:
                add(tok, "computed-name", f"assembles the name {built[0]!r} from {built[1]} "
                    "pieces")  # fmt: skip
    return findings


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for JavaScript ``code``; code that does not tokenize is one ``unparseable``."""
    try:
        tokens = _Tokenizer(code).run()
    except JSSyntaxError as exc:
        return [Finding("unparseable", f"JavaScript that does not parse ({exc})", exc.line)]
    return sorted(set(_scan(tokens)), key=lambda f: (f.line or 0, f.construct, f.detail))

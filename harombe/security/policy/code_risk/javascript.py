"""Dangerous constructs in JavaScript, found through its tokens.

The tokenizer knows strings (decoding their escapes), template literals (whose ``${…}`` parts are
code), comments, regular-expression literals and identifier escapes (``\\u0065val`` is ``eval``),
so a word inside a string or comment is never a finding and an escaped name does not hide one.
"""

from __future__ import annotations

from harombe.security.policy.code_risk import (
    Finding,
    analyze_code,
    cut,
    language_for_path,
    normalize_path,
)
from harombe.security.policy.code_risk.javascript_names import (
    ASSEMBLED,
    DANGEROUS_MEMBERS,
    DANGEROUS_MODULES,
    FS_DELETERS,
    FS_SCRIPT_WRITERS,
    FS_WRITERS,
    GLOBAL_OBJECTS,
    INTERNALS,
    KERNEL_PATHS,
    LOADERS,
    LOOKUP_GLOBALS,
    REFLECTED,
    RUNTIME_MEMBERS,
    SAFE_DEVICES,
    SYSTEM_DIRS,
    TELLTALE_STRINGS,
    TIMERS,
)
from harombe.security.policy.code_risk.javascript_tokens import JSSyntaxError, Token, Tokenizer


def _module(spec: str) -> str:
    parts = spec.removeprefix("node:").split("/", 2)
    return "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]


def _spec_danger(spec: str) -> str | None:
    """Why loading the specifier ``spec`` runs something other than a module on disk."""
    lower = spec.lower()
    if lower.startswith("data:") and ("javascript" in lower or "ecmascript" in lower):
        return f"{cut(spec, 40)!r} is a data: URL, so its code is a string"
    if lower.startswith(("http://", "https://")):
        return f"{cut(spec, 60)!r} is remote code"
    if lower.endswith(".node"):
        return f"{spec!r} is a native addon"
    return None


def _fs_danger(method: str, path: str) -> tuple[str, str] | None:
    """A finding for ``fs.<method>(path)`` on a literal path outside the workspace."""
    path = normalize_path(path)
    if method in FS_DELETERS:
        bare = path.rstrip("/") or "/"
        if (
            bare in ("/", "~", ".", "..")
            or bare.startswith("../")
            or (bare.startswith(("/", "~")) and not bare.startswith(("/workspace/", "/tmp/")))
        ):
            return "delete", f"{method}() deletes {path!r}"
        return None
    if path.startswith(KERNEL_PATHS) and not path.startswith(SAFE_DEVICES):
        return "device-write", f"{method}() writes to the kernel or device file {path}"
    if path.startswith(SYSTEM_DIRS):
        return "system-write", f"{method}() writes to the system file {path}"
    return None


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


class _Scan:
    """One pass over ``tokens``: each token is judged by the first rule that its kind, its
    neighbours and the names the code binds (:func:`_aliases`) select, and at most one rule
    speaks for it. ``depth`` is the nesting of scripts inside scripts (:func:`analyze_code`)."""

    def __init__(self, tokens: list[Token], depth: int) -> None:
        self.tokens = tokens
        self.depth = depth
        self.findings: list[Finding] = []
        self.global_names, self.loaders, self.creators = _aliases(tokens)

    def run(self) -> list[Finding]:
        for i, tok in enumerate(self.tokens):
            if tok.kind == "name":
                self._name(i, tok)
            else:
                self._other(i, tok)
        return self.findings

    def at(self, i: int) -> Token:
        return self.tokens[i] if 0 <= i < len(self.tokens) else Token("eof", "", 0)

    def add(self, tok: Token, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, tok.line))

    def module_ref(self, tok: Token, spec: Token, end: Token) -> None:
        """``require(spec)`` / ``import(spec)``: literal specs are checked, others are flagged."""
        if spec.kind == "str" and (why := _spec_danger(spec.value)):
            self.add(tok, "import", f"loads native, remote or inline code: {why}")
        elif spec.kind == "str" and end.value == ")":
            why = DANGEROUS_MODULES.get(_module(spec.value))
            if why:
                self.add(tok, "import", f"loads {spec.value}: {why}")
        else:
            self.add(tok, "computed-name", f"{tok.value}() loads a module computed at run time")

    def _name(self, i: int, tok: Token) -> None:
        prev = self.at(i - 1)
        if tok.value in self.creators:
            self._create_require(i, tok)
        elif tok.value == "Function" and prev.value != "instanceof":
            # Also as a key: ``const { Function: F } = globalThis`` destructures it.
            self.add(tok, "eval", "the Function constructor builds a function from a string")
        elif prev.kind == "punct" and prev.value == ".":
            self._member(i, tok)
        elif tok.value == "ShadowRealm":
            self.add(tok, "eval", "ShadowRealm.evaluate() runs a string as code")
        elif tok.value == "with" and self.at(i + 1).value == "(":
            self.add(tok, "computed-name", "a with statement makes every bare name a lookup on "
                     "an object the scan cannot follow")  # fmt: skip
        elif tok.value == "constructor" and self.at(i + 1).value != "(":
            # const { constructor: F } = fn, or { constructor } = fn: the Function constructor.
            self.add(tok, "eval", "destructures constructor, which may be the Function "
                     "constructor")  # fmt: skip
        else:
            self._bare_name(i, tok)

    def _create_require(self, i: int, tok: Token) -> None:
        """``createRequire(…)('x')`` is ``require('x')``; bound to a name it is a loader
        (found by :func:`_aliases`); anything else hides what it loads."""
        at = self.at
        if at(i + 1).value != "(":
            if at(i - 1).value not in ("{", ",", "as") or at(i + 1).value not in ("}", ",", "as"):
                self.add(tok, "computed-name", "createRequire is passed around, so what it "
                         "loads is unknown")  # fmt: skip
            return
        end = _matching(self.tokens, i + 1)
        if at(end + 1).value == "(":
            self.module_ref(tok, at(end + 2), at(end + 3))
        elif at(i - 1).value != "=" and not (at(i - 1).value == "." and at(i - 3).value == "="):
            self.add(tok, "computed-name", "createRequire() makes a require whose loads are "
                     "unknown")  # fmt: skip

    def _member(self, i: int, tok: Token) -> None:
        """A name after a ``.``: a member of something."""
        at, nxt = self.at, self.at(i + 1)
        if tok.value == "constructor":
            # x.constructor.name and comparisons are type checks; anything else may be the
            # Function constructor reached from a function value ((()=>{}).constructor).
            if not ((nxt.value == "." and at(i + 2).value == "name")
                    or nxt.value in ("===", "==", "!==", "!=", "=")):  # fmt: skip
                self.add(tok, "eval", ".constructor may reach the Function constructor")
        elif self._fs_call(i, tok):
            pass
        elif tok.value in RUNTIME_MEMBERS.get(at(i - 2).value, ()):
            self.add(tok, "call", f"{at(i - 2).value}.{tok.value} runs programs or native code")
        elif (
            tok.value in TIMERS and at(i - 2).value in self.global_names
            and (nxt.kind == "str" or (nxt.value == "(" and at(i + 2).kind == "str"))
        ):  # fmt: skip
            self.add(tok, "eval", f"{tok.value}() with a string runs it as code")
        elif (
            tok.value == "cache" and at(i - 2).value in self.loaders
            and nxt.value in (")", ",") and at(i - 3).value in ("(", ",")
        ):  # fmt: skip
            self.add(tok, "escape", "require.cache handed to a function reaches every loaded "
                     "module")  # fmt: skip
        elif tok.value in DANGEROUS_MEMBERS:
            # The receiver is part of the finding: approving pool.spawn() never approves
            # spawn() on another object.
            receiver = at(i - 2).value if at(i - 2).kind in ("name", "str") else at(i - 2).kind
            self.add(tok, "call", f".{tok.value} on {receiver}: {DANGEROUS_MEMBERS[tok.value]}")
        else:
            self._member_lookup(i, tok)

    def _fs_call(self, i: int, tok: Token) -> bool:
        """``fs.<method>('<path>', …)``: a delete or write outside the workspace, or a script
        written from fixed text (which runs exactly that text when it is run). True when it
        is one of those, findings added."""
        at, path = self.at, self.at(i + 2)
        if at(i + 1).value != "(" or path.kind != "str":
            return False
        if tok.value in FS_DELETERS | FS_WRITERS and (why := _fs_danger(tok.value, path.value)):
            self.add(tok, why[0], why[1])
            return True
        content = at(i + 4)
        if (
            tok.value in FS_SCRIPT_WRITERS and at(i + 3).value == "," and content.kind == "str"
            and (language := language_for_path(path.value, content.value))
        ):  # fmt: skip
            for f in analyze_code(language, content.value, depth=self.depth + 1):
                self.add(tok, f.construct, f"in the script written to {path.value}: {f.detail}")
            return True
        return False

    def _member_lookup(self, i: int, tok: Token) -> None:
        """Members that load modules, run strings or reach the process's internals."""
        at, nxt = self.at, self.at(i + 1)
        if tok.value in LOADERS and nxt.value == "(":
            self.module_ref(tok, at(i + 2), at(i + 3))
        elif tok.value in LOADERS and nxt.value != ".":
            self.add(tok, "computed-name", f"{tok.value} is passed around, so what it loads "
                     "is unknown")  # fmt: skip
        elif tok.value in ("eval", "Function") and at(i - 2).value in self.global_names:
            self.add(tok, "eval", f"{at(i - 2).value}.{tok.value} runs a string as code")
        elif (
            at(i - 2).value == "Reflect" and tok.value in ("get", "getOwnPropertyDescriptor")
            and nxt.value == "(" and at(i + 2).value in self.global_names
        ):  # fmt: skip
            self.add(tok, "computed-name", f"Reflect.{tok.value}({at(i + 2).value}, …) looks "
                     "up a global by name")  # fmt: skip
        elif tok.value in INTERNALS and (tok.value != "constructor" or nxt.value == "("):
            self.add(tok, "escape", f".{tok.value} reaches past the module system")

    def _bare_name(self, i: int, tok: Token) -> None:
        """A name not after a ``.``: an object key, ``eval``, a loader, an import, a timer or
        a global handed around or indexed."""
        at, prev, nxt = self.at, self.at(i - 1), self.at(i + 1)
        if nxt.value == ":" and prev.value in ("{", ",") and tok.value != "Function":
            # An object key.
            if tok.value == "eval" and at(i + 2).value != "false":
                self.add(tok, "eval", "eval as a key: a Worker's eval: true, or eval destructured")
        elif tok.value == "eval":
            self.add(tok, "eval", "eval runs a string as code")
        elif (tok.value in self.loaders or tok.value == "import") and self._loader(i, tok):
            pass
        elif tok.value == "from" and nxt.kind == "str":
            self._import_from(tok, nxt)
        elif tok.value in TIMERS and nxt.kind == "str":
            self.add(tok, "eval", f"{tok.value} with a tagged template runs it as code")
        elif tok.value in TIMERS and nxt.value == "(" and at(i + 2).kind == "str":
            self.add(tok, "eval", f"{tok.value}() with a string runs it as code")
        else:
            self._global_use(i, tok)

    def _loader(self, i: int, tok: Token) -> bool:
        """``require``, a name bound to a loader, or ``import``: a call, a loader handed on,
        or a static import. True when it is one of those, findings added."""
        at, prev, nxt = self.at, self.at(i - 1), self.at(i + 1)
        loader = tok.value in self.loaders
        if nxt.value == "(":
            self.module_ref(tok, at(i + 2), at(i + 3))
        elif loader and nxt.value == "." and at(i + 2).value in ("call", "apply", "bind"):
            self.add(tok, "computed-name", f"{tok.value}.{at(i + 2).value} loads a module the "
                     "scan cannot see")  # fmt: skip
        elif loader and nxt.value not in (".", "=") and prev.value not in ("{", ",", "as"):
            self.add(tok, "computed-name", f"{tok.value} is passed around, so what it loads "
                     "is unknown")  # fmt: skip
        elif tok.value == "import" and nxt.kind == "str":
            self._import_from(tok, nxt)
        else:
            return False
        return True

    def _import_from(self, tok: Token, spec: Token) -> None:
        """``import 'x'`` / ``from 'x'``."""
        why = DANGEROUS_MODULES.get(_module(spec.value))
        if why:
            self.add(tok, "import", f"imports {spec.value}: {why}")
        elif why := _spec_danger(spec.value):
            self.add(tok, "import", f"imports native, remote or inline code: {why}")

    def _global_use(self, i: int, tok: Token) -> None:
        """A global object handed to a function, or indexed with a computed key."""
        at, prev, nxt = self.at, self.at(i - 1), self.at(i + 1)
        if (
            (tok.value in LOOKUP_GLOBALS or tok.value in self.global_names - GLOBAL_OBJECTS)
            and prev.value in ("(", ",") and nxt.value in (")", ",")
            and at(i - 2).value not in ("log", "info", "warn", "error", "debug")
        ):  # fmt: skip
            self.add(tok, "computed-name", f"hands {tok.value} to a function that can look up "
                     "any global by name")  # fmt: skip
        elif tok.value in self.global_names and nxt.value == "[":
            key, close = at(i + 2), at(i + 3)
            if key.kind != "str" or close.value != "]":
                detail = f"{tok.value}[…] looks up a name computed at run time"
                self.add(tok, "computed-name", detail)

    def _other(self, i: int, tok: Token) -> None:
        """Tokens that are not names: a runtime member spelt oddly, a destructuring ``=``, or
        a string."""
        at, prev = self.at, self.at(i - 1)
        member = prev.kind == "punct" and prev.value == "."
        if member and tok.value in RUNTIME_MEMBERS.get(at(i - 2).value, ()):
            self.add(tok, "call", f"{at(i - 2).value}.{tok.value} runs programs or native code")
        elif tok.kind == "punct" and tok.value == "=" and prev.value == "}":
            self._destructure(i)
        elif tok.kind == "str":
            self._string(i, tok)

    def _destructure(self, i: int) -> None:
        """``{ … } = <global>``: dangerous names destructured from a global object."""
        source = self.at(i + 1)
        if source.value not in self.global_names or self.at(i + 2).value in (".", "[", "("):
            return
        # The pattern's own "{", looked for nearby only (a pattern is short).
        start = next((j for j in range(i - 1, max(i - 200, 0) - 1, -1)
                      if self.tokens[j].value == "{"), i)  # fmt: skip
        for key in self.tokens[start:i]:
            if key.kind == "name" and key.value in REFLECTED | DANGEROUS_MEMBERS.keys():
                self.add(key, "escape", f"destructures {key.value} from {source.value}")

    def _string(self, i: int, tok: Token) -> None:
        """A string literal naming a dangerous module, global or code, or assembled into one."""
        at, prev, nxt = self.at, self.at(i - 1), self.at(i + 1)
        module = _module(tok.value)
        if (prev.value, nxt.value) == ("[", "]") and tok.value in REFLECTED:
            self.add(tok, "escape", f"[{tok.value!r}] reaches {tok.value} by name")
        elif (
            module in DANGEROUS_MODULES and tok.value.removeprefix("node:") == module
            and prev.value not in ("from", "import")
            and not (prev.value == "(" and at(i - 2).value in self.loaders | {"import"})
        ):  # fmt: skip
            # However it reaches a loader (a variable, .call, an object), the name is the tell.
            self.add(tok, "import", f"names the module {tok.value}: {DANGEROUS_MODULES[module]}")
        elif (why := _spec_danger(tok.value)) and "data:" in why:
            self.add(tok, "eval", f"a data: URL holds code as a string: {cut(tok.value, 40)!r}")
        elif tok.value in TELLTALE_STRINGS:
            self.add(tok, "escape", f"the string {tok.value!r} names a way to run code")
        elif not (prev.value == "+" and at(i - 2).kind == "str"):
            built = _assembled(self.tokens, i)
            if built and built[0] in ASSEMBLED:
                self.add(tok, "computed-name", f"assembles the name {built[0]!r} from "
                         f"{built[1]} pieces")  # fmt: skip


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for JavaScript ``code``; code that does not tokenize is one ``unparseable``."""
    try:
        tokens = Tokenizer(code).run()
    except JSSyntaxError as exc:
        return [Finding("unparseable", f"JavaScript that does not parse ({exc})", exc.line)]
    findings = _Scan(tokens, depth).run()
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

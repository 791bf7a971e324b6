"""Dangerous constructs in JavaScript, found through its tokens.

The tokenizer knows strings (decoding their escapes), template literals (whose ``${…}`` parts are
code), comments, regular-expression literals and identifier escapes (``\\u0065val`` is ``eval``),
so a word inside a string or comment is never a finding and an escaped name does not hide one.
"""

from __future__ import annotations

from harombe.security.policy.code_risk import (
    Finding,
    analyze_code,
    language_for_path,
    normalize_path,
)
from harombe.security.policy.code_risk.javascript_tokens import JSSyntaxError, Token, Tokenizer

#: Modules whose import means running programs or strings as code.
DANGEROUS_MODULES = {
    "child_process": "child_process runs other programs",
    "vm": "vm runs strings as code",
    "inspector": "inspector evaluates code in the running process",
    "repl": "repl runs what it reads as code",
    "worker_threads": "worker_threads can run strings as code",
    # Packages that wrap those, or load native code.
    "shelljs": "shelljs runs shell commands", "execa": "execa runs other programs",
    "zx": "zx runs shell commands", "cross-spawn": "cross-spawn runs other programs",
    "node-pty": "node-pty runs programs on a terminal",
    "@npmcli/promise-spawn": "promise-spawn runs other programs",
    "child-process-promise": "child-process-promise runs other programs",
    "vm2": "vm2 runs strings as code", "isolated-vm": "isolated-vm runs strings as code",
    "safe-eval": "safe-eval runs strings as code", "node-cmd": "node-cmd runs shell commands",
    "ffi-napi": "ffi-napi calls C functions", "ffi": "ffi calls C functions",
    "koffi": "koffi calls C functions", "node-ffi": "node-ffi calls C functions",
}  # fmt: skip
#: Members of runtime globals that run programs or load native code (Deno, Bun).
RUNTIME_MEMBERS = {"Deno": {"run", "Command", "dlopen", "spawn", "spawnSync"},
                   "Bun": {"$", "spawn", "spawnSync", "dlopen"}}  # fmt: skip
#: Functions that run a module given by specifier, like ``import()``.
SPEC_LOADERS = {"require", "import", "getBuiltinModule", "Worker", "Module", "_load"}
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
_LOOKUP_GLOBALS = {"globalThis", "global", "window", "self", "process"}
#: fs members that delete, and that write, the path given as their first argument.
FS_DELETERS = {"rm", "rmSync", "rmdir", "rmdirSync", "unlink", "unlinkSync"}
FS_WRITERS = {
    "writeFile",
    "writeFileSync",
    "appendFile",
    "appendFileSync",
    "createWriteStream",
    "truncate",
    "truncateSync",
    "copyFile",
    "copyFileSync",
    "symlink",
    "symlinkSync",
}
FS_SCRIPT_WRITERS = {"writeFile", "writeFileSync", "appendFile", "appendFileSync"}
_KERNEL_PATHS = ("/dev/", "/proc/", "/sys/")
_SAFE_DEVICES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/shm/")
_SYSTEM_DIRS = (
    "/etc/",
    "/bin/",
    "/sbin/",
    "/usr/",
    "/lib/",
    "/lib64/",
    "/boot/",
    "/root/",
    "/var/",
    "/opt/",
)
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


def _module(spec: str) -> str:
    parts = spec.removeprefix("node:").split("/", 2)
    return "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]


def _spec_danger(spec: str) -> str | None:
    """Why loading the specifier ``spec`` runs something other than a module on disk."""
    lower = spec.lower()
    if lower.startswith("data:") and ("javascript" in lower or "ecmascript" in lower):
        return f"{spec[:40]!r} is a data: URL, so its code is a string"
    if lower.startswith(("http://", "https://")):
        return f"{spec[:60]!r} is remote code"
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
    if path.startswith(_KERNEL_PATHS) and not path.startswith(_SAFE_DEVICES):
        return "device-write", f"{method}() writes to the kernel or device file {path}"
    if path.startswith(_SYSTEM_DIRS):
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


def _scan(tokens: list[Token], depth: int = 0) -> list[Finding]:
    findings: list[Finding] = []
    global_names, loaders, creators = _aliases(tokens)

    def at(i: int) -> Token:
        return tokens[i] if 0 <= i < len(tokens) else Token("eof", "", 0)

    def add(tok: Token, construct: str, detail: str) -> None:
        findings.append(Finding(construct, detail, tok.line))

    def module_ref(tok: Token, spec: Token, end: Token) -> None:
        """``require(spec)`` / ``import(spec)``: literal specs are checked, others are flagged."""
        if spec.kind == "str" and (why := _spec_danger(spec.value)):
            add(tok, "import", f"loads native, remote or inline code: {why}")
        elif spec.kind == "str" and end.value == ")":
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
        elif (
            tok.kind == "name" and member and tok.value in FS_DELETERS | FS_WRITERS
            and nxt.value == "(" and at(i + 2).kind == "str"
            and (fs_why := _fs_danger(tok.value, at(i + 2).value))
        ):  # fmt: skip
            add(tok, fs_why[0], fs_why[1])
        elif (
            tok.kind == "name" and member and tok.value in FS_SCRIPT_WRITERS and nxt.value == "("
            and at(i + 2).kind == "str" and at(i + 3).value == "," and at(i + 4).kind == "str"
            and (language := language_for_path(at(i + 2).value, at(i + 4).value))
        ):  # fmt: skip
            # A script written from fixed text runs exactly that text when it is run.
            for f in analyze_code(language, at(i + 4).value, depth=depth + 1):
                add(tok, f.construct, f"in the script written to {at(i + 2).value}: {f.detail}")
        elif member and tok.value in RUNTIME_MEMBERS.get(at(i - 2).value, ()):
            add(tok, "call", f"{at(i - 2).value}.{tok.value} runs programs or native code")
        elif (
            tok.kind == "name" and member and tok.value in TIMERS
            and at(i - 2).value in global_names
            and (nxt.kind == "str" or (nxt.value == "(" and at(i + 2).kind == "str"))
        ):  # fmt: skip
            add(tok, "eval", f"{tok.value}() with a string runs it as code")
        elif (
            tok.kind == "name" and member and tok.value == "cache" and at(i - 2).value in loaders
            and nxt.value in (")", ",") and at(i - 3).value in ("(", ",")
        ):  # fmt: skip
            add(tok, "escape", "require.cache handed to a function reaches every loaded module")
        elif tok.kind == "name" and member and tok.value in DANGEROUS_MEMBERS:
            # The receiver is part of the finding: approving pool.spawn() never approves
            # spawn() on another object.
            receiver = at(i - 2).value if at(i - 2).kind in ("name", "str") else at(i - 2).kind
            add(tok, "call", f".{tok.value} on {receiver}: {DANGEROUS_MEMBERS[tok.value]}")
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
        elif tok.kind == "name" and tok.value == "ShadowRealm" and not member:
            add(tok, "eval", "ShadowRealm.evaluate() runs a string as code")
        elif tok.kind == "name" and tok.value == "with" and nxt.value == "(":
            add(tok, "computed-name", "a with statement makes every bare name a lookup on an "
                "object the scan cannot follow")  # fmt: skip
        elif tok.kind == "name" and tok.value == "constructor" and nxt.value != "(":
            # const { constructor: F } = fn, or { constructor } = fn: the Function constructor.
            add(tok, "eval", "destructures constructor, which may be the Function constructor")
        elif (
            tok.kind == "punct"
            and tok.value == "="
            and prev.value == "}"
            and (nxt.value in global_names and at(i + 2).value not in (".", "[", "("))
        ):
            # The pattern's own "{", looked for nearby only (a pattern is short).
            start = next((j for j in range(i - 1, max(i - 200, 0) - 1, -1)
                          if tokens[j].value == "{"), i)  # fmt: skip
            for key in tokens[start:i]:
                if key.kind == "name" and key.value in REFLECTED | DANGEROUS_MEMBERS.keys():
                    add(key, "escape", f"destructures {key.value} from {nxt.value}")
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
                elif why := _spec_danger(nxt.value):
                    add(tok, "import", f"imports native, remote or inline code: {why}")
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
        elif tok.kind == "str" and (why := _spec_danger(tok.value)) and "data:" in why:
            add(tok, "eval", f"a data: URL holds code as a string: {tok.value[:40]!r}")
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
        tokens = Tokenizer(code).run()
    except JSSyntaxError as exc:
        return [Finding("unparseable", f"JavaScript that does not parse ({exc})", exc.line)]
    findings = _scan(tokens, depth)
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

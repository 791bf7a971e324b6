"""Dangerous constructs in shell code, found through its words rather than its characters.

:mod:`~harombe.security.code_risk.shell_syntax` reads the code the way the shell would (quotes
undone, comments dropped, pipelines kept together); this module judges each command. Command
substitutions (``$(…)``, backticks, ``<(…)``) and code handed to another interpreter
(``bash -c``, ``python3 -c``, ``node -e``, here-documents or ``echo`` piped into one) are analyzed
in their own language. Words only echoed or quoted are never findings.
"""

from __future__ import annotations

import re

from harombe.security.code_risk import Finding, analyze_code
from harombe.security.code_risk.shell_syntax import Command, ShellSyntaxError, Word, parse

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "rbash"}
PYTHONS = re.compile(r"^python(\d+(\.\d+)?)?$")
NODES = {"node", "nodejs"}
OPAQUE_INTERPRETERS = {"perl", "ruby", "php", "lua", "tclsh", "awk", "gawk", "mawk"}
DOWNLOADERS = {"curl", "wget", "fetch", "aria2c", "nc", "ncat", "netcat", "socat"}
#: Commands that run the rest of their arguments as a command; value: options taking a value.
WRAPPERS: dict[str, set[str]] = {
    "sudo": {"-u", "-g", "-C", "-D"}, "doas": {"-u"}, "command": set(), "builtin": set(),
    "exec": {"-a"}, "env": {"-u", "-C", "-S"}, "nohup": set(), "nice": {"-n"}, "time": set(),
    "timeout": {"-s", "-k"}, "stdbuf": {"-i", "-o", "-e"}, "setsid": set(), "xargs":
    {"-I", "-n", "-P", "-L", "-s", "-d", "-a", "-E"}, "busybox": set(), "chroot": set(),
    "unbuffer": set(), "ionice": {"-c", "-n"}, "taskset": set(), "flock": set(),
}  # fmt: skip
#: Wrappers whose first non-option argument is not the command (a duration, a directory…).
WRAPPER_POSITIONAL = {"timeout": 1, "chroot": 1, "taskset": 1, "flock": 1}
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "{", "!", "time", "[[", "coproc"}
SKIP_COMMANDS = {"for", "select", "case", "function", "fi", "done", "esac", "}", "in", "]]"}
SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/",
                "/dev/shm/")  # fmt: skip
DISK_TOOLS = {"mkfs", "fdisk", "sfdisk", "parted", "wipefs", "shred", "mkswap"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")


def _strip(words: list[Word]) -> list[Word]:
    """The words from the command that actually runs: assignments, keywords, wrappers dropped."""
    i = 0
    while i < len(words):
        text = words[i].text
        name = text.rsplit("/", 1)[-1]
        if _ASSIGNMENT.match(text) or text in KEYWORDS:
            i += 1
        elif text in SKIP_COMMANDS and not words[i].dynamic:
            return []
        elif name in WRAPPERS and not words[i].dynamic:
            takes_value = WRAPPERS[name]
            positional = WRAPPER_POSITIONAL.get(name, 0)
            i += 1
            while i < len(words):
                arg = words[i].text
                if arg == "--":
                    i += 1
                    break
                if arg.startswith("-") and len(arg) > 1:
                    i += 2 if arg in takes_value else 1
                elif name == "env" and _ASSIGNMENT.match(arg):
                    i += 1
                elif positional:
                    positional -= 1
                    i += 1
                else:
                    break
        else:
            return words[i:]
    return []


def _name(word: Word) -> str:
    return word.text.rsplit("/", 1)[-1]


def _is_system_path(text: str) -> bool:
    path = text.rstrip("/") or "/"
    if path in ("/", "/*", "~", "~/*", ".", "./*", "..", "*") or path.startswith(("~/", "../")):
        return True
    return path.startswith("/") and not path.startswith(("/workspace/", "/tmp/"))


def _is_device(text: str) -> bool:
    return text.startswith(("/dev/", "/proc/sys", "/proc/sysrq", "/sys/")) and not text.startswith(
        SAFE_DEVICES
    )


class _Analysis:
    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.findings: list[Finding] = []
        self.downloaded: set[str] = set()

    def add(self, word: Word, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, word.line))

    def nested(self, word: Word, language: str, code: str, context: str) -> None:
        for f in analyze_code(language, code, depth=self.depth + 1):
            self.findings.append(Finding(f.construct, f"{context}: {f.detail}", word.line))

    def command(self, cmd: Command) -> None:
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for body in word.substitutions:
                self.nested(word, "shell", body, "in a command substitution")
        for op, target in cmd.redirects:
            if op not in ("<", "<<<", "<&") and _is_device(target.text):
                self.add(target, "device-write", f"redirects output into {target.text}")
        words = _strip(cmd.words)
        if not words:
            return
        head, args = words[0], words[1:]
        if head.dynamic:
            self.add(head, "dynamic-command", "runs a command whose name is computed at run time")
            return
        name = _name(head)
        texts = [a.text for a in args]
        if head.text in self.downloaded or name in {p.rsplit("/", 1)[-1] for p in self.downloaded}:
            self.add(head, "download-exec", f"runs {head.text}, which this code downloaded")
        if name == "rm":
            self.rm(head, texts)
        elif name == "find":
            self.find(head, args)
        elif name == "dd":
            for t in texts:
                if t.startswith("of=") and _is_device(t[3:]):
                    self.add(head, "device-write", f"dd writes to {t[3:]}")
        elif name in DISK_TOOLS or name.startswith("mkfs."):
            self.add(head, "disk", f"{name} formats or wipes storage")
        elif name == "tee":
            for t in texts:
                if _is_device(t):
                    self.add(head, "device-write", f"tee writes to {t}")
        elif name == "eval":
            self.add(head, "eval", "eval runs a string as shell code")
        elif name in ("source", ".") and args and args[0].dynamic:
            self.add(head, "source-dynamic", f"{name} runs a script computed at run time")
        elif name in DOWNLOADERS:
            self.note_download(name, texts)
        self.interpreter(cmd, head, name, args)

    def rm(self, head: Word, texts: list[str]) -> None:
        recursive = force = False
        targets = []
        options_done = False
        for t in texts:
            if not options_done and t == "--":
                options_done = True
            elif not options_done and t.startswith("--"):
                recursive |= t == "--recursive"
                force |= t == "--force"
            elif not options_done and t.startswith("-") and len(t) > 1:
                recursive |= "r" in t or "R" in t
                force |= "f" in t
            else:
                targets.append(t)
        if recursive and force:
            self.add(head, "rm-rf", f"rm -rf {' '.join(targets)}".rstrip())
        elif recursive and any(_is_system_path(t) for t in targets):
            self.add(head, "rm-rf", f"rm -r {' '.join(targets)}")

    def find(self, head: Word, args: list[Word]) -> None:
        texts = [a.text for a in args]
        roots = [t for t in texts[: next((i for i, t in enumerate(texts) if t.startswith("-")),
                                         len(texts))]]  # fmt: skip
        if "-delete" in texts and (not roots or any(_is_system_path(r) for r in roots)):
            self.add(head, "rm-rf", f"find {' '.join(roots) or '.'} -delete")
        for i, t in enumerate(texts):
            if t in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(i + 1, len(texts)) if texts[j] in (";", "+")),
                           len(texts))  # fmt: skip
                self.command(Command(words=args[i + 1 : end]))

    def note_download(self, name: str, texts: list[str]) -> None:
        for i, t in enumerate(texts):
            if t in ("-o", "--output", "-O", "--output-document") and i + 1 < len(texts):
                if not (name == "curl" and t == "-O"):
                    self.downloaded.add(texts[i + 1])
            elif t.startswith("--output-document="):
                self.downloaded.add(t.split("=", 1)[1])
        if name == "wget" or "-O" in texts:  # saved under the URL's last path component
            for t in texts:
                if "://" in t:
                    self.downloaded.add(t.rstrip("/").rsplit("/", 1)[-1])

    def interpreter(self, cmd: Command, head: Word, name: str, args: list[Word]) -> None:
        language: str | None
        inline_flags: tuple[str, ...]
        if name in SHELLS:
            language, inline_flags = "shell", ("c",)
        elif PYTHONS.match(name):
            language, inline_flags = "python", ("c",)
        elif name in NODES:
            language, inline_flags = "javascript", ("e", "p", "-eval", "-print")
        elif name in OPAQUE_INTERPRETERS:
            language, inline_flags = None, ("e", "E", "r")
        else:
            return
        script: Word | None = None
        i = 0
        while i < len(args):
            arg = args[i]
            text = arg.text
            flags = text[1:] if text.startswith("-") and len(text) > 1 else ""
            is_inline = flags in inline_flags or (
                bool(flags) and not flags.startswith("-") and language != "javascript"
                and inline_flags[0] in flags
            )  # fmt: skip
            if is_inline:
                code = args[i + 1] if i + 1 < len(args) else None
                if code is None:
                    return
                self.inline(head, name, language, code)
                return
            if flags in ("m",):
                return  # python -m module: runs an installed module, not code from here
            if name in ("awk", "gawk", "mawk") and not flags:
                self.awk(head, text)
                return
            if not flags:
                script = arg
                break
            i += 1
        if script is not None and script.text not in ("-", "/dev/stdin"):
            if script.dynamic:
                self.add(script, "dynamic-script", f"{name} runs a script computed at run time")
            elif script.text in self.downloaded:
                self.add(script, "download-exec", f"{name} runs {script.text}, just downloaded")
            return
        if cmd.heredoc is not None and language is not None:
            self.nested(head, language, cmd.heredoc, f"in code fed to {name}")
        elif cmd.heredoc is None and any(op == "<<<" for op, _ in cmd.redirects):
            self.add(head, "dynamic-script", f"{name} runs code computed at run time")
        elif cmd.piped_in:
            fed = _literal_output(cmd.upstream) if len(cmd.upstream) == 1 else None
            if fed is not None and language is not None:
                self.nested(head, language, fed, f"in code piped into {name}")
                return
            sources = {_name(s[0]) for up in cmd.upstream if (s := _strip(up.words))}
            if sources & DOWNLOADERS:
                self.add(head, "download-exec", f"downloads code and pipes it into {name}")
            else:
                self.add(head, "pipe-exec", f"pipes generated code into {name}")

    def inline(self, head: Word, name: str, language: str | None, code: Word) -> None:
        if code.dynamic:
            self.add(code, "dynamic-script", f"{name} runs code computed at run time")
        elif language is None:
            self.add(code, "opaque-code", f"inline {name} code is not analyzed")
        else:
            self.nested(code, language, code.text, f"in {name} inline code")

    def awk(self, head: Word, program: str) -> None:
        if re.search(r"\bsystem\s*\(|\|\s*getline|\|\s*\"|\|&", program):
            self.add(head, "awk-exec", "awk program runs commands")


def _literal_output(stages: list[Command]) -> str | None:
    """What a lone ``echo …`` or ``cat <<EOF`` stage writes, when it is fixed text."""
    words = _strip(stages[0].words)
    if not words or any(w.dynamic for w in words):
        return None
    if _name(words[0]) == "echo" and not any(w.text.startswith("-") for w in words[1:]):
        return " ".join(w.text for w in words[1:])
    if _name(words[0]) == "cat" and len(words) == 1 and stages[0].heredoc is not None:
        return stages[0].heredoc
    return None


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for shell ``code``; code that does not parse is one ``unparseable`` finding."""
    try:
        commands = parse(code)
    except ShellSyntaxError as exc:
        return [Finding("unparseable", f"shell that does not parse ({exc})", exc.line)]
    analysis = _Analysis(depth)
    for command in commands:
        analysis.command(command)
    return sorted(set(analysis.findings), key=lambda f: (f.line or 0, f.construct, f.detail))

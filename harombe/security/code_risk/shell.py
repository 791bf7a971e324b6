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
    "parallel": set(), "watch": {"-n"}, "strace": {"-o", "-e"}, "nsenter": set(),
    "unshare": set(), "setpriv": set(), "runuser": {"-u"}, "su": {"-c"}, "script": set(),
}  # fmt: skip
#: Wrappers whose first non-option argument is not the command (a duration, a directory…).
WRAPPER_POSITIONAL = {"timeout": 1, "chroot": 1, "taskset": 1, "flock": 1}
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "{", "!", "time", "[[", "coproc"}
SKIP_COMMANDS = {"for", "select", "case", "function", "fi", "done", "esac", "}", "in", "]]"}
SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/",
                "/dev/shm/")  # fmt: skip
DISK_TOOLS = {"mkfs", "fdisk", "sfdisk", "parted", "wipefs", "shred", "mkswap", "mke2fs",
              "blkdiscard", "sgdisk", "gdisk", "cfdisk", "badblocks", "hdparm"}  # fmt: skip
#: Commands that delete what they are given; run in bulk (``xargs``, ``find -exec``) they are
#: as broad as ``rm -rf``.
DELETERS = {"rm", "unlink", "shred", "rmdir"}
#: Interpreters and commands whose inline code fetching something makes later runs suspect.
_FETCH_WORDS = re.compile(
    r"urlretrieve|urlopen|requests\.|httpx|urllib|http\.get|https?://|fetch\(|socket|"
    r"\bcurl\b|\bwget\b|download",
    re.IGNORECASE,
)
#: Commands that fetch files whose names the scan does not track (clones, copies from hosts).
REMOTE_COPIERS = {"git", "scp", "sftp", "ftp", "tftp", "rsync", "svn", "hg", "lftp"}
#: Commands that unpack an archive: fed something downloaded, what they write was downloaded.
EXTRACTORS = {"tar", "bsdtar", "unzip", "gunzip", "gzip", "bunzip2", "bzip2", "xz", "unxz",
              "zstd", "7z", "cpio", "base64", "openssl", "uudecode"}  # fmt: skip
_STANDARD_BINS = ("/bin/", "/usr/bin/", "/usr/local/bin/", "/sbin/", "/usr/sbin/")
#: Where a write or truncation damages the system rather than data.
_SYSTEM_DIRS = ("/etc", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/boot", "/root", "/var")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")


def _via_xargs(words: list[Word]) -> bool:
    """Whether the command runs through ``xargs`` (once per input item, in bulk)."""
    stripped = _strip(words)
    for word in words[: len(words) - len(stripped)]:
        if _name(word) in ("xargs", "parallel") and not word.dynamic:
            return True
    return False


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


def _base(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1]


def _is_system_file(text: str) -> bool:
    return any(text == d or text.startswith(d + "/") for d in _SYSTEM_DIRS)


class _Analysis:
    def __init__(self, depth: int, downloaded: set[str] | None = None) -> None:
        self.depth = depth
        self.findings: list[Finding] = []
        #: Names (last path component) of files this script fetched from the network.
        self.downloaded: set[str] = set() if downloaded is None else downloaded
        #: Inline code fetched something to a file whose name cannot be read statically.
        self.fetched_unknown = False

    def add(self, word: Word, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, word.line))

    def nested(self, word: Word, language: str, code: str, context: str) -> None:
        if language != "shell" and _FETCH_WORDS.search(code):
            self.fetched_unknown = True
        if language == "shell" and self.depth < 4:
            # Same script state: a file downloaded outside ``bash -c`` and run inside it counts.
            inner = _Analysis(self.depth + 1, self.downloaded)
            inner.fetched_unknown = self.fetched_unknown
            findings = inner.run(code)
            self.fetched_unknown |= inner.fetched_unknown
        else:
            findings = analyze_code(language, code, depth=self.depth + 1)
        for f in findings:
            self.findings.append(Finding(f.construct, f"{context}: {f.detail}", word.line))

    def run(self, code: str) -> list[Finding]:
        try:
            commands = parse(code)
        except ShellSyntaxError as exc:
            return [Finding("unparseable", f"shell that does not parse ({exc})", exc.line)]
        for command in commands:
            self.command(command)
        return self.findings

    def is_downloaded(self, text: str) -> bool:
        return bool(text) and _base(text) in self.downloaded

    def runs_local_file(self, word: Word, how: str) -> None:
        """``word`` names a file being run: downloaded by this script, it is CRITICAL."""
        if self.is_downloaded(word.text):
            self.add(word, "download-exec", f"{how} {word.text}, which this code downloaded")
        elif self.fetched_unknown and not word.text.startswith(_STANDARD_BINS):
            self.add(word, "download-exec", f"{how} {word.text} after this code fetched files")

    def command(self, cmd: Command) -> None:
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for body in word.substitutions:
                self.nested(word, "shell", body, "in a command substitution")
        for op, target in cmd.redirects:
            if op not in ("<", "<<<", "<&") and _is_device(target.text):
                self.add(target, "device-write", f"redirects output into {target.text}")
            elif op in (">", ">|", "&>") and _is_system_file(target.text):
                self.add(target, "system-write", f"overwrites the system file {target.text}")
        words = _strip(cmd.words)
        self.note_fetch_output(cmd, words)
        if not words:
            return
        head, args = words[0], words[1:]
        if head.dynamic:
            self.add(head, "dynamic-command", "runs a command whose name is computed at run time")
            return
        name = _name(head)
        texts = [a.text for a in args]
        if "/" in head.text:
            self.runs_local_file(head, "runs")
        elif self.is_downloaded(head.text):
            self.add(head, "download-exec", f"runs {head.text}, which this code downloaded")
        if name in DELETERS and _via_xargs(cmd.words):
            self.add(head, "bulk-delete", f"xargs {name} deletes every path it is fed")
        if name == "rm":
            self.rm(head, texts)
        elif name == "find":
            self.find(head, args)
        elif name == "dd":
            for t in texts:
                if t.startswith("of=") and (_is_device(t[3:]) or _is_system_file(t[3:])):
                    self.add(head, "device-write", f"dd writes to {t[3:]}")
        elif name in DISK_TOOLS or name.startswith(("mkfs.", "mkfs")):
            self.add(head, "disk", f"{name} formats or wipes storage")
        elif name == "truncate":
            for t in texts:
                if _is_device(t) or _is_system_file(t) or _is_system_path(t):
                    self.add(head, "truncate", f"truncate empties {t}")
        elif name in ("chmod", "chown", "chgrp") and any(
            t in ("-R", "--recursive") or (t.startswith("-") and "R" in t) for t in texts
        ):
            targets = [t for t in texts if not t.startswith("-")][1:]
            if any(_is_system_path(t) for t in targets):
                self.add(head, "chmod-system", f"{name} -R changes {' '.join(targets)}")
        elif name == "tee":
            for t in texts:
                if _is_device(t):
                    self.add(head, "device-write", f"tee writes to {t}")
        elif name == "eval":
            self.add(head, "eval", "eval runs a string as shell code")
        elif name in ("source", ".") and args and args[0].dynamic:
            self.add(head, "source-dynamic", f"{name} runs a script computed at run time")
        elif name in ("source", ".") and args:
            self.runs_local_file(args[0], name)
        elif name in ("mv", "cp", "ln", "install", "rsync") and len(texts) >= 2:
            operands = [t for t in texts if not t.startswith("-")]
            if any(self.is_downloaded(t) for t in operands[:-1]):
                self.downloaded.add(_base(operands[-1]))
        if name in DOWNLOADERS:
            self.note_download(name, texts)
        elif name in REMOTE_COPIERS and (name != "rsync" or any(":" in t for t in texts)):
            self.fetched_unknown |= name != "git" or bool({"clone", "pull", "fetch"} & set(texts))
        elif name in EXTRACTORS and (
            any(self.is_downloaded(t) for t in texts)
            or any((s := _strip(up.words)) and _name(s[0]) in DOWNLOADERS for up in cmd.upstream)
        ):
            self.fetched_unknown = True  # what it unpacks came from the network
        self.interpreter(cmd, head, name, args)

    def note_fetch_output(self, cmd: Command, words: list[Word]) -> None:
        """Files a pipeline with a downloader in it writes (``curl … > f``, ``| tee f``)."""
        stages = [_strip(up.words) for up in cmd.upstream] + [words]
        if not any(s and _name(s[0]) in DOWNLOADERS for s in stages):
            return
        for op, target in cmd.redirects:
            if op in (">", ">>", ">|", "&>", "&>>") and not target.dynamic:
                self.downloaded.add(_base(target.text))
        if words and _name(words[0]) == "tee":
            self.downloaded.update(_base(w.text) for w in words[1:] if not w.text.startswith("-"))

    def rm(self, head: Word, texts: list[str]) -> None:
        recursive = force = False
        targets = []
        options_done = False
        for t in texts:
            if not options_done and t == "--":
                options_done = True
            elif not options_done and t.startswith("--"):
                # GNU accepts any unambiguous prefix: --rec, --recur, --f, --forc.
                option = t.split("=", 1)[0]
                recursive |= len(option) >= 3 and "--recursive".startswith(option)
                force |= len(option) >= 3 and "--force".startswith(option)
                if "--no-preserve-root".startswith(option) and len(option) >= 5:
                    self.add(head, "rm-rf", "rm --no-preserve-root may delete /")
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
        if "-delete" in texts:
            self.add(head, "rm-rf", f"find {' '.join(roots) or '.'} -delete")
        for i, t in enumerate(texts):
            if t in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(i + 1, len(texts)) if texts[j] in (";", "+")),
                           len(texts))  # fmt: skip
                inner = _strip(args[i + 1 : end])
                if inner and _name(inner[0]) in DELETERS:
                    self.add(head, "bulk-delete", f"find {t} {_name(inner[0])} deletes every "
                             "file it finds")  # fmt: skip
                self.command(Command(words=args[i + 1 : end]))

    def note_download(self, name: str, texts: list[str]) -> None:
        """Remember the files a downloader writes, in every option spelling."""
        # The letter whose value is the output file: curl -o, wget/aria2c -O, nc has none.
        letter = "o" if name in ("curl", "aria2c", "fetch") else "O"
        remote_name = name != "curl"  # wget saves under the URL's name unless told otherwise
        for i, t in enumerate(texts):
            value: str | None = None
            if t.startswith("--"):
                option, eq, rest = t.partition("=")
                if option in ("--output", "--output-document", "--out", "--output-file"):
                    value = rest if eq else (texts[i + 1] if i + 1 < len(texts) else None)
                elif option in ("--remote-name", "--remote-name-all"):
                    remote_name = True
            elif t.startswith("-") and len(t) > 1:
                flags = t[1:]
                if name == "curl" and "O" in flags:
                    remote_name = True
                if letter in flags:
                    after = flags[flags.index(letter) + 1 :]
                    value = after or (texts[i + 1] if i + 1 < len(texts) else None)
            if value and value != "-":
                self.downloaded.add(_base(value))
        if remote_name:
            for t in texts:
                if "://" in t:
                    self.downloaded.add(_base(t.split("?", 1)[0]))

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
            else:
                self.runs_local_file(script, f"{name} runs")
            return
        for op, target in cmd.redirects:
            if op == "<" and self.is_downloaded(target.text):
                self.add(target, "download-exec", f"{name} runs {target.text}, which this code "
                         "downloaded")  # fmt: skip
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
    findings = _Analysis(depth).run(code)
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

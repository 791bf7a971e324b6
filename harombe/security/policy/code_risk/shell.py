"""Dangerous constructs in shell code, found through its words rather than its characters.

:mod:`.shell_syntax` reads the code the way the shell would (quotes
undone, comments dropped, pipelines kept together); this module judges each command. Command
substitutions (``$(…)``, backticks, ``<(…)``) and code handed to another interpreter
(``bash -c``, ``python3 -c``, ``node -e``, here-documents or ``echo`` piped into one) are analyzed
in their own language. Words only echoed or quoted are never findings.
"""

from __future__ import annotations

import re

from harombe.security.policy.code_risk import (
    Finding,
    analyze_code,
    language_for_path,
    normalize_path,
)
from harombe.security.policy.code_risk.shell_programs import (
    BRACE,
    COMMAND_STRING_OPTIONS,
    DELETERS,
    DISK_TOOLS,
    DOWNLOADERS,
    EXTRACTORS,
    FETCH_WORDS,
    NODES,
    OPAQUE_INTERPRETERS,
    PRELOAD_VARIABLES,
    PYTHON_VALUE_OPTIONS,
    PYTHONS,
    REMOTE_COPIERS,
    SAFE_DEVICES,
    SHELL_VALUE_OPTIONS,
    SHELLS,
    SOCKET_EXEC,
    STANDARD_BINS,
    STDIN_FILES,
    SYSTEM_DIRS,
    TAR_COMMAND_OPTIONS,
    download_targets,
    expand_braces,
    literal_output,
    prog,
    sed_executes,
    sed_scripts,
    unwrap,
    via_xargs,
    xargs_placeholder,
)
from harombe.security.policy.code_risk.shell_syntax import Command, ShellSyntaxError, Word, parse


def _is_system_path(text: str) -> bool:
    path = normalize_path(text).rstrip("/") or "/"
    if path in ("/", "/*", "~", "~/*", ".", "./*", "..", "*") or path.startswith(("~/", "../")):
        return True
    return path.startswith("/") and not path.startswith(("/workspace/", "/tmp/"))


def _is_device(text: str) -> bool:
    text = normalize_path(text)
    return text.startswith(("/dev/", "/proc/sys", "/proc/sysrq", "/sys/")) and not text.startswith(
        SAFE_DEVICES
    )


def _base(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1]


def _is_system_file(text: str) -> bool:
    text = normalize_path(text)
    return any(text == d or text.startswith(d + "/") for d in SYSTEM_DIRS)


class _Analysis:
    def __init__(self, depth: int, downloaded: set[str] | None = None) -> None:
        self.depth = depth
        self.findings: list[Finding] = []
        #: Names (last path component) of files this script fetched from the network.
        self.downloaded: set[str] = set() if downloaded is None else downloaded
        #: Inline code fetched something to a file whose name cannot be read statically.
        self.fetched_unknown = False
        #: Names made to mean another command (``alias x=rm``, ``ln -s /bin/rm x``): the
        #: words they stand for.
        self.renamed: dict[str, list[str]] = {}
        #: Files this script wrote with fixed text (``cat > x.sh <<EOF``, ``echo … > x``),
        #: by name; those whose language was known were analyzed when written.
        self.written: dict[str, str] = {}
        self.written_analyzed: set[str] = set()
        #: What ``find -exec`` replaces in the command it runs, while that command is judged.
        self.placeholder: str | None = None

    def add(self, word: Word, construct: str, detail: str) -> None:
        self.findings.append(Finding(construct, detail, word.line))

    def nested(self, word: Word, language: str, code: str, context: str) -> None:
        if language != "shell" and FETCH_WORDS.search(code):
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

    def runs_local_file(self, word: Word, how: str, language: str | None = "shell") -> None:
        """``word`` names a file being run: downloaded by this script, it is CRITICAL; written
        by this script with fixed text, that text is analyzed as ``language``."""
        base = _base(word.text)
        if base in self.written and base not in self.written_analyzed and language:
            self.written_analyzed.add(base)
            content = self.written[base]
            language = language_for_path(word.text, content) or language
            self.nested(word, language, content, f"{how} {word.text}, written by this code")
        if self.is_downloaded(word.text):
            self.add(word, "download-exec", f"{how} {word.text}, which this code downloaded")
        elif self.fetched_unknown and not word.text.startswith(STANDARD_BINS):
            self.add(word, "download-exec", f"{how} {word.text} after this code fetched files")

    def command(self, cmd: Command) -> None:
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for body in word.substitutions:
                self.nested(word, "shell", body, "in a command substitution")
        for op, target in cmd.redirects:
            if op not in ("<", "<<<", "<&") and _is_device(target.text):
                self.add(target, "device-write", f"redirects output into {target.text}")
            elif op in (">", ">|", "&>", ">>", "&>>") and _is_system_file(target.text):
                self.add(target, "system-write", f"overwrites the system file {target.text}")
        if any(BRACE.match(w.text) for w in cmd.words if not w.dynamic):
            cmd = Command(expand_braces(cmd.words), cmd.redirects, cmd.heredoc, cmd.piped_in,
                          cmd.upstream)  # fmt: skip
        self.command_strings(cmd.words)
        words = unwrap(cmd.words)
        self.native_loads(cmd.words, words)
        self.note_fetch_output(cmd, words)
        self.note_written(cmd, words)
        if not words:
            return
        head, args = words[0], words[1:]
        meant = self.renamed.get(prog(head)) if not head.dynamic else None
        if meant and meant[0] != prog(head):
            # x -rf / after ln -s /bin/rm x is rm -rf /.
            replaced = [Word(t, head.line) for t in meant] + args
            self.command(Command(replaced, cmd.redirects, cmd.heredoc, cmd.piped_in, cmd.upstream))
            return
        if head.dynamic:
            self.add(head, "dynamic-command", "runs a command whose name is computed at run time")
            return
        name = prog(head)
        texts = [a.text for a in args]
        if "/" in head.text:
            self.runs_local_file(head, "runs")
        elif self.is_downloaded(head.text):
            self.add(head, "download-exec", f"runs {head.text}, which this code downloaded")
        if name in DELETERS and via_xargs(cmd.words):
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
                elif _is_system_file(t):
                    self.add(head, "system-write", f"tee overwrites the system file {t}")
        elif name in ("alias", "trap") and args:
            # alias NAME='code' and trap 'code' SIGNAL define code that runs later.
            for arg in args[:1] if name == "trap" else args:
                body = arg.text.partition("=")[2] if name == "alias" else arg.text
                if arg.dynamic:
                    self.add(arg, "dynamic-script", f"{name} defines code computed at run time")
                elif body:
                    self.nested(arg, "shell", body, f"in code defined by {name}")
                    if name == "alias" and (alias := arg.text.partition("=")[0]):
                        self.renamed[alias] = body.split()
        elif name in SOCKET_EXEC and any(
            t in SOCKET_EXEC[name] or t.split("=", 1)[0] in SOCKET_EXEC[name] for t in texts
        ):
            self.add(head, "socket-exec", f"{name} connects a socket to a program it runs")
        elif name == "socat" and any(
            t.upper().startswith(("EXEC:", "SYSTEM:")) or ",EXEC:" in t.upper() for t in texts
        ):
            self.add(head, "socket-exec", "socat connects a socket to a program it runs")
        elif name == "sed":
            self.sed(head, args)
        elif name == "eval":
            self.add(head, "eval", "eval runs a string as shell code")
        elif (
            name in ("source", ".")
            and args
            and (args[0].dynamic or args[0].text.startswith(STDIN_FILES))
        ):
            self.add(head, "source-dynamic", f"{name} runs a script computed at run time")
        elif name in ("source", ".") and args:
            self.runs_local_file(args[0], name)
        elif name in ("mv", "cp", "ln", "install", "rsync") and len(texts) >= 2:
            operands = [t for t in texts if not t.startswith("-")]
            if any(self.is_downloaded(t) for t in operands[:-1]):
                self.downloaded.add(_base(operands[-1]))
            if len(operands) == 2 and operands[0].startswith(STANDARD_BINS):
                # A program copied or linked under another name is still that program.
                self.renamed[_base(operands[1])] = [_base(operands[0])]
        if name in DOWNLOADERS:
            self.note_download(name, texts)
        elif name in REMOTE_COPIERS and (name != "rsync" or any(":" in t for t in texts)):
            self.fetched_unknown |= name != "git" or bool({"clone", "pull", "fetch"} & set(texts))
        elif name in EXTRACTORS and (
            any(self.is_downloaded(t) for t in texts)
            or any((s := unwrap(up.words)) and prog(s[0]) in DOWNLOADERS for up in cmd.upstream)
        ):
            self.fetched_unknown = True  # what it unpacks came from the network
        self.interpreter(cmd, head, name, args)

    def note_fetch_output(self, cmd: Command, words: list[Word]) -> None:
        """Files a pipeline with a downloader in it writes (``curl … > f``, ``| tee f``)."""
        stages = [unwrap(up.words) for up in cmd.upstream] + [words]
        if not any(s and prog(s[0]) in DOWNLOADERS for s in stages):
            return
        for op, target in cmd.redirects:
            if op in (">", ">>", ">|", "&>", "&>>") and not target.dynamic:
                self.downloaded.add(_base(target.text))
        if words and prog(words[0]) == "tee":
            self.downloaded.update(_base(w.text) for w in words[1:] if not w.text.startswith("-"))

    def note_written(self, cmd: Command, words: list[Word]) -> None:
        """Scripts written from fixed text (a here-document into ``cat``/``tee``, ``echo`` or
        ``printf`` redirected into a file): analyzed now when their language shows (by name
        or ``#!``), else when they are run."""
        if not words or any(w.dynamic for w in words):
            return
        name = prog(words[0])
        content: str | None = None
        if name in ("cat", "tee") and cmd.heredoc is not None:
            content = cmd.heredoc
        elif name in ("echo", "printf"):
            texts = [w.text for w in words[1:] if not w.text.startswith("-")]
            content = " ".join(texts).replace("\\n", "\n")
        if content is None:
            return
        targets = [t for op, t in cmd.redirects if op in (">", ">>", ">|", "&>") and not t.dynamic]
        if name == "tee":
            targets += [w for w in words[1:] if not w.text.startswith("-")]
        for target in targets:
            base = _base(target.text)
            self.written[base] = (
                self.written.get(base, "") + content
                if any(op == ">>" for op, _ in cmd.redirects)
                else content
            )
            language = language_for_path(target.text, content)
            if language is not None:
                self.written_analyzed.add(base)
                self.nested(target, language, content, f"in the script written to {target.text}")

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
                inner = unwrap(args[i + 1 : end])
                if inner and prog(inner[0]) in DELETERS:
                    self.add(head, "bulk-delete", f"find {t} {prog(inner[0])} deletes every "
                             "file it finds")  # fmt: skip
                self.placeholder = "{}"  # find substitutes each path for {}
                self.command(Command(words=args[i + 1 : end]))
                self.placeholder = None

    def note_download(self, name: str, texts: list[str]) -> None:
        """Remember the files a downloader writes, in every option spelling."""
        self.downloaded |= download_targets(name, texts)

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
            language, inline_flags = None, OPAQUE_INTERPRETERS[name]
        elif name == "deno" and args and args[0].text == "eval":
            if len(args) > 1:
                self.inline(head, name, "javascript", args[-1])
            return
        else:
            return
        script: Word | None = None
        i = 0
        while i < len(args):
            arg = args[i]
            text = arg.text
            flags = text[1:] if text.startswith("-") and len(text) > 1 else ""
            option, eq, attached = flags.partition("=")
            if eq and option in inline_flags:  # node --eval=CODE
                self.inline(head, name, language, Word(attached, arg.line, arg.dynamic))
                return
            if language == "python" and flags and not flags.startswith("-") and "c" in flags:
                code_at = flags.index("c") + 1
                if code_at < len(flags):  # python3 -cCODE: the rest of the word is the code
                    self.inline(head, name, language, Word(flags[code_at:], arg.line,
                                                             arg.dynamic))  # fmt: skip
                    return
            is_inline = flags in inline_flags or (
                bool(flags) and not flags.startswith("-") and bool(inline_flags)
                and (
                    set(flags) <= {"p", "e", "i"} if language == "javascript"
                    else inline_flags[0] in flags
                )
            )  # fmt: skip
            if (language == "python" and text in PYTHON_VALUE_OPTIONS) or (
                language == "shell" and text in SHELL_VALUE_OPTIONS
            ):
                i += 2
                continue
            if is_inline:
                code = args[i + 1] if i + 1 < len(args) else None
                if code is None:
                    return
                placeholder = self.placeholder or xargs_placeholder(cmd.words)
                if placeholder and placeholder in code.text:
                    self.add(code, "dynamic-script", f"{name} runs code with {placeholder} "
                             "replaced by input it is fed")  # fmt: skip
                self.inline(head, name, language, code)
                return
            if flags in ("m",):
                return  # python -m module: runs an installed module, not code from here
            if name in ("awk", "gawk", "mawk"):
                for other in args:  # the program is any operand (-v x=1, -F: take values)
                    if not other.text.startswith("-"):
                        self.awk(head, other.text)
                return
            if not flags:
                script = arg
                break
            i += 1
        if script is not None and script.text not in ("-", "/dev/stdin"):
            if script.dynamic:
                self.add(script, "dynamic-script", f"{name} runs a script computed at run time")
            else:
                self.runs_local_file(script, f"{name} runs", language)
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
            fed = literal_output(cmd.upstream) if len(cmd.upstream) == 1 else None
            if fed is not None and language is not None:
                self.nested(head, language, fed, f"in code piped into {name}")
                return
            sources = {prog(s[0]) for up in cmd.upstream if (s := unwrap(up.words))}
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

    def command_strings(self, words: list[Word]) -> None:
        """Wrappers given a whole command line as one value (``su -c 'cmd'``,
        ``env -S 'cmd'``, ``watch 'cmd'``): the value is shell code, analyzed as such."""
        stripped = unwrap(words)
        prefix = words[: len(words) - len(stripped)] if stripped else words
        for i, word in enumerate(prefix):
            name = prog(word)
            if word.dynamic:
                continue
            if name == "parallel" and any(w.text == ":::" for w in words[i + 1 :]):
                # parallel ::: 'cmd1' 'cmd2' runs each argument as a command line.
                start = next(j for j in range(i + 1, len(words)) if words[j].text == ":::")
                for arg in words[start + 1 :]:
                    if arg.text not in (":::", "::::"):
                        self.nested(arg, "shell", arg.text, "in a command parallel runs")
                continue
            if name == "watch":
                rest = [w for w in words[i + 1 :] if not w.text.startswith("-")]
                if rest and rest[0].text.isdigit() and i + 1 < len(words) and \
                        words[i + 1].text in ("-n", "--interval"):  # fmt: skip
                    rest = rest[1:]
                if rest:
                    self.nested(word, "shell", " ".join(w.text for w in rest), "in watch")
                continue
            short, long = COMMAND_STRING_OPTIONS.get(name, ("", ""))
            if not short:
                continue
            for j in range(i + 1, len(words)):
                text = words[j].text
                value: Word | None = None
                if long and text.startswith(long + "="):
                    value = Word(text[len(long) + 1 :], words[j].line, words[j].dynamic)
                elif text == long or (
                    text.startswith("-") and not text.startswith("--") and short in text
                ):
                    after = text[text.index(short) + 1 :] if text != long else ""
                    if after:
                        value = Word(after, words[j].line, words[j].dynamic)
                    elif j + 1 < len(words):
                        value = words[j + 1]
                if value is not None:
                    if value.dynamic:
                        self.add(value, "dynamic-script", f"{name} runs a command computed at "
                                 "run time")  # fmt: skip
                    else:
                        self.nested(value, "shell", value.text, f"in the command {name} runs")
                    break

    def native_loads(self, all_words: list[Word], words: list[Word]) -> None:
        """Native code loaded into programs (``LD_PRELOAD=x.so``, ``enable -f x.so``) and
        archivers told to run commands (``tar --to-command``)."""
        prefix = all_words[: len(all_words) - len(words)] if words else all_words
        exporting = bool(words) and prog(words[0]) in ("export", "declare", "typeset",
                                                        "readonly", "env")  # fmt: skip
        for word in [*prefix, *(words[1:] if exporting else [])]:
            if word.text.startswith(PRELOAD_VARIABLES):
                variable = word.text.split("=", 1)[0]
                self.add(word, "native", f"{variable} loads a native library into programs")
        if not words:
            return
        name, texts = prog(words[0]), [w.text for w in words[1:]]
        if name == "enable" and any(t.startswith("-") and "f" in t for t in texts):
            self.add(words[0], "native", "enable -f loads a native library as a builtin")
        elif name in ("tar", "bsdtar", "gtar") and any(
            t.startswith(TAR_COMMAND_OPTIONS) or t in ("-I", "-F") for t in texts
        ):
            self.add(words[0], "archive-exec", f"{name} is told to run a command")

    def sed(self, head: Word, args: list[Word]) -> None:
        """GNU sed runs commands: the ``e`` command and the ``e`` flag of ``s``."""
        if any(sed_executes(script) for script in sed_scripts([a.text for a in args])):
            self.add(head, "sed-exec", "sed script runs a command (e)")

    def awk(self, head: Word, program: str) -> None:
        if re.search(r"\bsystem\s*\(|\|\s*getline|\|\s*\"|\|&", program):
            self.add(head, "awk-exec", "awk program runs commands")


def analyze(code: str, *, depth: int = 0) -> list[Finding]:
    """Findings for shell ``code``; code that does not parse is one ``unparseable`` finding."""
    findings = _Analysis(depth).run(code)
    return sorted(set(findings), key=lambda f: (f.line or 0, f.construct, f.detail))

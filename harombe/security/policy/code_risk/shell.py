"""Dangerous constructs in shell code, found through its words rather than its characters.

:mod:`.shell_syntax` reads the code the way the shell would (quotes
undone, comments dropped, pipelines kept together); this module judges each command. Command
substitutions (``$(…)``, backticks, ``<(…)``) and code handed to another interpreter
(``bash -c``, ``python3 -c``, ``node -e``, here-documents or ``echo`` piped into one) are analyzed
in their own language. Words only echoed or quoted are never findings.
"""

from __future__ import annotations

import re

from harombe.security.policy.code_risk import Finding, analyze_code, language_for_path
from harombe.security.policy.code_risk.shell_inline import (
    command_strings,
    interpreter_language,
    locate_code,
    native_loads,
)
from harombe.security.policy.code_risk.shell_programs import (
    BRACE,
    DELETERS,
    DISK_TOOLS,
    DOWNLOADERS,
    EXTRACTORS,
    FETCH_WORDS,
    REMOTE_COPIERS,
    SOCKET_EXEC,
    STANDARD_BINS,
    STDIN_FILES,
    base_name,
    download_targets,
    expand_braces,
    is_device,
    is_system_file,
    is_system_path,
    literal_output,
    prog,
    rm_options,
    sed_executes,
    sed_scripts,
    unwrap,
    via_xargs,
    xargs_placeholder,
)
from harombe.security.policy.code_risk.shell_syntax import Command, ShellSyntaxError, Word, parse


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
        return bool(text) and base_name(text) in self.downloaded

    def runs_local_file(self, word: Word, how: str, language: str | None = "shell") -> None:
        """``word`` names a file being run: downloaded by this script, it is CRITICAL; written
        by this script with fixed text, that text is analyzed as ``language``."""
        base = base_name(word.text)
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
        """Judge one simple command: its substitutions, redirects and wrapped command strings,
        then the program it runs (:meth:`program`)."""
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for body in word.substitutions:
                self.nested(word, "shell", body, "in a command substitution")
        for op, target in cmd.redirects:
            if op not in ("<", "<<<", "<&") and is_device(target.text):
                self.add(target, "device-write", f"redirects output into {target.text}")
            elif op in (">", ">|", "&>", ">>", "&>>") and is_system_file(target.text):
                self.add(target, "system-write", f"overwrites the system file {target.text}")
        if any(BRACE.match(w.text) for w in cmd.words if not w.dynamic):
            cmd = Command(expand_braces(cmd.words), cmd.redirects, cmd.heredoc, cmd.piped_in,
                          cmd.upstream)  # fmt: skip
        for wrapped in command_strings(cmd.words):
            if wrapped.dynamic_from is not None:
                self.add(wrapped.anchor, "dynamic-script", f"{wrapped.dynamic_from} runs a "
                         "command computed at run time")  # fmt: skip
            else:
                self.nested(wrapped.anchor, "shell", wrapped.text, wrapped.context)
        words = unwrap(cmd.words)
        for word, construct, detail in native_loads(cmd.words, words):
            self.add(word, construct, detail)
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
        elif head.dynamic:
            self.add(head, "dynamic-command", "runs a command whose name is computed at run time")
        else:
            self.program(cmd, head, args)

    def program(self, cmd: Command, head: Word, args: list[Word]) -> None:
        """The program ``head`` names, run with ``args``: what it destroys, defines, copies or
        downloads, and any code it is an interpreter for."""
        name = prog(head)
        texts = [a.text for a in args]
        if "/" in head.text:
            self.runs_local_file(head, "runs")
        elif self.is_downloaded(head.text):
            self.add(head, "download-exec", f"runs {head.text}, which this code downloaded")
        if name in DELETERS and via_xargs(cmd.words):
            self.add(head, "bulk-delete", f"xargs {name} deletes every path it is fed")
        if not self.destroys(head, name, args, texts):
            self.runs_or_renames(head, name, args, texts)
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

    def destroys(self, head: Word, name: str, args: list[Word], texts: list[str]) -> bool:
        """Programs that delete, wipe, truncate or overwrite: True when ``name`` is one (its
        findings added, if any)."""
        if name == "rm":
            self.rm(head, texts)
        elif name == "find":
            self.find(head, args)
        elif name == "dd":
            for t in texts:
                if t.startswith("of=") and (is_device(t[3:]) or is_system_file(t[3:])):
                    self.add(head, "device-write", f"dd writes to {t[3:]}")
        elif name in DISK_TOOLS or name.startswith(("mkfs.", "mkfs")):
            self.add(head, "disk", f"{name} formats or wipes storage")
        elif name == "truncate":
            for t in texts:
                if is_device(t) or is_system_file(t) or is_system_path(t):
                    self.add(head, "truncate", f"truncate empties {t}")
        elif name in ("chmod", "chown", "chgrp") and any(
            t in ("-R", "--recursive") or (t.startswith("-") and "R" in t) for t in texts
        ):
            targets = [t for t in texts if not t.startswith("-")][1:]
            if any(is_system_path(t) for t in targets):
                self.add(head, "chmod-system", f"{name} -R changes {' '.join(targets)}")
        elif name == "tee":
            for t in texts:
                if is_device(t):
                    self.add(head, "device-write", f"tee writes to {t}")
                elif is_system_file(t):
                    self.add(head, "system-write", f"tee overwrites the system file {t}")
        else:
            return False
        return True

    def runs_or_renames(self, head: Word, name: str, args: list[Word], texts: list[str]) -> None:
        """Programs that define code for later (``alias``, ``trap``), run code or connect a
        socket to a program, or copy a program under another name."""
        if name in ("alias", "trap") and args:
            self.defines(name, args)
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
                self.downloaded.add(base_name(operands[-1]))
            if len(operands) == 2 and operands[0].startswith(STANDARD_BINS):
                # A program copied or linked under another name is still that program.
                self.renamed[base_name(operands[1])] = [base_name(operands[0])]

    def defines(self, name: str, args: list[Word]) -> None:
        """``alias NAME='code'`` and ``trap 'code' SIGNAL`` define code that runs later."""
        for arg in args[:1] if name == "trap" else args:
            body = arg.text.partition("=")[2] if name == "alias" else arg.text
            if arg.dynamic:
                self.add(arg, "dynamic-script", f"{name} defines code computed at run time")
            elif body:
                self.nested(arg, "shell", body, f"in code defined by {name}")
                if name == "alias" and (alias := arg.text.partition("=")[0]):
                    self.renamed[alias] = body.split()

    def note_fetch_output(self, cmd: Command, words: list[Word]) -> None:
        """Files a pipeline with a downloader in it writes (``curl … > f``, ``| tee f``)."""
        stages = [unwrap(up.words) for up in cmd.upstream] + [words]
        if not any(s and prog(s[0]) in DOWNLOADERS for s in stages):
            return
        for op, target in cmd.redirects:
            if op in (">", ">>", ">|", "&>", "&>>") and not target.dynamic:
                self.downloaded.add(base_name(target.text))
        if words and prog(words[0]) == "tee":
            self.downloaded.update(
                base_name(w.text) for w in words[1:] if not w.text.startswith("-")
            )

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
            base = base_name(target.text)
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
        options = rm_options(texts)
        if options.no_preserve_root:
            self.add(head, "rm-rf", "rm --no-preserve-root may delete /")
        if options.recursive and options.force:
            self.add(head, "rm-rf", f"rm -rf {' '.join(options.targets)}".rstrip())
        elif options.recursive and any(is_system_path(t) for t in options.targets):
            self.add(head, "rm-rf", f"rm -r {' '.join(options.targets)}")

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
        """Code handed to interpreter ``name``: inline, as a script file, or on its standard
        input (:func:`~.shell_inline.locate_code` finds which)."""
        spec = interpreter_language(name)
        if spec is None:
            if name == "deno" and len(args) > 1 and args[0].text == "eval":
                self.inline(head, name, "javascript", args[-1])
            return
        language, inline_flags = spec
        found = locate_code(name, language, inline_flags, args)
        if found.how == "inline":
            self.inline(head, name, language, found.words[0])
        elif found.how == "fed-inline":
            code = found.words[0]
            placeholder = self.placeholder or xargs_placeholder(cmd.words)
            if placeholder and placeholder in code.text:
                self.add(code, "dynamic-script", f"{name} runs code with {placeholder} "
                         "replaced by input it is fed")  # fmt: skip
            self.inline(head, name, language, code)
        elif found.how == "awk":
            for program in found.words:
                self.awk(head, program.text)
        elif found.how == "script" and found.words[0].text not in ("-", "/dev/stdin"):
            script = found.words[0]
            if script.dynamic:
                self.add(script, "dynamic-script", f"{name} runs a script computed at run time")
            else:
                self.runs_local_file(script, f"{name} runs", language)
        elif found.how in ("script", "stdin"):
            self.stdin_code(cmd, head, name, language)

    def stdin_code(self, cmd: Command, head: Word, name: str, language: str | None) -> None:
        """Code an interpreter reads from standard input: a downloaded file, a here-document,
        a here-string, or a pipeline's output."""
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

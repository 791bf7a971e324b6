"""Code a shell command line carries for something else to run: command strings given to
wrappers (``su -c 'cmd'``, ``watch 'cmd'``, ``parallel ::: 'cmd'``), the code or script given to
an interpreter (``python3 -c``, ``node -e``, ``bash script.sh``) and native libraries loaded
into programs (``LD_PRELOAD=x.so``, ``enable -f``, ``tar --to-command``).

Pure functions over parsed words: they say where the code is; :mod:`.shell` judges it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harombe.security.policy.code_risk.shell_programs import (
    COMMAND_STRING_OPTIONS,
    NODES,
    OPAQUE_INTERPRETERS,
    PRELOAD_VARIABLES,
    PYTHON_VALUE_OPTIONS,
    PYTHONS,
    SHELL_VALUE_OPTIONS,
    SHELLS,
    TAR_COMMAND_OPTIONS,
    prog,
    unwrap,
)
from harombe.security.policy.code_risk.shell_syntax import Word

#: A finding as the pure helpers report it: where, the construct, the detail.
RawFinding = tuple[Word, str, str]


@dataclass(frozen=True)
class CommandString:
    """Shell code a wrapper runs: ``text`` at ``anchor``, described by ``context``. When
    ``dynamic_from`` names the wrapper, the command is computed at run time and cannot be
    read."""

    anchor: Word
    text: str
    context: str
    dynamic_from: str | None = None


@dataclass(frozen=True)
class CodeArgument:
    """Where an interpreter's command line puts its code.

    ``inline``: ``words[0]`` is the code (``-c CODE``, ``--eval=CODE``, ``-cCODE``);
    ``fed-inline``: the same, given as the word after the option, so an ``xargs`` or ``find``
    placeholder in it is input-fed code; ``script``: ``words[0]`` names the script run;
    ``awk``: ``words`` are the operands, any of which may be the awk program; ``stdin``: the
    code comes from standard input; ``none``: no code of this command line is run here (a
    module, ``python -m``, or an option with its code missing)."""

    how: Literal["inline", "fed-inline", "script", "awk", "stdin", "none"]
    words: tuple[Word, ...] = ()


def command_strings(words: list[Word]) -> list[CommandString]:
    """The command lines wrappers are given as one value (``su -c 'cmd'``, ``env -S 'cmd'``,
    ``watch 'cmd'``, ``parallel ::: 'cmd1' 'cmd2'``), in the order they appear."""
    found: list[CommandString] = []
    stripped = unwrap(words)
    prefix = words[: len(words) - len(stripped)] if stripped else words
    for i, word in enumerate(prefix):
        name = prog(word)
        if word.dynamic:
            continue
        if name == "parallel" and any(w.text == ":::" for w in words[i + 1 :]):
            # parallel ::: 'cmd1' 'cmd2' runs each argument as a command line.
            start = next(j for j in range(i + 1, len(words)) if words[j].text == ":::")
            found += [CommandString(arg, arg.text, "in a command parallel runs")
                      for arg in words[start + 1 :] if arg.text not in (":::", "::::")]  # fmt: skip
        elif name == "watch":
            rest = [w for w in words[i + 1 :] if not w.text.startswith("-")]
            if rest and rest[0].text.isdigit() and i + 1 < len(words) and \
                    words[i + 1].text in ("-n", "--interval"):  # fmt: skip
                rest = rest[1:]
            if rest:
                found.append(CommandString(word, " ".join(w.text for w in rest), "in watch"))
        elif value := _option_command(name, words[i + 1 :]):
            dynamic_from = name if value.dynamic else None
            found.append(
                CommandString(value, value.text, f"in the command {name} runs", dynamic_from)
            )
    return found


def _option_command(name: str, words: list[Word]) -> Word | None:
    """The value of the option of wrapper ``name`` that takes a whole command line
    (:data:`COMMAND_STRING_OPTIONS`): ``-c CMD``, ``-cCMD``, ``--command=CMD``."""
    short, long = COMMAND_STRING_OPTIONS.get(name, ("", ""))
    if not short:
        return None
    for j, word in enumerate(words):
        text = word.text
        if long and text.startswith(long + "="):
            return Word(text[len(long) + 1 :], word.line, word.dynamic)
        if text == long or (text.startswith("-") and not text.startswith("--") and short in text):
            after = text[text.index(short) + 1 :] if text != long else ""
            if after:
                return Word(after, word.line, word.dynamic)
            if j + 1 < len(words):
                return words[j + 1]
    return None


def native_loads(all_words: list[Word], words: list[Word]) -> list[RawFinding]:
    """Native code loaded into programs (``LD_PRELOAD=x.so``, ``enable -f x.so``) and
    archivers told to run commands (``tar --to-command``). ``words`` is ``all_words`` with
    its wrappers and assignments taken off (:func:`unwrap`)."""
    found: list[RawFinding] = []
    prefix = all_words[: len(all_words) - len(words)] if words else all_words
    exporting = bool(words) and prog(words[0]) in ("export", "declare", "typeset",
                                                    "readonly", "env")  # fmt: skip
    for word in [*prefix, *(words[1:] if exporting else [])]:
        if word.text.startswith(PRELOAD_VARIABLES):
            variable = word.text.split("=", 1)[0]
            found.append((word, "native", f"{variable} loads a native library into programs"))
    if not words:
        return found
    name, texts = prog(words[0]), [w.text for w in words[1:]]
    if name == "enable" and any(t.startswith("-") and "f" in t for t in texts):
        found.append((words[0], "native", "enable -f loads a native library as a builtin"))
    elif name in ("tar", "bsdtar", "gtar") and any(
        t.startswith(TAR_COMMAND_OPTIONS) or t in ("-I", "-F") for t in texts
    ):
        found.append((words[0], "archive-exec", f"{name} is told to run a command"))
    return found


def interpreter_language(name: str) -> tuple[str | None, tuple[str, ...]] | None:
    """For an interpreter, the language its code is analyzed as (``None``: not analyzed) and
    its options that take inline code; ``None`` for any other program."""
    if name in SHELLS:
        return "shell", ("c",)
    if PYTHONS.match(name):
        return "python", ("c",)
    if name in NODES:
        return "javascript", ("e", "p", "-eval", "-print")
    if name in OPAQUE_INTERPRETERS:
        return None, OPAQUE_INTERPRETERS[name]
    return None


def locate_code(
    name: str, language: str | None, inline_flags: tuple[str, ...], args: list[Word]
) -> CodeArgument:
    """Where interpreter ``name`` (:func:`interpreter_language`) finds its code in ``args``:
    the first option that carries code, or the first operand (the script), skipping the
    values of options that take one."""
    i = 0
    while i < len(args):
        arg = args[i]
        text = arg.text
        flags = text[1:] if text.startswith("-") and len(text) > 1 else ""
        option, eq, attached = flags.partition("=")
        if eq and option in inline_flags:  # node --eval=CODE
            return CodeArgument("inline", (Word(attached, arg.line, arg.dynamic),))
        if language == "python" and flags and not flags.startswith("-") and "c" in flags:
            code_at = flags.index("c") + 1
            if code_at < len(flags):  # python3 -cCODE: the rest of the word is the code
                return CodeArgument("inline", (Word(flags[code_at:], arg.line, arg.dynamic),))
        if (language == "python" and text in PYTHON_VALUE_OPTIONS) or (
            language == "shell" and text in SHELL_VALUE_OPTIONS
        ):
            i += 2
            continue
        if _is_inline_option(flags, language, inline_flags):
            return CodeArgument("fed-inline", (args[i + 1],)) if i + 1 < len(args) else _NONE
        if flags in ("m",):
            return _NONE  # python -m module: runs an installed module, not code from here
        if name in ("awk", "gawk", "mawk"):
            # The program is any operand (-v x=1, -F: take values).
            return CodeArgument("awk", tuple(a for a in args if not a.text.startswith("-")))
        if not flags:
            return CodeArgument("script", (arg,))
        i += 1
    return CodeArgument("stdin")


_NONE = CodeArgument("none")


def _is_inline_option(flags: str, language: str | None, inline_flags: tuple[str, ...]) -> bool:
    """``-c`` and its bundles (``-ec``, ``-xc``; node's ``-pe``), or a long inline option."""
    if flags in inline_flags:
        return True
    if not flags or flags.startswith("-") or not inline_flags:
        return False
    if language == "javascript":
        return set(flags) <= {"p", "e", "i"}
    return inline_flags[0] in flags

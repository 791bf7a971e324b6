"""What the shell analyzer knows about programs: interpreters, wrappers, downloaders, deleters,
and the few programs whose arguments are code (``sed`` scripts, brace expansions). Data and
small pure helpers only; :mod:`.shell` judges commands with them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harombe.security.policy.code_risk import normalize_path
from harombe.security.policy.code_risk.shell_syntax import Command, Word

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "rbash"}
PYTHONS = re.compile(r"^python(\d+(\.\d+)?)?$")
NODES = {"node", "nodejs", "bun"}
#: Interpreters whose inline code is not analyzed, with the options that take inline code.
OPAQUE_INTERPRETERS: dict[str, tuple[str, ...]] = {
    "perl": ("e", "E"), "ruby": ("e",), "php": ("r",), "lua": ("e",), "tclsh": (),
    "awk": (), "gawk": (), "mawk": (), "Rscript": ("e",), "R": ("e",), "julia": ("e",),
    "expect": ("c",), "pwsh": ("c", "Command"), "guile": ("c",), "racket": ("e",),
    "osascript": ("e",), "gdb": ("ex",), "jshell": (),
}  # fmt: skip
#: Options of Python that take a value (the next word is not the script).
PYTHON_VALUE_OPTIONS = {"-X", "-W", "-Q", "--check-hash-based-pycs"}
#: Options of the shells that take a value (``bash -O extglob -c …``).
SHELL_VALUE_OPTIONS = {"-O", "+O", "-o", "+o", "--rcfile", "--init-file"}
#: Wrappers with an option whose value is a whole shell command line (``su -c 'cmd'``).
COMMAND_STRING_OPTIONS: dict[str, tuple[str, str]] = {
    "su": ("c", "--command"), "runuser": ("c", "--command"), "script": ("c", "--command"),
    "flock": ("c", "--command"), "env": ("S", "--split-string"), "sudo": ("", ""),
}  # fmt: skip
#: Programs that connect a socket to a program they run (reverse and bind shells).
SOCKET_EXEC = {"nc": ("-e", "-c"), "ncat": ("-e", "-c", "--exec", "--sh-exec", "--lua-exec"),
               "netcat": ("-e", "-c")}  # fmt: skip
#: The dynamic loader, which runs any program named after its options.
LOADER = re.compile(r"^(ld\.so|ld-linux[\w.-]*\.so(\.\d+)*|ld-musl[\w.-]*\.so(\.\d+)*)$")
BRACE = re.compile(r"^([^{}]*)\{([^{}]*,[^{}]*)\}([^{}]*)$")
#: Environment variables that make every program load a given native library.
PRELOAD_VARIABLES = ("LD_PRELOAD=", "LD_AUDIT=")
#: tar options whose value is a command tar runs.
TAR_COMMAND_OPTIONS = ("--to-command", "--checkpoint-action=exec", "--use-compress-program",
                        "--info-script", "--new-volume-script", "--rsh-command")  # fmt: skip
#: Files that are the script's own standard input.
STDIN_FILES = ("/dev/stdin", "/dev/fd/", "/proc/self/fd/")
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
    "ld.so": {"--library-path", "--preload", "--audit", "--argv0"},
}  # fmt: skip
#: Wrappers whose first non-option argument is not the command (a duration, a directory…).
WRAPPER_POSITIONAL = {"timeout": 1, "chroot": 1, "taskset": 1, "flock": 1}
#: ``time`` is not here: as a wrapper its ``-p`` is skipped too.
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "{", "!", "[[", "coproc"}
SKIP_COMMANDS = {"for", "select", "case", "function", "fi", "done", "esac", "}", "in", "]]"}
SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/",
                "/dev/shm/")  # fmt: skip
DISK_TOOLS = {"mkfs", "fdisk", "sfdisk", "parted", "wipefs", "shred", "mkswap", "mke2fs",
              "blkdiscard", "sgdisk", "gdisk", "cfdisk", "badblocks", "hdparm"}  # fmt: skip
#: Commands that delete what they are given; run in bulk (``xargs``, ``find -exec``) they are
#: as broad as ``rm -rf``.
DELETERS = {"rm", "unlink", "shred", "rmdir"}
#: Interpreters and commands whose inline code fetching something makes later runs suspect.
FETCH_WORDS = re.compile(
    r"urlretrieve|urlopen|requests\.|httpx|urllib|http\.get|https?://|fetch\(|socket|"
    r"\bcurl\b|\bwget\b|download",
    re.IGNORECASE,
)
#: Commands that fetch files whose names the scan does not track (clones, copies from hosts).
REMOTE_COPIERS = {"git", "scp", "sftp", "ftp", "tftp", "rsync", "svn", "hg", "lftp"}
#: Commands that unpack an archive: fed something downloaded, what they write was downloaded.
EXTRACTORS = {"tar", "bsdtar", "unzip", "gunzip", "gzip", "bunzip2", "bzip2", "xz", "unxz",
              "zstd", "7z", "cpio", "base64", "openssl", "uudecode"}  # fmt: skip
STANDARD_BINS = ("/bin/", "/usr/bin/", "/usr/local/bin/", "/sbin/", "/usr/sbin/")
#: Where a write or truncation damages the system rather than data.
SYSTEM_DIRS = ("/etc", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/boot", "/root", "/var")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")


SED_ADDRESS = re.compile(r"^\s*(?:(?:\d+|\$|/(?:[^/\\]|\\.)*/)(?:\s*,\s*(?:\d+|\$|"
                          r"/(?:[^/\\]|\\.)*/))?)?\s*!?\s*")  # fmt: skip


def sed_executes(script: str) -> bool:
    """Whether a sed script has an ``e`` command or an ``s`` command with the ``e`` flag."""
    for piece in re.split(r"[;\n]", script):
        address = SED_ADDRESS.match(piece)
        body = piece[address.end() :] if address else piece
        if body[:1] == "e" and (len(body) == 1 or body[1] in " \t"):
            return True
        if body[:1] == "s" and len(body) > 1:
            delim = body[1]
            parts = re.split(r"(?<!\\)" + re.escape(delim), body[2:])
            if len(parts) >= 3 and "e" in parts[2]:
                return True
    return False


def expand_braces(words: list[Word]) -> list[Word]:
    """Words after one level of brace expansion (``{rm,-rf,/}`` is ``rm -rf /``)."""
    out: list[Word] = []
    for word in words:
        match = None if word.dynamic else BRACE.match(word.text)
        if match is None:
            out.append(word)
            continue
        prefix, body, suffix = match.groups()
        out += [Word(f"{prefix}{alt}{suffix}", word.line, False, word.substitutions)
                for alt in body.split(",")]  # fmt: skip
    return out


def sed_scripts(texts: list[str]) -> list[str]:
    """The scripts a ``sed`` command line runs: ``-e``/``--expression`` values, else its first
    operand (``-f`` files are not read)."""
    scripts: list[str] = []
    i = 0
    while i < len(texts):
        text = texts[i]
        if text in ("-e", "--expression") and i + 1 < len(texts):
            scripts.append(texts[i + 1])
            i += 2
            continue
        if text.startswith("--expression="):
            scripts.append(text.partition("=")[2])
        elif text in ("-f", "--file"):
            i += 2
            continue
        elif not text.startswith("-") and not scripts:
            scripts.append(text)
        i += 1
    return scripts


def via_xargs(words: list[Word]) -> bool:
    """Whether the command runs through ``xargs`` (once per input item, in bulk)."""
    stripped = unwrap(words)
    for word in words[: len(words) - len(stripped)]:
        if prog(word) in ("xargs", "parallel") and not word.dynamic:
            return True
    return False


def unwrap(words: list[Word]) -> list[Word]:
    """The words from the command that actually runs: assignments, keywords, wrappers dropped."""
    i = 0
    while i < len(words):
        text = words[i].text
        name = text.rsplit("/", 1)[-1]
        if ASSIGNMENT.match(text) or text in KEYWORDS:
            i += 1
        elif text == "function" and not words[i].dynamic:
            i += 2  # function NAME { body }: the body's first command follows
        elif text in SKIP_COMMANDS and not words[i].dynamic:
            return []
        elif (name in WRAPPERS or LOADER.match(name)) and not words[i].dynamic:
            takes_value = WRAPPERS.get(name, WRAPPERS["ld.so"])
            positional = WRAPPER_POSITIONAL.get(name, 0)
            i += 1
            while i < len(words):
                arg = words[i].text
                if arg == "--":
                    i += 1
                    break
                if arg.startswith("-") and len(arg) > 1:
                    i += 2 if arg in takes_value else 1
                elif name == "env" and ASSIGNMENT.match(arg):
                    i += 1
                elif positional:
                    positional -= 1
                    i += 1
                else:
                    break
        else:
            return words[i:]
    return []


def prog(word: Word) -> str:
    return word.text.rsplit("/", 1)[-1]


def xargs_placeholder(words: list[Word]) -> str | None:
    """The string ``xargs -I R`` (or ``-i``, ``--replace``) or ``parallel`` replaces with its
    input in the command it runs, if the command runs through one."""
    for i, word in enumerate(words):
        name = prog(word)
        if name == "parallel":
            return "{}"
        if name != "xargs":
            continue
        for j in range(i + 1, len(words)):
            text = words[j].text
            if text == "-I" and j + 1 < len(words):
                return words[j + 1].text
            if text.startswith("-I") and len(text) > 2:
                return text[2:]
            if text in ("-i", "--replace"):
                return "{}"
            if text.startswith(("--replace=", "-i")):
                return text.split("=", 1)[1] if "=" in text else text[2:]
    return None


def base_name(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1]


def download_targets(name: str, texts: list[str]) -> set[str]:
    """The names (last path component) of the files a downloader command line writes, in
    every option spelling: ``curl -o``/``-O``/``--output=``, ``wget -O``/its default name."""
    found: set[str] = set()
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
            found.add(base_name(value))
    if remote_name:
        for t in texts:
            if "://" in t:
                found.add(base_name(t.split("?", 1)[0]))
    return found


def literal_output(stages: list[Command]) -> str | None:
    """What a lone ``echo …`` or ``cat <<EOF`` stage writes, when it is fixed text."""
    words = unwrap(stages[0].words)
    if not words or any(w.dynamic for w in words):
        return None
    if prog(words[0]) == "echo" and not any(w.text.startswith("-") for w in words[1:]):
        return " ".join(w.text for w in words[1:])
    if prog(words[0]) == "cat" and len(words) == 1 and stages[0].heredoc is not None:
        return stages[0].heredoc
    return None


def is_system_path(text: str) -> bool:
    """``text`` names (or globs) the root, the home or a parent directory, or anything outside
    ``/workspace`` and ``/tmp``."""
    path = normalize_path(text).rstrip("/") or "/"
    if path in ("/", "/*", "~", "~/*", ".", "./*", "..", "*") or path.startswith(("~/", "../")):
        return True
    return path.startswith("/") and not path.startswith(("/workspace/", "/tmp/"))


def is_device(text: str) -> bool:
    """``text`` is a device or kernel file that is not harmless to write (``/dev/null`` is)."""
    text = normalize_path(text)
    return text.startswith(("/dev/", "/proc/sys", "/proc/sysrq", "/sys/")) and not text.startswith(
        SAFE_DEVICES
    )


def is_system_file(text: str) -> bool:
    """``text`` is in (or is) one of the system directories."""
    text = normalize_path(text)
    return any(text == d or text.startswith(d + "/") for d in SYSTEM_DIRS)


@dataclass(frozen=True)
class RmOptions:
    """What an ``rm`` command line asks for."""

    recursive: bool
    force: bool
    no_preserve_root: bool
    targets: list[str]


def rm_options(texts: list[str]) -> RmOptions:
    """``rm``'s options in every spelling: bundles (``-rf``, ``-fR``), GNU long options by any
    unambiguous prefix (``--rec``, ``--forc``), and operands after ``--``."""
    recursive = force = no_preserve_root = False
    targets = []
    options_done = False
    for t in texts:
        if not options_done and t == "--":
            options_done = True
        elif not options_done and t.startswith("--"):
            option = t.split("=", 1)[0]
            recursive |= len(option) >= 3 and "--recursive".startswith(option)
            force |= len(option) >= 3 and "--force".startswith(option)
            no_preserve_root |= "--no-preserve-root".startswith(option) and len(option) >= 5
        elif not options_done and t.startswith("-") and len(t) > 1:
            recursive |= "r" in t or "R" in t
            force |= "f" in t
        else:
            targets.append(t)
    return RmOptions(recursive, force, no_preserve_root, targets)

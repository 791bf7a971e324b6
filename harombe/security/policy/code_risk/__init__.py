"""What a piece of code does that warrants CRITICAL review: pure analyzers, one per language.

Each analyzer takes source text and returns :class:`Finding` objects, each naming the construct
and the line it is on. No analyzer runs, imports or evaluates the code it reads: Python is read
through :mod:`ast`, shell and JavaScript through small tokenizers that understand quoting, so a
word inside a string or a comment is never a finding. Code that cannot be read is itself a
finding (``unparseable``): the conservative answer to "what does this do?" is "anything".

Analyzers recurse where one language hands code to another (``bash -c``, ``python3 -c``,
``node -e``), so nesting does not hide a call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from dataclasses import dataclass

__all__ = ["Finding", "analyze_code", "cut", "fingerprint", "language_for_path", "normalize_path"]

#: Nesting depth beyond which code handed to another interpreter is not followed any further;
#: deeper nesting is itself reported, because nothing benign needs it.
MAX_DEPTH = 4
#: Code longer than this is not analyzed (reading 10 MB takes seconds): it is itself a finding,
#: since nothing an agent sends in one call needs to be larger.
MAX_CODE_CHARS = 1_000_000
#: Constructs that stand for code the analyzer did not read. Their detail ends with the code's
#: fingerprint, so an "approve for this sandbox" grant (keyed on the detail) covers that exact
#: code only, never other code the same words would describe.
OPAQUE = frozenset({"nesting", "unanalyzable", "unparseable", "unknown-language"})


def fingerprint(text: str) -> str:
    """16 hex digits of the SHA-256 of ``text``: tells two texts apart in a finding's detail."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def cut(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters; else its start and the fingerprint of
    the whole, so two long texts with the same start remain two findings."""
    return text if len(text) <= limit else f"{text[:limit]}… [sha256 {fingerprint(text)}]"


@dataclass(frozen=True)
class Finding:
    """One dangerous construct: ``construct`` is a short stable tag, ``line`` is 1-based."""

    construct: str
    detail: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.detail}"


def analyze_code(language: str, code: str, *, depth: int = 0) -> list[Finding]:
    """Dangerous constructs in ``code`` written in ``language`` (python, javascript, shell).

    An unknown language is judged conservatively: one ``unknown-language`` finding. So is code
    longer than :data:`MAX_CODE_CHARS`, or nested too deeply for the analyzer to walk
    (``((((…))))`` 10,000 deep): never an exception, never a pass.
    A finding of :data:`OPAQUE` code names the code's fingerprint.
    """
    findings = _analyze(language, code, depth)
    if depth:
        return findings  # the outermost call pins them to the code it was given
    return [
        dataclasses.replace(f, detail=f"{f.detail} [code sha256 {fingerprint(code)}]")
        if f.construct in OPAQUE
        else f
        for f in findings
    ]


def _analyze(language: str, code: str, depth: int) -> list[Finding]:
    if depth > MAX_DEPTH:
        return [Finding("nesting", f"code nested more than {MAX_DEPTH} interpreters deep")]
    # Imported here: each analyzer module imports this one for Finding.
    from harombe.security.policy.code_risk import javascript, python, shell

    analyzers = {
        "python": python.analyze,
        "javascript": javascript.analyze,
        "shell": shell.analyze,
    }
    analyzer = analyzers.get(language)
    if analyzer is None:
        return [Finding("unknown-language", f"cannot analyze code in language {language!r}")]
    if len(code) > MAX_CODE_CHARS:
        return [Finding("unanalyzable", f"{language} code of {len(code):,} characters is "
                        f"above the {MAX_CODE_CHARS:,} the analyzer reads")]  # fmt: skip
    try:
        return analyzer(code, depth=depth)
    except (RecursionError, MemoryError) as exc:
        # Deeply nested expressions exhaust the parser's or the analyzer's stack.
        return [Finding("unanalyzable", f"{language} code nested too deeply to analyze "
                        f"({type(exc).__name__})")]  # fmt: skip


_EXTENSIONS = {
    ".py": "python",
    ".pyw": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".sh": "shell",
    ".bash": "shell",
}
_SHEBANGS = {"python": "python", "node": "javascript", "sh": "shell", "bash": "shell"}


def normalize_path(path: str) -> str:
    """``path`` with ``.``, ``..`` and repeated slashes resolved lexically, so
    ``/workspace/../etc`` and ``//etc`` are judged as ``/etc``; a trailing slash is kept."""
    if not path.startswith("/"):
        return path
    normal = "/" + posixpath.normpath(path).lstrip("/")
    return normal + "/" if path.endswith("/") and normal != "/" else normal


def language_for_path(path: str, content: str = "") -> str | None:
    """The language a file at ``path`` would run as: by extension, else by its ``#!`` line."""
    lower = path.lower()
    for ext, language in _EXTENSIONS.items():
        if lower.endswith(ext):
            return language
    if content.startswith("#!"):
        words = content[2:].split("\n", 1)[0].split()
        if words:
            prog = words[0].rsplit("/", 1)[-1]
            if prog == "env" and len(words) > 1:
                prog = words[1]
            for prefix, language in _SHEBANGS.items():
                if prog.startswith(prefix):
                    return language
    return None

"""The usage guide's risk table for the code-execution tools, as :class:`HITLRule` objects.

=========  =====  ==========================================================================
risk       wait   operations
=========  =====  ==========================================================================
CRITICAL   30 s   ``code_execute`` with ``network_enabled=True``; code that does something
                  dangerous (see :mod:`harombe.security.code_risk`); writing a script whose
                  content does; installing from a registry other than pypi/npm or from a
                  URL, path or VCS source
HIGH       60 s   any other ``code_execute``; ``code_install_package`` from pypi/npm;
                  writing an executable or script file
MEDIUM     120 s  writing other files; ``code_read_file``; ``code_list_files``
LOW        —      ``code_destroy_sandbox`` (auto-approved when ``auto_approve_low_risk``)
=========  =====  ==========================================================================

Rules a caller appends take part on equal terms: the highest matching risk wins.
"""

from __future__ import annotations

from harombe.security.code_risk import Finding, analyze_code, language_for_path
from harombe.security.hitl import HITLRule, Operation, RiskLevel

STANDARD_REGISTRIES = ("pypi", "npm")
#: Files that are programs, by extension (the guide's list, plus common script extensions).
EXECUTABLE_EXTENSIONS = (
    ".sh", ".bash", ".py", ".pyw", ".js", ".mjs", ".cjs", ".exe", ".bin", ".so", ".elf",
)  # fmt: skip
EXECUTABLE_PATTERN = r"(?i)\.(" + "|".join(e[1:] for e in EXECUTABLE_EXTENSIONS) + r")$"
#: Package specs that name a source other than the registry: URLs, VCS, local paths, tarballs.
_NONSTANDARD_SOURCE_MARKERS = ("://", "git+", "file:", "github:", "gitlab:", "link:", "npm:")


def dangerous_code(op: Operation) -> list[Finding]:
    """Findings in ``code_execute``'s ``code`` for its ``language``."""
    code, language = op.params.get("code"), op.params.get("language")
    if not isinstance(code, str) or not isinstance(language, str):
        return []
    return analyze_code(language, code)


def dangerous_file_content(op: Operation) -> list[Finding]:
    """Findings in a file being written that would run as a script (by extension or ``#!``)."""
    path, content = op.params.get("file_path"), op.params.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return []
    language = language_for_path(path, content)
    return analyze_code(language, content) if language else []


def nonstandard_package_source(op: Operation) -> list[Finding]:
    """A package spec that points somewhere other than the registry."""
    package = op.params.get("package")
    if not isinstance(package, str):
        return []
    spec = package.strip()
    if (
        any(marker in spec for marker in _NONSTANDARD_SOURCE_MARKERS)
        or spec.startswith((".", "/", "~"))
        or " @ " in spec
        or spec.endswith((".tar.gz", ".tgz", ".whl", ".zip"))
    ):
        return [Finding("package-source", f"{spec!r} is not a plain registry package")]
    return []


def get_sandbox_hitl_rules() -> list[HITLRule]:
    """A fresh list of the default rules (safe to append to)."""
    return [
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.HIGH, timeout=60,
            description="Any code execution (default)",
        ),
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.CRITICAL, timeout=30,
            conditions=[{"param": "network_enabled", "equals": True}],
            description="Code execution with network access",
        ),
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.CRITICAL, timeout=30, check=dangerous_code,
            description="Code with dangerous patterns",
        ),
        HITLRule(
            tools=["code_install_package"], risk=RiskLevel.HIGH, timeout=60,
            description="Package installation from PyPI/npm",
        ),
        HITLRule(
            tools=["code_install_package"], risk=RiskLevel.CRITICAL, timeout=30,
            conditions=[{"param": "registry", "not_in": list(STANDARD_REGISTRIES)}],
            description="Package installation from a non-standard registry",
        ),
        HITLRule(
            tools=["code_install_package"], risk=RiskLevel.CRITICAL, timeout=30,
            check=nonstandard_package_source,
            description="Package installation from a URL, path or VCS source",
        ),
        HITLRule(
            tools=["code_write_file"], risk=RiskLevel.MEDIUM, timeout=120,
            description="Writing a non-executable file",
        ),
        HITLRule(
            tools=["code_write_file"], risk=RiskLevel.HIGH, timeout=60,
            conditions=[{"param": "file_path", "matches": EXECUTABLE_PATTERN}],
            description="Writing an executable file",
        ),
        HITLRule(
            tools=["code_write_file"], risk=RiskLevel.CRITICAL, timeout=30,
            check=dangerous_file_content,
            description="Writing a script with dangerous patterns",
        ),
        HITLRule(
            tools=["code_read_file"], risk=RiskLevel.MEDIUM, timeout=120,
            description="Reading a file from the workspace",
        ),
        HITLRule(
            tools=["code_list_files"], risk=RiskLevel.MEDIUM, timeout=120,
            description="Listing files in the workspace",
        ),
        HITLRule(
            tools=["code_destroy_sandbox"], risk=RiskLevel.LOW,
            description="Destroying a sandbox (cleanup)",
        ),
    ]  # fmt: skip

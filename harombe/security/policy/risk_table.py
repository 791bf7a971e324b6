"""The usage guide's risk table for the code-execution tools, as :class:`HITLRule` objects.

=========  =====  ==========================================================================
risk       wait   operations
=========  =====  ==========================================================================
CRITICAL   30 s   ``code_execute`` in a sandbox with network (``network_enabled`` true, which
                  the tools set whenever the target sandbox has network); code that does something
                  dangerous (see :mod:`harombe.security.policy.code_risk`); writing a script whose
                  content does; installing from a registry other than pypi/npm, or anything
                  but a plain registry spec (a URL, VCS, path or archive source, an alias, a
                  malformed spec: whatever the installer would refuse)
HIGH       60 s   any other ``code_execute``, and one whose ``timeout`` exceeds
                  ``timeout_default_s``; ``code_install_package`` from pypi/npm; writing an
                  executable or script file
MEDIUM     120 s  writing other files; ``code_read_file``; ``code_list_files``
LOW        —      ``code_destroy_sandbox`` (the rule itself needs no approval)
=========  =====  ==========================================================================

Rules a caller appends take part on equal terms: the highest matching risk wins.
"""

from __future__ import annotations

import math

from harombe.config import REGISTRIES
from harombe.security.policy.code_risk import Finding, analyze_code, language_for_path
from harombe.security.policy.package_specs import judge_spec
from harombe.security.policy.rules import HITLRule, Operation, RiskLevel

#: Files that are programs, by extension (the guide's list, plus common script extensions).
EXECUTABLE_EXTENSIONS = (
    ".sh", ".bash", ".py", ".pyw", ".js", ".mjs", ".cjs", ".exe", ".bin", ".so", ".elf",
)  # fmt: skip
EXECUTABLE_PATTERN = r"(?i)\.(" + "|".join(e[1:] for e in EXECUTABLE_EXTENSIONS) + r")$"


def sandbox_network(op: Operation) -> list[Finding]:
    """The call runs where there is network: ``network_enabled`` (or ``sandbox_network``) is
    anything but false. A value that is not a plain bool (``"false"``) counts as network:
    failing safe, the gate never rates lower than what the manager might do."""
    for param in ("network_enabled", "sandbox_network"):
        value = op.params.get(param)
        if value is not None and value is not False and value != 0:
            return [Finding("network", f"sandbox has network access ({param}={value!r})")]
    return []


def long_timeout(op: Operation) -> list[Finding]:
    """``timeout`` (effective seconds) above ``timeout_default_s``, or not a finite positive
    number (what the manager would do with it is not this rule's to guess)."""
    timeout_s, default_s = op.params.get("timeout"), op.params.get("timeout_default_s")
    if timeout_s is None or isinstance(timeout_s, bool):
        return []
    if not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s) or timeout_s <= 0:
        detail = f"timeout {timeout_s!r} is not a finite positive number of seconds"
        return [Finding("long-run", detail)]
    if (
        isinstance(default_s, int | float)
        and not isinstance(default_s, bool)
        and timeout_s > default_s
    ):
        detail = f"timeout {timeout_s:g} s is above the default {default_s:g} s"
        return [Finding("long-run", detail)]
    return []


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
    """A ``package`` that is not a plain registry spec for its ``registry`` (``pypi`` when the
    call names none, as the tool does): exactly what the installer refuses, a missing or
    non-string package included (:func:`~harombe.security.policy.package_specs.judge_spec`
    decides both). An unknown registry is the registry rule's finding, not this one's."""
    registry = op.params.get("registry", "pypi")
    if registry not in REGISTRIES:
        return []
    verdict = judge_spec(op.params.get("package"), registry)
    if verdict.kind == "registry":
        return []
    return [Finding("package-source", f"not a plain registry package ({verdict.kind}): "
                                      f"{verdict.reason}")]  # fmt: skip


def get_sandbox_hitl_rules() -> list[HITLRule]:
    """A fresh list of the default rules (safe to append to)."""
    return [
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.HIGH, timeout=60,
            description="Any code execution (default)",
        ),
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.CRITICAL, timeout=30, check=sandbox_network,
            description="Code execution with network access",
        ),
        HITLRule(
            tools=["code_execute"], risk=RiskLevel.HIGH, timeout=60, check=long_timeout,
            description="Code execution longer than the default timeout",
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
            conditions=[{"param": "registry", "not_in": list(REGISTRIES)}],
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
            tools=["code_destroy_sandbox"], risk=RiskLevel.LOW, require_approval=False,
            description="Destroying a sandbox (cleanup)",
        ),
    ]  # fmt: skip

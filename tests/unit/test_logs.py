"""Where log events go: stderr at info by default, JSON lines on request, the user's own
structlog configuration left alone. Each case runs in a fresh interpreter (no Docker)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EMIT = (
    "import structlog\n"
    "log = structlog.get_logger('harombe.tools.code_execution')\n"
    "log.info('tool.called', tool='code_execute', success=True)\n"
    "log.debug('tool.params', code='SECRET_CODE')\n"
    "print('program output')\n"
)


def run(source: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60,
        env={**clean, **env},
    )  # fmt: skip


def test_events_go_to_stderr_at_info_and_never_show_code() -> None:
    """Importing harombe: stdout is the program's own, info events on stderr, debug hidden."""
    out = run("import harombe\n" + EMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "program output\n"
    assert "tool.called" in out.stderr and "tool=code_execute" in out.stderr
    assert "SECRET_CODE" not in out.stderr + out.stdout


def test_debug_level_is_asked_for_by_environment() -> None:
    """HAROMBE_LOG_LEVEL=debug shows code-carrying events, still on stderr."""
    out = run("import harombe\n" + EMIT, HAROMBE_LOG_LEVEL="debug")
    assert out.stdout == "program output\n"
    assert "SECRET_CODE" in out.stderr


@pytest.mark.parametrize("how", ["environment", "one-line-call"])
def test_json_audit_file(tmp_path: Path, how: str) -> None:
    """HAROMBE_LOG_JSON=path, or harombe.logs.configure(json_file=path), appends JSON lines."""
    audit = tmp_path / "audit.jsonl"
    if how == "environment":
        out = run("import harombe\n" + EMIT, HAROMBE_LOG_JSON=str(audit))
    else:
        out = run(f"import harombe.logs\nharombe.logs.configure(json_file={str(audit)!r})\n" + EMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "program output\n"
    (event,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert event["event"] == "tool.called" and event["level"] == "info"
    assert event["tool"] == "code_execute" and event["timestamp"].endswith("Z")


def test_a_users_own_configuration_is_left_alone() -> None:
    """structlog configured before importing harombe stays as the user made it."""
    user = (
        "import structlog\n"
        "structlog.configure(processors=[lambda l, m, e: 'USER ' + e['event']],\n"
        "                    logger_factory=structlog.PrintLoggerFactory())\n"
        "import harombe\n"
    )
    out = run(user + EMIT)
    assert out.stdout == "USER tool.called\nUSER tool.params\nprogram output\n"
    assert out.stderr == ""


def test_a_configuration_made_after_import_wins() -> None:
    """structlog.configure() after importing harombe replaces harombe's defaults."""
    after = (
        "import harombe, structlog\n"
        "structlog.configure(processors=[lambda l, m, e: 'AFTER ' + e['event']],\n"
        "                    logger_factory=structlog.PrintLoggerFactory())\n"
    )
    out = run(after + EMIT.replace("log.debug", "log.warning"))
    assert out.stdout.startswith("AFTER tool.called\n")


def test_a_bad_level_does_not_break_import() -> None:
    """An unknown HAROMBE_LOG_LEVEL is reported on stderr; harombe still imports and logs."""
    out = run("import harombe\n" + EMIT, HAROMBE_LOG_LEVEL="loud")
    assert out.returncode == 0 and out.stdout == "program output\n"
    assert "logs.config_refused" in out.stderr and "unknown log level 'loud'" in out.stderr


def test_an_unwritable_json_file_is_a_config_error(tmp_path: Path) -> None:
    """configure(json_file=...) that cannot be opened says which path and how to fix it."""
    source = f"import harombe.logs\nharombe.logs.configure(json_file={str(tmp_path)!r})\n"
    out = run(source)
    assert out.returncode != 0 and "cannot open the JSON log file" in out.stderr

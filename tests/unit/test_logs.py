"""Where log events go: stderr at warning by default (importing harombe prints nothing), JSON
lines at info whatever stderr shows, the user's own structlog configuration and loggers left
alone. Each case runs in a fresh interpreter (no Docker)."""

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
WARN = "structlog.get_logger('harombe.security').warning('pool.refill_failed', error='x')\n"


def run(source: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60,
        env={**clean, **env},
    )  # fmt: skip


def test_importing_harombe_prints_nothing_and_info_events_stay_quiet() -> None:
    """Importing harombe: stdout is the program's own and stderr stays empty at info."""
    out = run("import harombe\n" + EMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "program output\n"
    assert out.stderr == ""


def test_warnings_reach_stderr_by_default() -> None:
    """A warning of harombe's is shown on stderr without asking, never on stdout."""
    out = run("import harombe\n" + EMIT + WARN)
    assert out.stdout == "program output\n"
    assert "pool.refill_failed" in out.stderr and "tool.called" not in out.stderr


@pytest.mark.parametrize(
    ("level", "shown", "hidden"),
    [("info", ["tool.called"], ["SECRET_CODE"]), ("debug", ["tool.called", "SECRET_CODE"], [])],
    ids=["info", "debug"],
)
def test_the_level_is_asked_for_by_environment(level: str, shown: list[str],
                                               hidden: list[str]) -> None:  # fmt: skip
    """HAROMBE_LOG_LEVEL shows info events, or code-carrying debug ones, still on stderr."""
    out = run("import harombe\n" + EMIT, HAROMBE_LOG_LEVEL=level)
    assert out.stdout == "program output\n"
    assert all(text in out.stderr for text in shown), out.stderr
    assert not any(text in out.stderr for text in hidden), out.stderr


@pytest.mark.parametrize("how", ["environment", "one-line-call"])
def test_json_audit_file(tmp_path: Path, how: str) -> None:
    """HAROMBE_LOG_JSON=path, or harombe.logs.configure(json_file=path), appends JSON lines."""
    audit = tmp_path / "audit.jsonl"
    if how == "environment":
        out = run("import harombe\n" + EMIT, HAROMBE_LOG_JSON=str(audit))
    else:
        out = run(f"import harombe.logs\nharombe.logs.configure(json_file={str(audit)!r})\n" + EMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "program output\n" and out.stderr == ""
    (event,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert event["event"] == "tool.called" and event["level"] == "info"
    assert event["tool"] == "code_execute" and event["timestamp"].endswith("Z")


@pytest.mark.parametrize(
    ("level", "events"),
    [
        ("error", ["tool.called", "pool.refill_failed"]),
        ("warning", ["tool.called", "pool.refill_failed"]),
        ("info", ["tool.called", "pool.refill_failed"]),
        ("debug", ["tool.called", "tool.params", "pool.refill_failed"]),
    ],
    ids=["error", "warning", "info", "debug"],
)
def test_the_json_file_holds_every_audit_event_whatever_stderr_shows(
    tmp_path: Path, level: str, events: list[str]
) -> None:
    """stderr's level filters only stderr: the file gets info and above (debug if asked)."""
    audit = tmp_path / "audit.jsonl"
    source = (f"import harombe.logs\nharombe.logs.configure(level={level!r}, "
              f"json_file={str(audit)!r})\n{EMIT}{WARN}")  # fmt: skip
    out = run(source)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["event"] for line in audit.read_text().splitlines()] == events
    assert ("tool.called" in out.stderr) is (level in ("info", "debug"))


def test_other_loggers_keep_structlogs_own_behaviour_unless_asked() -> None:
    """A program's own (unconfigured) structlog loggers print as structlog's defaults do;
    asking for harombe's configuration applies it to them too."""
    mine = "import structlog\nstructlog.get_logger('myapp').info('mine.done', n=1)\n"
    alone = run(mine)
    after = run("import harombe\n" + mine)
    assert "mine.done" in alone.stdout and "mine.done" in after.stdout
    assert after.stderr == alone.stderr == ""
    asked = run("import harombe\n" + mine, HAROMBE_LOG_LEVEL="info")
    assert asked.stdout == "" and "mine.done" in asked.stderr


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
    out = run("import harombe\n" + EMIT + WARN, HAROMBE_LOG_LEVEL="loud")
    assert out.returncode == 0 and out.stdout == "program output\n"
    assert "logs.config_refused" in out.stderr and "unknown log level 'loud'" in out.stderr
    assert "pool.refill_failed" in out.stderr


def test_an_unwritable_json_file_is_a_config_error(tmp_path: Path) -> None:
    """configure(json_file=...) that cannot be opened says which path and how to fix it."""
    source = f"import harombe.logs\nharombe.logs.configure(json_file={str(tmp_path)!r})\n"
    out = run(source)
    assert out.returncode != 0 and "cannot open the JSON log file" in out.stderr


@pytest.mark.parametrize("same_file", [True, False], ids=["same-file", "another-file"])
def test_reconfiguring_while_threads_log_loses_no_event(tmp_path: Path, same_file: bool) -> None:
    """configure() again while other threads log: every event is in a JSON file, no warning."""
    first, second = tmp_path / "a.jsonl", tmp_path / ("a.jsonl" if same_file else "b.jsonl")
    source = (
        "import threading, structlog, harombe.logs as logs\n"
        f"logs.configure(json_file={str(first)!r})\n"
        "log = structlog.get_logger('harombe.x')\n"
        "stop, counts = threading.Event(), [0, 0, 0]\n"
        "def spam(i):\n"
        "    while not stop.is_set():\n"
        "        log.info('t.logged')\n"
        "        counts[i] += 1\n"
        "threads = [threading.Thread(target=spam, args=(i,)) for i in range(3)]\n"
        "[t.start() for t in threads]\n"
        "for _ in range(100):\n"
        f"    logs.configure(json_file={str(second)!r})\n"
        "stop.set(); [t.join() for t in threads]\n"
        "print(sum(counts))\n"
    )
    out = run(source)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = first.read_text().splitlines() + ([] if same_file else second.read_text().splitlines())
    assert sum(json.loads(line)["event"] == "t.logged" for line in lines) == int(out.stdout)

"""Attacks on harombe's log output through tool arguments and the JSON audit file: values
that would forge a log line, recolour the terminal or flood it, and JSON targets that would
hang ``import harombe`` or fail every later call. Each probe asserts the attack is held."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from harombe import logs

REPO = Path(__file__).resolve().parents[2]


# --- log lines cannot be forged, recoloured or flooded -----------------------------------

FORGED = [
    ("language-ansi", {"language": "\x1b[2J\x1b[31mpython"}),
    ("language-newline-fake-event", {"language": "x\n2026-01-01 [info] hitl.decided approved"}),
    ("sandbox-id-rlo", {"sandbox_id": "sandbox-\u202eba9876543210"}),
    ("sandbox-id-carriage-return", {"sandbox_id": "sandbox-0\r[info] ok"}),
    ("path-ansi", {"file_path": "a\x1b]0;title\x07.txt"}),
    ("list-of-ansi", {"allowed_domains": ["\x1b[2J", "a\nb"]}),
]


@pytest.mark.parametrize("kwargs", [f[1] for f in FORGED], ids=[f[0] for f in FORGED])
def test_values_in_events_are_escaped_on_the_console(kwargs: dict[str, str]) -> None:
    """The console renderer gets every caller value escaped: one line, no terminal control."""
    event = {"event": "tool.called", **kwargs}
    out = structlog.dev.ConsoleRenderer(colors=False)(
        None, "info", logs.escape_for_console(None, "info", event)
    )
    assert "\n" not in out and "\r" not in out and "\x1b" not in out and "\u202e" not in out
    assert "\x07" not in out


def test_a_10mb_value_is_cut_on_the_console() -> None:
    """A huge value is shown cut, with its length, not 10 MB on the terminal."""
    event = logs.escape_for_console(None, "info", {"event": "e", "v": "x" * 10_000_000})
    assert len(event["v"]) < 2 * logs.MAX_VALUE_CHARS and "10000000 characters" in event["v"]


def import_with(json_target: str) -> subprocess.CompletedProcess[str]:
    code = "import harombe, structlog; structlog.get_logger('p').info('probe.logged'); print('ok')"
    env = {**os.environ, logs.JSON_ENV: json_target}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
        cwd=REPO,
    )  # fmt: skip


def fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def fifo_link(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    (tmp / "link").symlink_to(tmp / "fifo")
    return str(tmp / "link")


JSON_TARGETS = [
    ("fifo-without-reader", fifo, "not a regular file|No such device"),
    ("symlink-to-fifo", fifo_link, "not a regular file|No such device"),
    ("directory", lambda tmp: str(tmp), "Is a directory"),
    ("dev-full", lambda tmp: "/dev/full", "not a regular file"),
    ("missing-parent", lambda tmp: str(tmp / "no" / "such" / "dir.jsonl"), "No such file"),
]


@pytest.mark.parametrize(
    ("target", "said"), [j[1:] for j in JSON_TARGETS], ids=[j[0] for j in JSON_TARGETS]
)
def test_a_bad_json_log_target_never_hangs_or_breaks_import(
    tmp_path: Path, target: Any, said: str
) -> None:
    """importing harombe returns, logging still works, and stderr says why the file is unused."""
    proc = import_with(target(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert "logs.config_refused" in proc.stderr and re.search(said, proc.stderr), proc.stderr


def test_a_json_log_through_a_symlink_to_a_file_works(tmp_path: Path) -> None:
    """A link to a regular file is followed: events are appended to the file it names."""
    (tmp_path / "audit.jsonl").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "audit.jsonl")
    proc = import_with(str(tmp_path / "link"))
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "probe.logged"


def test_a_json_log_that_fails_later_never_fails_a_call(tmp_path: Path) -> None:
    """A write error after opening (disk full, file closed) is reported once, never raised."""
    sink = logs.JsonLinesFile(tmp_path / "a.jsonl")
    sink._file.close()
    for _ in range(3):
        assert sink(None, "info", {"event": "e"}) == {"event": "e"}

"""Adversarial review of the download-host check of npm installs (no network): a debug log
npm stopped writing, or one too long to read whole, cannot pass for a complete one."""

from __future__ import annotations

from pathlib import Path

import pytest

from harombe.errors import PackageFetchError
from harombe.security.runtime.packages import npm

ALLOWED = {"registry.example.org"}
GOOD = "12 http fetch GET 200 https://registry.example.org/left-pad 30ms\n"
EVIL = "13 http fetch GET 200 https://cdn.elsewhere.example/x.tgz 5ms\n"
EXIT = "14 verbose exit 0\n15 info ok\n"


def _logs(tmp_path: Path, *texts: str) -> Path:
    logs = tmp_path / "_logs"
    logs.mkdir()
    for i, text in enumerate(texts):
        (logs / f"2026-01-01T00_00_0{i}_000Z-debug-0.log").write_text(text)
    return logs


def test_a_log_over_the_read_cap_is_refused_not_read_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request logged past what harombe reads of a file (long lines before it) is not
    skipped: the log cannot be checked whole, so the install is refused."""
    monkeypatch.setattr(npm, "LOG_MAX_BYTES", 4096)
    padding = GOOD * (8192 // len(GOOD))
    logs = _logs(tmp_path, padding + EVIL + EXIT, GOOD + EXIT)
    with pytest.raises(PackageFetchError):
        npm.check_fetched_hosts(npm._read_logs(logs, whole=True), ALLOWED, "left-pad", runs=2)


@pytest.mark.parametrize(
    ("texts", "passes"),
    [
        ((GOOD + EXIT, GOOD + EXIT), True),
        ((GOOD + EXIT, GOOD), False),
        ((GOOD + EXIT,), False),
        ((GOOD + "16 http fetch 99 verbose exit 0\n", GOOD + EXIT), False),
    ],
    ids=["both-runs-ended", "second-stopped-logging", "one-log-gone", "forged-exit-line"],
)
def test_each_npm_run_must_be_logged_to_its_end(
    tmp_path: Path, texts: tuple[str, ...], passes: bool
) -> None:
    """npm stops writing its log after its last file is full: unless each run's log ends
    (``verbose exit 0``), what it fetched after that cannot be checked and is refused."""
    text = npm._read_logs(_logs(tmp_path, *texts), whole=True)
    if passes:
        npm.check_fetched_hosts(text, ALLOWED, "left-pad", runs=2)
        return
    with pytest.raises(PackageFetchError, match="log"):
        npm.check_fetched_hosts(text, ALLOWED, "left-pad", runs=2)

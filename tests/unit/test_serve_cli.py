"""``harombe serve`` on the command line, before anything starts (no Docker)."""

from __future__ import annotations

import subprocess
import sys


def harombe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harombe", *args], capture_output=True, text=True, timeout=60
    )


def test_help_explains_binding_and_auth() -> None:
    """--help says where it binds, that loopback is the default, and how tokens work."""
    out = harombe("serve", "--help").stdout
    assert "127.0.0.1:8000" in out and "Authorization: Bearer" in out
    assert "service.tokens" in out and "approver" in out
    assert "/mcp" in out and "/v1" in out


def test_a_non_loopback_bind_without_tokens_is_refused() -> None:
    """--host 0.0.0.0 without tokens exits 2 with an error naming the fix."""
    done = harombe("serve", "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0" in done.stderr and "service.tokens" in done.stderr

"""The README's dependencies section, run as written on real gVisor: its decorator example
prints what the comment says, in a program of its own (plain sync code, no event loop)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECTION = (
    (ROOT / "README.md")
    .read_text()
    .split("## Dependencies in seconds, `@sandbox` functions, and host directories", 1)[1]
    .split("\n## ", 1)[0]
)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}


def test_the_readme_decorator_example_runs_as_written() -> None:
    """The first Python block, run as a script, prints the TOML its comment shows, and
    nothing on stderr (harombe's info events stay quiet unless asked)."""
    first = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)[0]
    done = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True,
                          timeout=600, env=ENV, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == 'name = "harombe"\n'
    assert done.stderr == ""


def test_the_readme_names_the_apis_it_shows() -> None:
    """The environment and host-directory calls the section shows exist with those names."""
    import harombe
    from harombe.security.sandbox_manager import SandboxManager

    assert callable(harombe.run_sandboxed)
    for name in ("define_environment", "create_sandbox", "prepare_environment"):
        assert callable(getattr(SandboxManager, name))
    done = subprocess.run([sys.executable, "-m", "harombe", "run", "--help"],
                          capture_output=True, text=True, timeout=60, env=ENV)  # fmt: skip
    assert "--mnt" in done.stdout

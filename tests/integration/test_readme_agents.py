"""The README's agent section, run as written: its `harombe run` pipeline, its MCP config, and
the commands it names, on real gVisor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SECTION = README.split("## Agents: function calling, MCP, and the command line", 1)[1].split(
    "\n## ", 1
)[0]
#: The venv's `harombe` script first on PATH, as after `scripts/setup.sh`; built-in config only.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")} | {
    "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.S)


def test_the_readme_pipeline_runs_as_written() -> None:
    """`echo 'console.log(6*7)' | harombe run - --language javascript ...` prints 42."""
    shell = "\n".join(blocks("bash"))
    [line] = [ln for ln in shell.splitlines() if ln.startswith("echo ")]
    command = line.split("#", 1)[0]
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=180, env=ENV
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"


def test_every_command_the_readme_names_exists() -> None:
    """Each `harombe <command>` of the section answers --help."""
    shell = "\n".join(blocks("bash"))
    named = sorted({ln.split()[1] for ln in shell.splitlines() if ln.startswith("harombe ")})
    assert named == ["doctor", "ls", "run", "shell"]
    for command in [*named, "rm", "mcp"]:
        done = subprocess.run(
            ["harombe", command, "--help"], capture_output=True, text=True, timeout=60, env=ENV
        )
        assert done.returncode == 0 and "Usage: harombe" in done.stdout, done.stderr


def test_the_mcp_config_names_a_command_that_serves_mcp() -> None:
    """The README's mcpServers entry is JSON whose command and args start `harombe mcp`."""
    [config] = blocks("json")
    server = json.loads(config)["mcpServers"]["harombe"]
    assert [server["command"], *server["args"]] == ["harombe", "mcp"]

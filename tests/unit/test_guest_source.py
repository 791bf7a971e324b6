"""The guest's joined sources are what the sandbox runs, so they are linted and compiled as
joined (no Docker): with undefined-name checks on, on the oldest Python the sandbox supports.

Each part alone is linted by the project's settings with F821 off (a part uses names another
part defines); joined, every name must resolve, and a name used at module level must come from
an earlier part.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harombe.security.guest import (
    FILE_PARTS,
    HERE,
    PY_WORKER_PARTS,
    PY_WORKER_SOURCE,
    SUPERVISOR_PARTS,
    SUPERVISOR_SOURCE,
)
from tests.unit.test_wire import python38

RUFF = Path(sys.executable).parent / "ruff"
SOURCES = [
    pytest.param(SUPERVISOR_SOURCE, id="supervisor"),
    pytest.param(PY_WORKER_SOURCE, id="pyworker"),
]
#: F821 undefined name, F811 redefinition, F841 unused local, F401 unused import, and the
#: rest of pyflakes.
RULES = "F"
REDEFINED = re.compile(r"Redefinition of unused `(\w+)` from line (\d+)")


def findings(source: str, tmp_path: Path) -> list[dict]:  # type: ignore[type-arg]
    path = tmp_path / "joined.py"
    path.write_text(source, encoding="utf-8")
    done = subprocess.run(
        [str(RUFF), "check", "--isolated", "--no-cache", "--select", RULES,
         "--target-version", "py38", "--output-format", "json", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def reimport(finding: dict, lines: list[str]) -> bool:  # type: ignore[type-arg]
    """Whether a finding is a module a part imports again (each part imports what it uses)."""
    match = REDEFINED.search(finding["message"])
    if finding["code"] != "F811" or match is None:
        return False
    name, first = match.group(1), int(match.group(2))
    again = finding["location"]["row"]
    return all(lines[row - 1].strip() == f"import {name}" for row in (first, again))


@pytest.mark.parametrize("source", SOURCES)
def test_the_joined_source_has_no_pyflakes_findings(source: str, tmp_path: Path) -> None:
    """No undefined name (F821), no redefinition (F811), nothing unused (F841, F401)."""
    lines = source.splitlines()
    found = [f for f in findings(source, tmp_path) if not reimport(f, lines)]
    assert found == [], "\n".join(
        f"{f['code']} line {f['location']['row']}: {f['message']} "
        f"({lines[f['location']['row'] - 1].strip()!r})"
        for f in found
    )


def test_the_lint_sees_an_undefined_name(tmp_path: Path) -> None:
    """The check itself works: a name no part defines is reported, and so is a part that uses
    a later part's name at module level."""
    undefined = SUPERVISOR_SOURCE + "\n\nnot_defined_anywhere()\n"
    assert "F821" in {f["code"] for f in findings(undefined, tmp_path)}
    too_early = "x = main\n\n" + SUPERVISOR_SOURCE
    assert "F821" in {f["code"] for f in findings(too_early, tmp_path)}


@pytest.mark.parametrize("source", SOURCES)
def test_the_joined_source_compiles(source: str) -> None:
    compile(source, "<joined>", "exec")


@pytest.mark.parametrize("source", SOURCES)
def test_the_joined_source_compiles_on_python38(source: str, tmp_path: Path) -> None:
    path = tmp_path / "joined.py"
    path.write_text(source, encoding="utf-8")
    done = subprocess.run(
        [str(python38()), "-m", "py_compile", str(path)], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def test_the_worker_source_is_a_part_of_the_supervisors() -> None:
    """The supervisor carries the worker's source, and both start with the shared codec."""
    assert SUPERVISOR_PARTS[0] == PY_WORKER_PARTS[0] == "wire.py"
    assert SUPERVISOR_SOURCE.startswith(f"PY_WORKER_SOURCE = {PY_WORKER_SOURCE!r}\n")
    assert set(FILE_PARTS) <= set(SUPERVISOR_PARTS)


def test_every_part_is_joined() -> None:
    """A file in the folder that no source includes would be dead code."""
    parts = {p.name for p in HERE.glob("*.py")} - {"__init__.py"}
    assert parts == set(SUPERVISOR_PARTS) | set(PY_WORKER_PARTS)

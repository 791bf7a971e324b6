"""Profiles are checked when harombe starts: a broken profile file is reported then (a warning
naming the file and the fix) and disables only its own profile (and those extending it); the
shipped profiles and every other one keep working, and a call naming the broken one is told why
it is disabled, without the host's paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.errors import ConfigError, InvalidArgumentError
from harombe.profile_files import read_profile_files
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.profiled import load_profile_set
from harombe.service.state import Service
from harombe.testing import FakeDocker, capture_events
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.profiles import ProfileTable

#: The fips tutorial's exercise: a visualization profile listing matplotlib's pyplot module.
TUTORIAL_EXERCISE = (
    "extends: data-science\nimports:\n  additional: [matplotlib, matplotlib.pyplot, PIL]\n"
)
#: A file that is fine, beside each broken one.
GOOD = "extends: minimal\nimports:\n  additional: [numpy]\n"

BROKEN = [
    ("bad-yaml", {"viz": "imports: [\n"}, ["viz"], "viz.yaml is not valid YAML"),
    ("unknown-key", {"viz": "import: [math]\n"}, ["viz"], "unknown key 'import'"),
    ("dotted-module", {"viz": TUTORIAL_EXERCISE}, ["viz"],
     "holds 'matplotlib.pyplot'; it lists top-level module names (no dots): write 'matplotlib'"),
    ("refused-module", {"viz": "imports:\n  additional: [ctypes]\n"}, ["viz"],
     "lists 'ctypes', which hands code foreign code and raw memory"),
    ("missing-parent", {"viz": "extends: nope\n"}, ["viz"],
     "extends 'nope', which is not a profile"),
    ("cycle", {"viz": "extends: loop\n", "loop": "extends: viz\n"}, ["loop", "viz"],
     "cycle (viz -> loop -> viz)"),
    ("extends-broken", {"viz": "import: 1\n", "child": "extends: viz\n"}, ["child", "viz"],
     "unknown key 'import'"),
    ("extends-unreadable", {"viz": "imports: [\n", "child": "extends: viz\n"},
     ["child", "viz"], "not valid YAML"),
    ("not-utf8", {"viz": b"description: caf\xe9\n"}, ["viz"], "viz.yaml is not UTF-8"),
    ("anchor", {"viz": "description: &d x\n"}, ["viz"], "uses a YAML anchor or alias"),
    ("not-a-mapping", {"viz": "- math\n"}, ["viz"], "must hold a mapping"),
    ("name-mismatch", {"viz": "name: other\n"}, ["viz"], "set name: viz"),
    ("bad-resource", {"viz": "resources: {memory: 256MB}\n"}, ["viz"], "is not a size"),
]  # fmt: skip


def write_profiles(directory: Path, files: dict[str, str | bytes]) -> None:
    (directory / "fine.yaml").write_text(GOOD, encoding="utf-8")
    for name, text in files.items():
        path = directory / f"{name}.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")


def config_for(directory: Path | None, **service: Any) -> Any:
    return parse_config({
        "security": {"profiles": {"directory": str(directory) if directory else None},
                     "sandbox": {"pool": {"size": 0}}},
        "service": service,
    })  # fmt: skip


@pytest.mark.parametrize(("files", "disabled", "message"), [r[1:] for r in BROKEN],
                         ids=[r[0] for r in BROKEN])  # fmt: skip
def test_a_broken_file_disables_only_its_profile(
    tmp_path: Path, files: dict[str, str | bytes], disabled: list[str], message: str
) -> None:
    """The broken profile (and any extending it) is disabled with a warning naming its file;
    minimal, data-science and the good file's profile load."""
    write_profiles(tmp_path, files)
    with capture_events() as events:
        loaded = load_profile_set(tmp_path)
    assert {"minimal", "data-science", "fine"} <= set(loaded.profiles)
    assert sorted(loaded.disabled) == disabled
    assert not set(disabled) & set(loaded.profiles)
    warned = [e for e in events if e["event"] == "profile.disabled"]
    assert sorted(e["profile"] for e in warned) == disabled
    for event in warned:
        assert event["log_level"] == "warning" and str(tmp_path) in event["file"]
        assert event["file"].endswith(f"{event['profile']}.yaml")
    assert any(message in e["error"] for e in warned), warned
    for reason in loaded.disabled.values():
        assert str(tmp_path) not in reason


@pytest.mark.parametrize(("files", "disabled", "message"), [r[1:] for r in BROKEN],
                         ids=[r[0] for r in BROKEN])  # fmt: skip
def test_a_call_naming_a_disabled_profile_is_told_why(
    tmp_path: Path, files: dict[str, str | bytes], disabled: list[str], message: str
) -> None:
    """Naming a disabled profile is a ConfigError saying it is disabled and why, with no host
    path; the other profiles are handed out as before."""
    write_profiles(tmp_path, files)
    table = ProfileTable(config_for(tmp_path))
    for name in disabled:
        with pytest.raises(ConfigError, match=f"profile '{name}' is disabled") as caught:
            table.get(name)
        assert str(tmp_path) not in str(caught.value)
        assert "fix the file and restart harombe" in str(caught.value)
    assert table.get("minimal").name == "minimal"
    assert table.get("fine").name == "fine"
    with pytest.raises(InvalidArgumentError, match="unknown profile 'other'"):
        table.get("other")


def test_a_file_taking_a_shipped_name_is_ignored_and_reported(tmp_path: Path) -> None:
    """A user's minimal.yaml is reported and ignored: minimal stays the shipped profile."""
    (tmp_path / "minimal.yaml").write_text("imports:\n  allowed: [os]\n", encoding="utf-8")
    loaded = load_profile_set(tmp_path)
    assert "os" not in loaded.profiles["minimal"].allowed_imports
    assert loaded.disabled == {}
    assert [p.profile for p in loaded.problems] == [None]
    assert "which harombe ships; rename the file" in loaded.problems[0].message


def test_a_missing_directory_is_reported_and_the_shipped_profiles_work(tmp_path: Path) -> None:
    """A profiles directory that does not exist is one problem naming the setting; the
    shipped profiles load."""
    loaded = load_profile_set(tmp_path / "nope")
    assert set(loaded.profiles) == {"minimal", "data-science"}
    assert "security.profiles.directory" in loaded.problems[0].message
    assert str(tmp_path) not in loaded.problems[0].public


def test_the_strict_reader_still_raises_on_the_first_bad_file(tmp_path: Path) -> None:
    """read_profile_files reads the good files past a bad one and reports the bad one."""
    write_profiles(tmp_path, {"viz": "imports: [\n"})
    documents, problems = read_profile_files(tmp_path)
    assert "fine" in documents and "viz" not in documents
    assert [p.profile for p in problems] == ["viz"]


async def test_the_manager_checks_profiles_when_it_starts(
    tmp_path: Path, docker: FakeDocker
) -> None:
    """SandboxManager.start() loads every profile file (the warning comes then, not at the
    first call), and its tools use that set."""
    write_profiles(tmp_path, {"viz": TUTORIAL_EXERCISE})
    manager = SandboxManager(docker_manager=docker, config=config_for(tmp_path))
    with capture_events() as events:
        await manager.start()
    try:
        assert [e["profile"] for e in events if e["event"] == "profile.disabled"] == ["viz"]
        assert manager.profile_set is not None and "viz" in manager.profile_set.disabled
        tools = CodeExecutionTools(manager)
        assert tools.profiles.profile_set is manager.profile_set
        refused = await tools.code_execute("python", "print(1)", profile="viz")
        assert refused["success"] is False
        assert "ConfigError: profile 'viz' is disabled" in refused["error"]
        assert str(tmp_path) not in refused["error"]
        ran = await tools.code_execute("python", "print(1)", profile="minimal")
        assert ran["success"] is True, ran
    finally:
        await manager.stop()


def test_the_service_starts_with_a_broken_profile_it_does_not_use(
    tmp_path: Path, docker: FakeDocker
) -> None:
    """Service() loads every file; a broken one it does not run under is only reported."""
    write_profiles(tmp_path, {"viz": TUTORIAL_EXERCISE})
    svc = Service(config_for(tmp_path), docker_manager=docker, environ={})
    assert svc.profile_name == "minimal" and "viz" in svc.profile_set.disabled
    assert svc.manager.profile_set is svc.profile_set


@pytest.mark.parametrize("via", ["config", "environment"])
def test_the_service_refuses_to_start_under_a_broken_profile(
    tmp_path: Path, docker: FakeDocker, via: str
) -> None:
    """service.profile or SANDBOX_PROFILE naming a broken profile is a ConfigError naming the
    file and the fix."""
    write_profiles(tmp_path, {"viz": TUTORIAL_EXERCISE})
    service = {"profile": "viz"} if via == "config" else {}
    environ = {"SANDBOX_PROFILE": "viz"} if via == "environment" else {}
    with pytest.raises(ConfigError) as caught:
        Service(config_for(tmp_path, **service), docker_manager=docker, environ=environ)
    text = str(caught.value)
    assert "names profile 'viz', which is disabled" in text
    assert os.fspath(tmp_path / "viz.yaml") in text and "write 'matplotlib'" in text

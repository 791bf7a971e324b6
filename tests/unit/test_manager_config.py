"""The manager's config is typed and honest: what it is given is what it uses, and a switch
that says "off" is obeyed with an error that says how to turn it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harombe.config import HarombeConfig, parse_config
from harombe.errors import ConfigError, UsageError
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import FakeDocker, capture_events

from .fake_manager import config


async def started_docker() -> FakeDocker:
    docker = FakeDocker()
    await docker.start()
    return docker


@pytest.mark.parametrize(
    "bad",
    [{"security": {}}, "config/harombe.yaml", 42, object()],
    ids=["dict", "path", "int", "object"],
)
async def test_config_must_be_a_harombe_config(bad: Any) -> None:
    """Anything but a HarombeConfig is refused at construction, naming how to build one."""
    with pytest.raises(UsageError, match="load_config"):
        SandboxManager(await started_docker(), config=bad)


async def test_sandboxes_switched_off_refuse_to_start() -> None:
    """security.sandbox.enabled: false makes start() refuse, saying which key to change."""
    docker = await started_docker()
    manager = SandboxManager(docker, config=config(enabled=False))
    with pytest.raises(ConfigError, match=r"security\.sandbox\.enabled"):
        await manager.start()
    assert docker.labelled({}) == []


async def test_without_a_config_the_environment_is_read_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No config: load_config() is used (HAROMBE__ variables apply), and an event says so."""
    monkeypatch.delenv("HAROMBE_CONFIG", raising=False)
    monkeypatch.setenv("HAROMBE__SECURITY__SANDBOX__LIMITS__MAX_PIDS", "64")
    with capture_events() as events:
        manager = SandboxManager(await started_docker())
    assert manager.limits.max_pids == 64
    assert [e["path"] for e in events if e["event"] == "sandbox_manager.config_loaded"] == [None]


async def test_the_config_file_read_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With $HAROMBE_CONFIG set, the file is read and the event names it."""
    path = tmp_path / "harombe.yaml"
    path.write_text("security:\n  sandbox:\n    limits:\n      max_pids: 96\n")
    monkeypatch.setenv("HAROMBE_CONFIG", str(path))
    with capture_events() as events:
        manager = SandboxManager(await started_docker())
    assert manager.limits.max_pids == 96
    assert [e["path"] for e in events if e["event"] == "sandbox_manager.config_loaded"] == [
        str(path)
    ]


async def test_keyword_limits_override_the_given_config() -> None:
    """Constructor limits win over the config object, which itself is not changed."""
    given = parse_config({"security": {"sandbox": {"limits": {"max_memory_mb": 256}}}})
    manager = SandboxManager(await started_docker(), config=given, max_memory_mb=1024)
    assert manager.limits.max_memory_mb == 1024
    assert given.security.sandbox.limits.max_memory_mb == 256
    assert isinstance(manager.config, HarombeConfig)


async def test_configured_registries_reach_the_installer() -> None:
    """network.allowed_registries is what package downloads use (first pypi URL the index)."""
    cfg = config(network={"allowed_registries": {
        "pypi": ["http://127.0.0.1:9/simple", "http://127.0.0.1:9/extra"],
        "npm": ["http://127.0.0.1:9/npm/"],
    }})  # fmt: skip
    manager = SandboxManager(await started_docker(), config=cfg)
    assert manager.installs._index_urls == ("http://127.0.0.1:9/simple", "http://127.0.0.1:9/extra")
    assert manager.installs._npm_registry == "http://127.0.0.1:9/npm/"

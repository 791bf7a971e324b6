"""Checks before a manager starts: its configuration is one, the runtimes are gVisor (unless
the user opted out) and Docker knows them."""

from __future__ import annotations

import os

import structlog

from harombe.config import CONFIG_PATH_ENV, HarombeConfig, SandboxConfig, load_config
from harombe.errors import InsecureRuntimeError, RuntimeNotAvailableError, UsageError
from harombe.security.runtime.backend import DockerBackend

log = structlog.get_logger(__name__)

GVISOR_RUNTIMES = ("runsc", "runsc-net")


def given_config(config: object) -> HarombeConfig:
    """``config`` when it is a :class:`HarombeConfig`; ``None``: the file and environment's
    configuration (:func:`~harombe.config.load_config`); anything else a :class:`UsageError`."""
    if config is not None and not isinstance(config, HarombeConfig):
        raise UsageError(
            f"config must be a harombe.config.HarombeConfig, got {type(config).__name__}; "
            "build one with harombe.config.load_config(path) or parse_config(mapping)"
        )
    if config is None:
        config = load_config()
        log.info("sandbox_manager.config_loaded", path=os.environ.get(CONFIG_PATH_ENV))
    return config


def check_gvisor(cfg: SandboxConfig) -> None:
    """Refuse a runtime that is not gVisor unless ``allow_insecure_runtime`` says so. Pure."""
    if cfg.runtime not in GVISOR_RUNTIMES and not cfg.allow_insecure_runtime:
        raise InsecureRuntimeError(
            f"runtime {cfg.runtime!r} is not gVisor, so sandboxed code would share the host "
            "kernel; use runtime 'runsc', or set security.sandbox.allow_insecure_runtime: "
            "true to accept weaker isolation"
        )
    if cfg.network.runtime not in GVISOR_RUNTIMES and not cfg.allow_insecure_runtime:
        raise InsecureRuntimeError(
            f"security.sandbox.network.runtime {cfg.network.runtime!r} is not gVisor; use "
            "'runsc-net', or set security.sandbox.allow_insecure_runtime: true"
        )


async def check_runtimes(docker: DockerBackend, cfg: SandboxConfig) -> None:
    """:func:`check_gvisor`, then that Docker has the runtime registered (the network
    runtime's absence is only a warning: offline sandboxes do not need it)."""
    check_gvisor(cfg)
    runtimes = await docker.runtimes()
    if cfg.network.runtime not in runtimes:
        log.warning(
            "sandbox_manager.no_network_runtime",
            runtime=cfg.network.runtime,
            fix="run scripts/setup.sh; network-enabled sandboxes need it",
        )
    if cfg.runtime not in runtimes:
        raise RuntimeNotAvailableError(
            f"the {cfg.runtime!r} runtime is not registered with Docker (registered: "
            f"{', '.join(sorted(runtimes)) or 'none'}); run scripts/setup.sh, or add it to "
            "/etc/docker/daemon.json and restart dockerd"
        )

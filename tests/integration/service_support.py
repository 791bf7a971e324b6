"""Helpers for tests that drive a live ``harombe serve`` (real gVisor): a config, a started
service on a free loopback port, and a client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from harombe.config import HarombeConfig, merge, parse_config
from harombe.security.runtime.docker import DockerManager
from harombe.service.app import create_app
from harombe.service.state import Service
from harombe.testing.http import serving

APPROVAL_KEY = "test-approval-key-0123456789abcdef"


def service_config(extra: Mapping[str, Any] | None = None, *, hitl: bool = False) -> HarombeConfig:
    """A config for service tests: a small pool; the HITL gate off (an unattended sidecar)
    unless ``hitl`` (then every run, HIGH in the guide's table, is held for the approvals
    page: the automatic level is MEDIUM)."""
    gate = {"enabled": True, "auto_approve_up_to": "medium"} if hitl else {"enabled": False}
    data: dict[str, Any] = {"security": {"sandbox": {"pool": {"size": 2}}, "hitl": gate}}
    return parse_config(merge(data, extra or {}))


@contextlib.asynccontextmanager
async def live_service(
    docker_manager: DockerManager,
    config: HarombeConfig | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[Service, str]]:
    """A started service and its base URL; stopped (its sandboxes removed) afterwards."""
    service = Service(
        config or service_config(),
        docker_manager=docker_manager,
        environ=environ or {},
        approval_key=APPROVAL_KEY,
    )
    async with serving(create_app(service=service)) as base_url:
        yield service, base_url


def client(base_url: str, token: str | None = None, timeout_s: float = 60.0) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)

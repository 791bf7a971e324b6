"""The service's one set of parts: Docker, the sandbox manager, the tools, the gate and its
approvals, the tenants and the profiles — started together and stopped together.

``stop()`` waits for the sandbox removals still running, then stops the manager, which removes
every sandbox the service made; a service killed with SIGKILL leaves containers that the next
start's orphan sweep removes (they carry harombe's labels).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
from collections.abc import Mapping
from typing import Any

import structlog

from harombe.config import HarombeConfig
from harombe.errors import ConfigError, HarombeError
from harombe.security.approval.gate import gate_from_config
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.profiled import load_profile_set
from harombe.service.approvals import ApprovalBroker, AuditFeed
from harombe.service.auth import Tenant, TokenTable
from harombe.tools.code_execution import CodeExecutionTools

log = structlog.get_logger(__name__)

#: The environment variable that chooses the fips endpoints' profile (as the sidecar's does).
PROFILE_ENV = "SANDBOX_PROFILE"


class Service:
    """Everything one running ``harombe serve`` holds; see the module docstring."""

    def __init__(
        self,
        config: HarombeConfig,
        *,
        docker_manager: Any = None,
        environ: Mapping[str, str] | None = None,
        approval_key: str | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self.tokens = TokenTable(config.service, env)
        # Every profile file is checked now: a broken one disables its profile only (a
        # warning, and serve prints it), unless it is the one the service runs under.
        self.profile_set = load_profile_set(config.security.profiles.directory)
        self.profiles: dict[str, Profile] = self.profile_set.profiles
        self.profile_name = env.get(PROFILE_ENV) or config.service.profile
        if self.profile_name not in self.profiles:
            source = PROFILE_ENV if env.get(PROFILE_ENV) else "service.profile"
            raise ConfigError(self._no_active_profile(source))
        # Decides approvals when no approver token is configured; shown once at start.
        self.approval_key = approval_key or secrets.token_urlsafe(24)
        self.feed = AuditFeed()
        self.broker = ApprovalBroker(self.feed)
        self._own_docker = docker_manager is None
        self.docker_manager = docker_manager or DockerManager()
        self.manager = SandboxManager(docker_manager=self.docker_manager, config=config)
        self.manager.profile_set = self.profile_set
        # Held calls go to the approvals page, unless security.hitl.approver names another.
        self.gate = gate_from_config(config, surface_approver=self.broker)
        self.tools = CodeExecutionTools(self.manager, self.gate, profiles=self.profile_set)
        self.owners: dict[str, Tenant] = {}
        self._removals: set[asyncio.Task[None]] = set()
        self.started = False

    def _no_active_profile(self, source: str) -> str:
        for problem in self.profile_set.problems:
            if problem.profile == self.profile_name:
                return (
                    f"{source} names profile {self.profile_name!r}, which is disabled: "
                    f"{problem.message}; fix that file, or choose another profile"
                )
        known = ", ".join(sorted(self.profiles))
        return (
            f"{source} names profile {self.profile_name!r}, which does not exist; use one "
            f"of {known} or add it to security.profiles.directory"
        )

    def is_approval_key(self, presented: str) -> bool:
        """Whether ``presented`` is this service's approval key (compared in constant time)."""
        key = self.approval_key.encode()
        return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), key)

    @property
    def profile(self) -> Profile:
        """The fips endpoints' active profile."""
        return self.profiles[self.profile_name]

    async def start(self) -> None:
        """Start Docker's client and the manager (which sweeps orphans), and warm the pool
        of the active profile."""
        await self.docker_manager.start()
        await self.manager.start()
        self.manager.prewarm("python", profile=self.profile)
        self.started = True
        log.info("service.started", profile=self.profile_name, tokens=self.tokens.enabled)

    def begin_shutdown(self) -> None:
        """The first step of a graceful shutdown, before open connections are waited for:
        end the feed's streams and deny held approvals, so nothing waits on them."""
        self.started = False
        self.feed.close()
        denied = self.broker.deny_all("the service is shutting down")
        log.info("service.stopping", denied_approvals=denied)

    async def stop(self) -> None:
        """Remove every sandbox the service made, then let go of Docker."""
        self.begin_shutdown()
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        await self.manager.stop()
        if self._own_docker:
            await self.docker_manager.stop()
        log.info("service.stopped")

    # ---- ownership -------------------------------------------------------------------------

    def owned(self, tenant: Tenant, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` is live and ``tenant``'s (else callers answer 404)."""
        owner = self.owners.get(sandbox_id)
        return owner is tenant and sandbox_id in self.manager.sandboxes

    def adopt(self, tenant: Tenant, result: Mapping[str, Any]) -> None:
        """Record what a tool result says about sandboxes: a new one is ``tenant``'s; a
        replaced one's replacement takes its place."""
        sid, old = result.get("sandbox_id"), result.get("replaced_sandbox_id")
        if isinstance(old, str):
            self.disown(old)
        if isinstance(sid, str) and sid in self.manager.sandboxes:
            self.owners[sid] = tenant
            tenant.sandboxes.add(sid)

    def disown(self, sandbox_id: str) -> None:
        owner = self.owners.pop(sandbox_id, None)
        if owner is not None:
            owner.sandboxes.discard(sandbox_id)

    def live(self, tenant: Tenant) -> list[str]:
        """``tenant``'s sandboxes that still exist (forgetting those that do not)."""
        alive = self.manager.sandboxes
        for sid in [s for s in tenant.sandboxes if s not in alive]:
            self.disown(sid)
        return sorted(tenant.sandboxes)

    def remove_later(self, sandbox_id: str) -> None:
        """Destroy a one-shot sandbox without making its caller wait; ``stop()`` waits."""

        async def remove() -> None:
            if self.gate is not None:  # its "approve for this sandbox" grants die with it
                self.gate.forget_sandbox(sandbox_id)
            try:
                await self.manager.destroy_sandbox(sandbox_id)
            except HarombeError as err:
                log.warning("service.removal_failed", sandbox_id=sandbox_id, error=str(err))

        task = asyncio.ensure_future(remove())
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

"""The part of :class:`~.manager.SandboxManager` that keeps its warm pools, and gives sandboxes
a dependency environment (see :mod:`.environment_sandboxes`): naming environments, building
them ahead of need, and claiming a sandbox with one from its own warm pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harombe.config import Language
from harombe.errors import UsageError
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.environment_sandboxes import Environments, Prepared, pooled_launch
from harombe.security.runtime.environments import Environment, Progress
from harombe.security.runtime.pool import WarmPool
from harombe.security.runtime.sandbox import Sandbox
from harombe.security.runtime.tasks import settle

if TYPE_CHECKING:
    from harombe.config import SandboxConfig
    from harombe.security.runtime.installs import Installs
    from harombe.security.runtime.launcher import Launcher


class PoolMixin:
    """Pool and environment methods of the sandbox manager (its registry, pool, launcher)."""

    environments: Environments
    installs: Installs
    launcher: Launcher
    pool: WarmPool
    lazy_pool: bool
    _profiles: dict[str, Profile]
    _started: bool

    if TYPE_CHECKING:  # the manager's own, used here

        @property
        def sandbox_config(self) -> SandboxConfig: ...

        @property
        def sandboxes(self) -> dict[str, Sandbox]: ...

        async def create_sandbox(
            self,
            language: Language = "python",
            *,
            network_enabled: bool = False,
            allowed_domains: Sequence[str] = (),
            profile: Profile | None = None,
            environment: str | Sequence[str] | None = None,
        ) -> Sandbox: ...

        async def destroy_sandbox(self, sandbox_id: str) -> None: ...

        async def _adopt(self, box: Sandbox | None) -> Sandbox: ...

    def _new_pool(self) -> WarmPool:
        pool, launcher = self.sandbox_config.pool, self.launcher
        # Keys: language, image, runtime, limits, profile fingerprint (pool_key), then an
        # environment's key for the pools of environments.
        # A closure over collaborators, never a method of the manager: a call travels one way.
        launch = pooled_launch(launcher, self.environments, self._profiles)
        return WarmPool(
            launch,
            launcher.discard,
            size=pool.size,
            max_age_s=pool.max_age_s,
            probe=launcher.answers,
            lazy=self.lazy_pool,
        )

    def pool_key(self, language: Language, profile: Profile | None = None) -> tuple[str, ...]:
        """The warm-pool key of ``language``'s sandboxes: language, image, runtime, limits and
        the fingerprint of their profile (``""``: none)."""
        cfg, fingerprint = self.sandbox_config, profile.fingerprint() if profile else ""
        if profile is not None:
            self._profiles[fingerprint] = profile
        return (language, cfg.image_for(language), cfg.runtime, cfg.limits.model_dump_json(),
                fingerprint)  # fmt: skip

    def prewarm(self, language: Language = "python", *, profile: Profile | None = None) -> None:
        """Fill ``language``'s warm pool (``profile``'s: layer up, preimports done)."""
        if not self._started:
            raise UsageError("Sandbox manager not started: await sandbox_manager.start() first")
        self.pool.fill(self.pool_key(language, profile))

    async def wait_pool_settled(self) -> None:
        """Wait until the pool has refilled and background removals are done (benchmarks)."""
        await self.pool.settled()
        await self.launcher.background.wait()

    def define_environment(
        self,
        name: str,
        requirements: Sequence[str],
        *,
        preimport: Sequence[str] = (),
        pool_size: int = 1,
    ) -> None:
        """Name a set of PyPI requirements for ``create_sandbox(environment=name)``; built on
        first use or by :meth:`prepare_environment`."""
        self.environments.define(name, requirements, preimport=preimport, pool_size=pool_size)

    async def prepare_environment(
        self,
        environment: str | Sequence[str],
        *,
        refresh: bool = False,
        on_progress: Progress | None = None,
    ) -> Environment:
        """Build ``environment`` now (``on_progress`` is told each step) and start filling its
        warm pool; the environment. Raises the fetch's error naming a failing requirement."""
        target = self.environments.targets.get(self.sandbox_config.image_for("python"))
        if target is None:  # the image's first sandbox tells its interpreter and platform
            box = await self.create_sandbox("python")
            try:
                target = self.environments.targets[box.image] = self.installs.target(box)
            finally:
                await self.destroy_sandbox(box.sandbox_id)
        prepared = await self.environments.ensure(
            environment, target=target, refresh=refresh, on_progress=on_progress
        )
        key = self._environment_pool_key("python", None, prepared)
        self.pool.fill(key)
        return prepared.environment

    def _environment_pool_key(
        self, language: Language, profile: Any, prepared: Prepared
    ) -> tuple[str, ...]:
        key = (*self.pool_key(language, profile), prepared.pool_id)
        self.pool.sizes[key] = prepared.pool_size
        return key

    async def _create_with_environment(
        self,
        language: Language,
        environment: str | Sequence[str],
        *,
        on_progress: Progress | None = None,
        **options: Any,
    ) -> Sandbox:
        if language != "python":
            raise UsageError(
                "dependency environments hold Python packages; create the sandbox with "
                f"language='python' (got {str(language)[:20]!r})"
            )
        self.environments.requirements_of(environment)  # a bad name fails before any start
        image = self.sandbox_config.image_for(language)
        target = self.environments.targets.get(image)
        box: Sandbox | None = None
        if target is None:  # the first sandbox of the image tells its interpreter and platform
            box = await self.create_sandbox(language, **options)
            target = self.environments.targets[image] = self.installs.target(box)
        try:
            prepared = await self.environments.ensure(
                environment, target=target, on_progress=on_progress
            )
            if box is None:
                key = self._environment_pool_key(language, options.get("profile"), prepared)
                if not options.get("network_enabled"):
                    box = await self.pool.claim(key)
                if box is not None:
                    return await self._adopt(box)
                box = await self.create_sandbox(language, **options)
            await self.environments.prepare(box, prepared)
        except BaseException:
            if box is not None:
                await settle(self.destroy_sandbox(box.sandbox_id))
            raise
        return box

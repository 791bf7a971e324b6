"""Sandbox registry and lifecycle (start, sweep, create, replace, destroy, stop), and the
operations on sandboxes by id, each handed to the collaborator that does it — ``Launcher``,
``Runs``, ``Files``, ``Installs`` — which take the sandbox, never the manager: a call travels
one way. Calls on one sandbox are serialised by its lock. Every container carries harombe
labels: ``stop()`` removes this manager's, ``start()`` those of processes that are gone. A
sandbox made with a policy profile keeps it for life (see :mod:`.profiled`); the warm pool
keeps its sandboxes per profile, with the profile's layer up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from harombe.config import (
    LANGUAGES,
    HarombeConfig,
    Language,
    Limits,
    SandboxConfig,
    override,
)
from harombe.errors import (
    ConfigError,
    HarombeError,
    SandboxLostError,
    SandboxNotFoundError,
    UsageError,
)
from harombe.host_paths import remember_host_path
from harombe.security.policy.profile_set import ProfileSet
from harombe.security.policy.profiles import Profile
from harombe.security.runtime import packages
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.egress_resources import Resolver, system_resolver
from harombe.security.runtime.environment_sandboxes import Environments
from harombe.security.runtime.files import DirListing, Files
from harombe.security.runtime.install_progress import ProgressCallback
from harombe.security.runtime.installs import Installs
from harombe.security.runtime.launcher import Launcher
from harombe.security.runtime.manager_pools import PoolMixin
from harombe.security.runtime.network import SandboxNetworks
from harombe.security.runtime.preflight import check_runtimes, given_config
from harombe.security.runtime.profiled import cap_timeout, load_profile_set
from harombe.security.runtime.results import lost_result
from harombe.security.runtime.runs import Runs, effective_timeout
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_MANAGER,
    LABEL_OWNER,
    ExecutionResult,
    Sandbox,
    check_sandbox_id,
    not_found,
    process_owner,
)
from harombe.security.runtime.tasks import settle

log = structlog.get_logger(__name__)

STOPPED_DURING_CREATE = "the sandbox manager was stopped while the sandbox was being made"


class SandboxManager(PoolMixin):
    """Creates, runs and destroys sandboxes. ``await start()`` before use, ``stop()`` after.

    ``config`` is a :class:`~harombe.config.HarombeConfig`; without one, the manager uses
    :func:`~harombe.config.load_config` — built-in defaults, then the file named by
    ``$HAROMBE_CONFIG`` if set, then ``HAROMBE__…`` variables — and logs which file it read.
    The keyword limits override its ``security.sandbox`` values. With ``lazy_pool``, a warm
    pool (a language's, an environment's) fills only from its second claim on, or when asked
    (:meth:`prewarm`, :meth:`prepare_environment`, ``pool.prewarm``): for processes that may
    make a single sandbox, which then start no other."""

    def __init__(
        self,
        docker_manager: DockerBackend,
        runtime: str | None = None,
        *,
        max_memory_mb: int | None = None,
        max_cpu_cores: float | None = None,
        max_disk_mb: int | None = None,
        max_execution_time: float | None = None,
        max_output_bytes: int | None = None,
        allow_insecure_runtime: bool | None = None,
        config: HarombeConfig | None = None,
        egress_resolver: Resolver | None = None,
        lazy_pool: bool = False,
    ) -> None:
        self.docker = docker_manager
        self.config = override(
            given_config(config), runtime=runtime, max_memory_mb=max_memory_mb,
            max_cpu_cores=max_cpu_cores, max_disk_mb=max_disk_mb,
            max_execution_time=max_execution_time, max_output_bytes=max_output_bytes,
            allow_insecure_runtime=allow_insecure_runtime,
        )  # fmt: skip
        self.manager_id = uuid.uuid4().hex[:12]
        self._owner = process_owner()
        self._sandboxes: dict[str, Sandbox] = {}
        self._replaced: dict[str, str] = {}
        self._launches: set[asyncio.Future[Sandbox]] = set()
        self._called_off: set[asyncio.Future[Sandbox]] = set()  # launches stop() cancelled
        self._lost: dict[str, str] = {}  # lost sandbox -> why, until its replacement is known
        self._profiles: dict[str, Profile] = {}  # by fingerprint: the pools' profiles
        self._started = False
        #: The policy profiles, each file checked when the manager starts (a broken one
        #: disables only its profile); set beforehand to share a set already loaded.
        self.profile_set: ProfileSet | None = None
        cfg = self.sandbox_config
        self.networks = SandboxNetworks(
            docker_manager,
            labels={LABEL_MANAGED: "1", LABEL_OWNER: self._owner, LABEL_MANAGER: self.manager_id},
            resolver=egress_resolver or system_resolver,
            allow_private=cfg.network.allow_private_destinations,
        )
        self.runs = Runs(docker_manager, cfg)
        self.files = Files(cfg.limits)
        self.installs = Installs(self.runs, self.files, network=cfg.network,
                                 cache=cfg.install_cache)  # fmt: skip
        self.launcher = Launcher(
            docker_manager, cfg, networks=self.networks, runs=self.runs, owner=self._owner,
            manager_id=self.manager_id, environments_dir=self.installs.environments_dir,
        )  # fmt: skip
        self.environments = Environments(self.installs, self.runs, cfg.environments)
        if self.installs.store is not None:  # errors a caller sees never name it
            remember_host_path("<install cache>", self.installs.store.directory)
        self.lazy_pool = lazy_pool
        self.pool = self._new_pool()

    @property
    def sandbox_config(self) -> SandboxConfig:
        return self.config.security.sandbox

    @property
    def limits(self) -> Limits:
        return self.sandbox_config.limits

    @property
    def sandboxes(self) -> dict[str, Sandbox]:
        """Live sandboxes by id (a copy)."""
        return dict(self._sandboxes)

    def effective_timeout(
        self, timeout_s: float | None, profile: Profile | None = None
    ) -> tuple[float, list[str]]:
        """The timeout a call gets and any warnings (see :func:`.runs.effective_timeout`),
        capped to ``profile``'s ``timeout_max_s``."""
        return cap_timeout(profile, *effective_timeout(self.limits, timeout_s))

    async def start(self) -> None:
        """Check the config, Docker and the runtime, then remove orphans of dead harombe
        processes and start filling the warm pool."""
        if not self.docker.started:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        cfg = self.sandbox_config
        if not cfg.enabled:
            raise ConfigError(
                "sandboxes are switched off (security.sandbox.enabled: false), so no code can "
                "run; set it to true to use the sandbox manager"
            )
        await check_runtimes(self.docker, cfg)
        await self.launcher.read_extra_cas()  # a bad path fails here, not per sandbox
        await self.sweep_orphans()
        if self.profile_set is None:  # a bad file is reported now, not at its first call
            self.profile_set = load_profile_set(self.config.security.profiles.directory)
        self._started = True
        self.pool = self._new_pool()
        for language in cfg.pool.prewarm:
            self.pool.fill(self.pool_key(language))
        log.info("sandbox_manager.started", runtime=cfg.runtime, manager_id=self.manager_id)

    async def sweep_orphans(self) -> int:
        """Remove containers (and networks) whose owning harombe process is gone; how many."""
        return await self.launcher.sweep_orphans()

    async def stop(self) -> None:
        """Destroy every sandbox this manager created, and every container and network labelled
        with its id (also ones a failed or cancelled create left)."""
        self._started = False
        while self._launches:  # called off: each removes what it had made before it ends
            self._called_off |= self._launches
            for launch in self._launches:
                launch.cancel()
            await asyncio.wait(set(self._launches))
        boxes = list(self._sandboxes.values()) + await self.pool.close()
        await self.launcher.background.wait()
        self._sandboxes.clear()
        await asyncio.gather(*(box.channel.close() for box in boxes))
        removed = await self.launcher.remove_all(boxes)
        log.info("sandbox_manager.stopped", removed=removed)

    def get(self, sandbox_id: str) -> Sandbox:
        """The live sandbox ``sandbox_id``; :class:`SandboxNotFoundError` otherwise."""
        box = self._sandboxes.get(check_sandbox_id(sandbox_id))
        if box is None:
            raise SandboxNotFoundError(not_found(sandbox_id, self._replaced, self._lost))
        return box

    async def create_sandbox(
        self,
        language: Language = "python",
        *,
        network_enabled: bool = False,
        allowed_domains: Sequence[str] = (),
        profile: Profile | None = None,
        environment: str | Sequence[str] | None = None,
    ) -> Sandbox:
        """A started sandbox, from the warm pool when one is ready, else started now; with
        ``profile`` (Python only), under that profile's runtime layer for life; with
        ``environment`` (a defined name, or requirements), with those packages importable."""
        if not self._started:
            raise UsageError("Sandbox manager not started: await sandbox_manager.start() first")
        if language not in LANGUAGES:
            raise UsageError(
                f"unknown language {str(language)[:40]!r}; use one of {', '.join(LANGUAGES)}"
            )
        if environment is not None:
            return await self._create_with_environment(
                language, environment, network_enabled=network_enabled,
                allowed_domains=allowed_domains, profile=profile,
            )  # fmt: skip
        # Only a sandbox that answers; a claim also starts a refill: the pool fills after use.
        box = None if network_enabled else await self.pool.claim(self.pool_key(language, profile))
        if box is not None:
            log.info("sandbox.claimed", sandbox_id=box.sandbox_id, language=language)
        if box is None and self._started:
            box = await self._launch(language, network_enabled=network_enabled,
                                     allowed_domains=allowed_domains, profile=profile)  # fmt: skip
        return await self._adopt(box)

    async def _adopt(self, box: Sandbox | None) -> Sandbox:
        """``box`` (claimed or started) is the caller's now, unless ``stop()`` ran meanwhile."""
        if not self._started or box is None:  # what was claimed is nobody's
            if box is not None:
                await settle(self.launcher.discard(box))
            raise UsageError(STOPPED_DURING_CREATE)
        self._sandboxes[box.sandbox_id] = box
        return box

    async def _launch(self, language: Language, **options: Any) -> Sandbox:
        """``launcher.launch``, tracked: ``stop()`` calls it off; its caller gets UsageError."""
        launch = asyncio.ensure_future(self.launcher.launch(language, **options))
        self._launches.add(launch)
        launch.add_done_callback(self._launches.discard)
        try:
            return await launch
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if launch in self._called_off and task is not None and not task.cancelling():
                raise UsageError(STOPPED_DURING_CREATE) from None
            raise
        finally:
            self._called_off.discard(launch)

    async def destroy_sandbox(self, sandbox_id: str) -> None:
        """Remove the sandbox's container; its id is unknown afterwards."""
        box = self.get(sandbox_id)
        self._sandboxes.pop(sandbox_id, None)
        await settle(self.launcher.scrap(box.channel, box.container_id))
        await settle(self.launcher.detach(sandbox_id))
        log.info("sandbox.destroyed", sandbox_id=sandbox_id, runs=box.runs)

    def set_allowed_domains(self, sandbox_id: str, allowed_domains: Sequence[str]) -> None:
        """Replace a network-enabled sandbox's allowed domains; the next connection obeys."""
        box = self.get(sandbox_id)
        if not box.network_enabled:
            raise UsageError(
                f"sandbox {sandbox_id} has no network; create it with network_enabled=True"
            )
        self.networks.set_allowed(sandbox_id, allowed_domains)
        box.allowed_domains = tuple(allowed_domains)

    async def execute(
        self,
        sandbox_id: str,
        code: str,
        *,
        language: Language | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        fresh: bool | None = None,
        output_mode: str | None = None,
    ) -> ExecutionResult:
        """Run ``code`` in the sandbox (see :meth:`.runs.Runs.execute`). Failures of the code
        are in the result; a sandbox that dies is replaced, and the result says by which."""
        box = self.get(sandbox_id)
        started = time.perf_counter()
        try:
            return await self.runs.execute(box, code, language=language, timeout_s=timeout_s,
                on_output=on_output, fresh=fresh, output_mode=output_mode)  # fmt: skip
        except SandboxLostError as exc:
            self._check_still_live(box)
            return await self._replace(box, exc, language=language or box.language, started=started)

    async def install_package(
        self,
        sandbox_id: str,
        package: str,
        registry: str = "pypi",
        *,
        on_progress: ProgressCallback | None = None,
    ) -> ExecutionResult:
        """Install a registry package into the sandbox, which stays offline throughout;
        ``on_progress`` (sync or async) is told each step (:mod:`.install_progress`)."""
        spec = packages.parse_spec(package, registry)
        box = self.get(sandbox_id)
        started = time.perf_counter()
        try:
            return await self.installs.install(box, spec, on_progress=on_progress)
        except SandboxLostError as exc:
            self._check_still_live(box)
            return await self._replace(box, exc, language="shell", started=started)

    async def write_file(self, sandbox_id: str, file_path: str, content: str | bytes) -> int:
        """Write ``content`` to ``/workspace/<file_path>``; bytes written (see :class:`Files`)."""
        box = self.get(sandbox_id)
        async with self._dropped_if_lost(box):
            return await self.files.write(box, file_path, content)

    async def read_file(self, sandbox_id: str, file_path: str) -> bytes:
        """The bytes of regular file ``/workspace/<file_path>`` (see :class:`Files`)."""
        box = self.get(sandbox_id)
        async with self._dropped_if_lost(box):
            return await self.files.read(box, file_path)

    async def list_directory(self, sandbox_id: str, path: str = ".") -> DirListing:
        """A workspace directory's entries, capped, with the count of all."""
        box = self.get(sandbox_id)
        async with self._dropped_if_lost(box):
            return await self.files.list_directory(box, path)

    def _check_still_live(self, box: Sandbox) -> None:
        """A sandbox destroyed (or its manager stopped) under a call is not replaced."""
        sid = box.sandbox_id
        if self._sandboxes.get(sid) is box:
            return
        if sid in self._lost or sid in self._replaced:  # another call found it dead first
            by = f"; sandbox {self._replaced[sid]} replaces it" if sid in self._replaced else ""
            raise SandboxLostError(f"sandbox {sid} was lost ({self._lost.get(sid, '')}){by}")
        why = "the sandbox manager was stopped" if not self._started else "it was destroyed"
        raise SandboxNotFoundError(f"Sandbox not found: {sid} is gone: {why} during the call")

    @contextlib.asynccontextmanager
    async def _dropped_if_lost(self, box: Sandbox) -> AsyncIterator[None]:
        """A file call that finds its sandbox dead drops it, saying its files are gone."""
        try:
            yield
        except SandboxLostError as exc:
            self._check_still_live(box)
            self._sandboxes.pop(box.sandbox_id, None)
            self._lost[box.sandbox_id] = str(exc)
            await settle(self.launcher.discard(box))
            raise SandboxLostError(
                f"{exc}; sandbox {box.sandbox_id} and its files are gone: create a new one"
            ) from None

    async def list_files(self, sandbox_id: str, path: str = ".") -> list[dict[str, Any]]:
        """Entries of a workspace directory, sorted by name (see :meth:`list_directory`)."""
        return (await self.list_directory(sandbox_id, path)).entries

    async def _replace(
        self, box: Sandbox, exc: SandboxLostError, *, language: str, started: float
    ) -> ExecutionResult:
        """``box`` died under a call: remove what is left of it, start a replacement with the
        same language and network, and return the call's result saying so."""
        reason = str(exc)
        self._sandboxes.pop(box.sandbox_id, None)
        self._lost[box.sandbox_id] = reason
        await settle(self.launcher.scrap(box.channel, box.container_id))
        await settle(self.launcher.detach(box.sandbox_id))
        try:
            # A pooled replacement must answer a ping first, so it is never another dead one.
            replacement = await self.create_sandbox(
                box.language, network_enabled=box.network_enabled,
                allowed_domains=box.allowed_domains, profile=box.profile,
            )  # fmt: skip
        except HarombeError as err:
            raise type(err)(
                f"sandbox {box.sandbox_id} was lost ({reason}) and no replacement could be "
                f"started: {err}"
            ) from err
        self._replaced[box.sandbox_id] = replacement.sandbox_id
        self._lost.pop(box.sandbox_id, None)
        log.warning("sandbox.lost", sandbox_id=box.sandbox_id,
                    replacement=replacement.sandbox_id, reason=reason)  # fmt: skip
        return lost_result(box, replacement.sandbox_id, reason, language=language,
                           elapsed_s=time.perf_counter() - started)  # fmt: skip

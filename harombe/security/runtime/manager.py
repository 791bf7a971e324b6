"""Sandbox lifecycle and the operations that run inside sandboxes.

A sandbox is a gVisor container whose PID 1 is harombe's supervisor. Calls on one sandbox are
serialised by its lock; calls on different sandboxes run concurrently. Every container carries
harombe labels: :meth:`SandboxManager.stop` removes this manager's, and
:meth:`SandboxManager.start` removes those left behind by a process that no longer exists.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from harombe.config import LANGUAGES, HarombeConfig, Language, load_config, override
from harombe.errors import (
    ConfigError,
    DockerUnavailableError,
    HarombeError,
    InsecureRuntimeError,
    LimitNotAppliedError,
    RuntimeNotAvailableError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxStartError,
    UsageError,
)
from harombe.security.guest import JS_WORKER_SOURCE
from harombe.security.runtime.channel import Channel, blob_cap_bytes
from harombe.security.runtime.docker import DockerManager, settle
from harombe.security.runtime.egress import Resolver, system_resolver
from harombe.security.runtime.files import FileOps
from harombe.security.runtime.installs import PackageInstalls
from harombe.security.runtime.network import CA_BUNDLE, Lease, SandboxNetworks
from harombe.security.runtime.pool import Background, WarmPool
from harombe.security.runtime.runs import GVISOR_RUNTIMES, Execution
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_MANAGER,
    LABEL_OWNER,
    RUN_ENV,
    SESSION_LANGUAGES,
    Sandbox,
    check_sandbox_id,
    container_spec,
    new_sandbox_id,
    owner_is_gone,
    process_owner,
)

log = structlog.get_logger(__name__)

START_TIMEOUT_S = 30.0
#: How long a pooled sandbox may take to answer the ping that precedes handing it out.
CLAIM_PING_TIMEOUT_S = 3.0


class SandboxManager(Execution, FileOps, PackageInstalls):
    """Creates, runs and destroys sandboxes. ``await start()`` before use, ``stop()`` after."""

    def __init__(
        self,
        docker_manager: DockerManager,
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
    ) -> None:
        self.docker = docker_manager
        self.config = override(
            config or load_config(),
            runtime=runtime,
            max_memory_mb=max_memory_mb,
            max_cpu_cores=max_cpu_cores,
            max_disk_mb=max_disk_mb,
            max_execution_time=max_execution_time,
            max_output_bytes=max_output_bytes,
            allow_insecure_runtime=allow_insecure_runtime,
        )
        self.manager_id = uuid.uuid4().hex[:12]
        self._owner = process_owner()
        self._sandboxes: dict[str, Sandbox] = {}
        self._replaced: dict[str, str] = {}
        self._started = False
        self._late_cpu_limit = True  # see harombe.security.runtime.cgroups
        self._extra_cas = b""
        # Containers whose removal failed because Docker could not be reached: retried when it
        # answers again, and by stop().
        self._unremoved: set[str] = set()
        self._background = Background()
        network = self.sandbox_config.network
        self.networks = SandboxNetworks(
            docker_manager,
            labels={LABEL_MANAGED: "1", LABEL_OWNER: self._owner, LABEL_MANAGER: self.manager_id},
            resolver=egress_resolver or system_resolver,
            allow_private=network.allow_private_destinations,
        )
        self.pool = self._new_pool()

    def _new_pool(self) -> WarmPool:
        pool = self.sandbox_config.pool
        return WarmPool(
            self._launch_pooled,
            self._discard,
            size=pool.size,
            max_age_s=pool.max_age_s,
            probe=self._answers,
        )

    async def _answers(self, box: Sandbox) -> bool:
        """Whether ``box``'s supervisor answers a ping in time (a paused or hung one does not)."""
        if box.channel.lost is not None:
            return False
        try:
            reply, _ = await box.channel.request({"op": "ping"}, timeout_s=CLAIM_PING_TIMEOUT_S)
        except SandboxLostError:
            return False
        return reply.get("ok") is True

    def pool_key(self, language: Language) -> tuple[str, ...]:
        """The warm-pool key of ``language``'s sandboxes: language, image, runtime and limits."""
        cfg = self.sandbox_config
        return (language, cfg.image_for(language), cfg.runtime, cfg.limits.model_dump_json())

    async def wait_pool_settled(self) -> None:
        """Wait until the warm pool has finished refilling and background removals are done
        (for benchmarks and tests)."""
        await self.pool.settled()
        await self._background.wait()

    @property
    def sandbox_config(self) -> Any:
        return self.config.security.sandbox

    @property
    def limits(self) -> Any:
        return self.sandbox_config.limits

    @property
    def sandboxes(self) -> dict[str, Sandbox]:
        """Live sandboxes by id (a copy)."""
        return dict(self._sandboxes)

    async def start(self) -> None:
        """Check Docker and the runtime, then remove orphans of dead harombe processes."""
        if not self.docker.started:
            raise UsageError("Docker manager not started: await docker_manager.start() first")
        cfg = self.sandbox_config
        if cfg.runtime not in GVISOR_RUNTIMES and not cfg.allow_insecure_runtime:
            raise InsecureRuntimeError(
                f"runtime {cfg.runtime!r} is not gVisor, so sandboxed code would share the host "
                "kernel; use runtime 'runsc', or set security.sandbox.allow_insecure_runtime: "
                "true to accept weaker isolation"
            )
        net_runtime = cfg.network.runtime
        if net_runtime not in GVISOR_RUNTIMES and not cfg.allow_insecure_runtime:
            raise InsecureRuntimeError(
                f"security.sandbox.network.runtime {net_runtime!r} is not gVisor; use "
                "'runsc-net', or set security.sandbox.allow_insecure_runtime: true"
            )
        runtimes = await self.docker.runtimes()
        if net_runtime not in runtimes:
            log.warning(
                "sandbox_manager.no_network_runtime",
                runtime=net_runtime,
                fix="run scripts/setup.sh; network-enabled sandboxes need it",
            )
        if cfg.runtime not in runtimes:
            raise RuntimeNotAvailableError(
                f"the {cfg.runtime!r} runtime is not registered with Docker (registered: "
                f"{', '.join(sorted(runtimes)) or 'none'}); run scripts/setup.sh, or add it to "
                "/etc/docker/daemon.json and restart dockerd"
            )
        self._extra_cas = await self._read_extra_cas()  # a bad path fails here, not per sandbox
        await self.sweep_orphans()
        self._started = True
        self.pool = self._new_pool()
        for language in cfg.pool.prewarm:
            self.pool.fill(self.pool_key(language))
        log.info("sandbox_manager.started", runtime=cfg.runtime, manager_id=self.manager_id)

    async def sweep_orphans(self) -> int:
        """Remove containers whose owning harombe process is gone; how many were removed."""
        found = await self.docker.list_containers({LABEL_MANAGED: "1"})
        host = socket.gethostname()
        orphans = [c for c in found if owner_is_gone(c.labels.get(LABEL_OWNER, ""), hostname=host)]
        await asyncio.gather(*(self.docker.remove_container(c.id) for c in orphans))
        if orphans:
            log.info("sandbox.orphans_removed", count=len(orphans))
        # Their networks (and firewall rules) go after them: a network in use cannot be removed.
        await self.networks.sweep(
            lambda labels: owner_is_gone(labels.get(LABEL_OWNER, ""), hostname=host)
        )
        return len(orphans)

    async def stop(self) -> None:
        """Destroy every sandbox this manager created, and every container and network labelled
        with its id (also ones a failed or cancelled create left)."""
        self._started = False
        boxes = list(self._sandboxes.values()) + await self.pool.close()
        await self._background.wait()
        networks = self.networks
        self._sandboxes.clear()
        await asyncio.gather(*(box.channel.close() for box in boxes))
        if self.docker.started:
            leftovers = await self.docker.list_containers({LABEL_MANAGER: self.manager_id})
            ids = {box.container_id for box in boxes} | {c.id for c in leftovers}
            ids |= self._unremoved
            await asyncio.gather(*(self.docker.remove_container(cid) for cid in ids))
            self._unremoved.clear()
            await networks.close()
            # Networks no lease knows of any more (a detach that failed while Docker was away).
            await networks.sweep(lambda labels: labels.get(LABEL_MANAGER) == self.manager_id)
        log.info("sandbox_manager.stopped", removed=len(boxes))

    def _require_started(self) -> None:
        if not self._started:
            raise UsageError("Sandbox manager not started: await sandbox_manager.start() first")

    def get(self, sandbox_id: str) -> Sandbox:
        """The live sandbox ``sandbox_id``; :class:`SandboxNotFoundError` otherwise."""
        check_sandbox_id(sandbox_id)
        box = self._sandboxes.get(sandbox_id)
        if box is None:
            if sandbox_id in self._replaced:
                raise SandboxNotFoundError(
                    f"Sandbox not found: {sandbox_id} was lost and replaced by "
                    f"{self._replaced[sandbox_id]}; use that id"
                )
            raise SandboxNotFoundError(
                f"Sandbox not found: {sandbox_id} does not exist or was destroyed; "
                "create a new one with code_execute"
            )
        return box

    async def create_sandbox(
        self,
        language: Language = "python",
        *,
        network_enabled: bool = False,
        allowed_domains: Sequence[str] = (),
    ) -> Sandbox:
        """A started sandbox, from the warm pool when one is ready, else started now."""
        self._require_started()
        if language not in LANGUAGES:
            raise UsageError(
                f"unknown language {str(language)[:40]!r}; use one of {', '.join(LANGUAGES)}"
            )
        if not network_enabled:
            key = self.pool_key(language)
            # Only a sandbox that answers; also starts a refill: the pool fills after first use.
            box = await self.pool.claim(key)
            if box is not None:
                self._sandboxes[box.sandbox_id] = box
                log.info("sandbox.claimed", sandbox_id=box.sandbox_id, language=language)
                return box
        box = await self._launch(
            language, network_enabled=network_enabled, allowed_domains=allowed_domains
        )
        self._sandboxes[box.sandbox_id] = box
        return box

    async def _launch_pooled(self, key: Any) -> Sandbox:
        box = await self._launch(key[0], pooled=True)
        if self.sandbox_config.stateful and box.language in SESSION_LANGUAGES:
            # Start the session interpreter now, so the first call on it pays nothing.
            try:
                reply, _ = await box.channel.request(
                    {"op": "warm", **self._session_fields(box, box.language)},
                    timeout_s=START_TIMEOUT_S,
                )
            except BaseException:
                await settle(self._discard(box))  # cancelled (stop()) or lost: keep nothing
                raise
            if not reply.get("ok"):
                await settle(self._discard(box))
                raise SandboxStartError(f"session interpreter did not start: {reply}")
        return box

    async def _discard(self, box: Sandbox) -> None:
        await box.channel.close()
        await self._remove(box.container_id)

    async def _remove(self, container_id: str) -> None:
        """Remove a container; if Docker cannot be reached, remember it and retry later."""
        try:
            await self.docker.remove_container(container_id)
        except DockerUnavailableError as exc:
            self._unremoved.add(container_id)
            log.warning("sandbox.removal_deferred", container=container_id[:12], error=str(exc))
        else:
            self._unremoved.discard(container_id)

    def _retry_removals(self) -> None:
        """Docker answers again: remove what could not be removed while it was away."""
        for container_id in list(self._unremoved):
            self._unremoved.discard(container_id)
            self._background.spawn(self._remove(container_id), name=f"remove-{container_id[:12]}")

    def _session_fields(self, box: Sandbox, language: str) -> dict[str, Any]:
        """What the supervisor needs to start the session interpreter for ``language``.

        The JavaScript worker's source goes to a sandbox once; its supervisor keeps it, so
        calls do not carry it each time."""
        fields: dict[str, Any] = {
            "session": True,
            "language": language,
            "env": {**RUN_ENV, **box.env},
            "cwd": "/workspace",
            "max_pids": self.limits.max_pids,
        }
        if language == "javascript" and not box.js_worker_sent:
            fields["worker_source"] = JS_WORKER_SOURCE
            box.js_worker_sent = True
        return fields

    async def _launch(
        self,
        language: Language,
        *,
        network_enabled: bool = False,
        allowed_domains: Sequence[str] = (),
        pooled: bool = False,
    ) -> Sandbox:
        cfg = self.sandbox_config
        image = cfg.image_for(language)
        sandbox_id = new_sandbox_id()
        started = time.perf_counter()
        await self.docker.image_id(image)  # a clear ImageNotFoundError before creating anything
        if self._unremoved:
            self._retry_removals()
        lease = None
        if network_enabled:
            # Its own --internal network, the egress proxy on the gateway, firewall rules; made
            # whole even if the caller is cancelled meanwhile, and then taken down again.
            lease = await settle(
                self.networks.attach(sandbox_id, allowed_domains),
                undo=lambda _: self.networks.detach(sandbox_id),
            )
        try:
            return await self._start_container(
                sandbox_id, language, image, started,
                pooled=pooled, lease=lease, allowed_domains=allowed_domains,
            )  # fmt: skip
        except BaseException:
            if lease is not None:
                await settle(self._detach(sandbox_id))
            raise

    async def _detach(self, sandbox_id: str) -> None:
        """Take a sandbox's network down; Docker being away leaves it for stop()'s sweep."""
        try:
            await self.networks.detach(sandbox_id)
        except HarombeError as exc:
            log.warning("network.removal_deferred", sandbox_id=sandbox_id, error=str(exc))

    async def _start_container(
        self,
        sandbox_id: str,
        language: Language,
        image: str,
        started: float,
        *,
        pooled: bool,
        lease: Lease | None,
        allowed_domains: Sequence[str],
    ) -> Sandbox:
        cfg = self.sandbox_config
        network_enabled = lease is not None
        env = lease.environment() if lease is not None else {}
        spec = container_spec(
            sandbox_id,
            image=image,
            config=cfg,
            owner=self._owner,
            manager_id=self.manager_id,
            language=language,
            pooled=pooled,
            cpu_at_create=not self._late_cpu_limit,
            network=lease.network_name if lease is not None else None,
            extra_env=env,
        )
        container_id = await self.docker.create_container(**spec)
        channel: Channel | None = None
        try:
            stdio = await self.docker.attach(container_id)
            channel = Channel(
                stdio,
                sandbox_id=sandbox_id,
                max_blob_bytes=blob_cap_bytes(
                    cfg.limits.max_file_bytes, cfg.limits.max_output_bytes
                ),
            )
            await self.docker.start_container(container_id)
            if lease is not None:  # its proxy serves this container's address and no other
                await self.networks.bind(sandbox_id, container_id)
            info = await channel.hello(timeout_s=START_TIMEOUT_S)
            if self._late_cpu_limit:
                # The boot ran unthrottled; the quota binds before any code can run here.
                await self.docker.limit_cpu(container_id, cpu_cores=cfg.limits.max_cpu_cores)
            box = Sandbox(
                sandbox_id=sandbox_id,
                container_id=container_id,
                language=language,
                image=image,
                runtime=cfg.network.runtime if network_enabled else cfg.runtime,
                channel=channel,
                info=info,
                network_enabled=network_enabled,
                allowed_domains=tuple(allowed_domains),
                env=env,
            )
            if lease is not None:
                await self._install_ca_bundle(box)
        except BaseException as exc:
            # Nothing half-started is kept: not the channel, not the container — even when the
            # caller is cancelled again while this clean-up runs.
            await settle(self._scrap(channel, container_id))
            if not isinstance(exc, LimitNotAppliedError):
                raise
            log.warning("sandbox.cpu_limit_fallback", reason=str(exc))
            self._late_cpu_limit = False  # Docker's create-time quota from now on
            return await self._start_container(
                sandbox_id, language, image, started,
                pooled=pooled, lease=lease, allowed_domains=allowed_domains,
            )  # fmt: skip
        log.info(
            "sandbox.created",
            sandbox_id=sandbox_id,
            language=language,
            image=image,
            runtime=box.runtime,
            pooled=pooled,
            duration_s=round(time.perf_counter() - started, 4),
        )
        return box

    async def _scrap(self, channel: Channel | None, container_id: str) -> None:
        if channel is not None:
            await channel.close()
        await self._remove(container_id)

    async def destroy_sandbox(self, sandbox_id: str) -> None:
        """Remove the sandbox's container; its id is unknown afterwards."""
        box = self.get(sandbox_id)
        self._sandboxes.pop(sandbox_id, None)
        await settle(self._scrap(box.channel, box.container_id))
        await settle(self._detach(sandbox_id))
        log.info("sandbox.destroyed", sandbox_id=sandbox_id, runs=box.runs)

    async def _read_extra_cas(self) -> bytes:
        """The configured extra CA certificates, read once when the manager starts."""
        extra = b""
        for path in self.sandbox_config.network.extra_ca_certificates:
            try:
                pem = await asyncio.to_thread(Path(path).read_bytes)
            except OSError as exc:
                raise ConfigError(
                    f"security.sandbox.network.extra_ca_certificates: cannot read {path} "
                    f"({exc.strerror}); give the path of a PEM file on this host"
                ) from None
            extra += pem.rstrip(b"\n") + b"\n"
        return extra

    async def _install_ca_bundle(self, box: Sandbox) -> None:
        """The image's CA bundle plus the configured extra CAs, before any code runs."""
        script = (
            f"mkdir -p {CA_BUNDLE.rsplit('/', 1)[0]} && "
            f"cat /etc/ssl/certs/ca-certificates.crt - > {CA_BUNDLE}"
        )
        result = await self._run(box, ["bash", "-c", script], self._extra_cas, language="shell",
                                 timeout_s=30)  # fmt: skip
        if not result.success:
            raise SandboxStartError(f"could not write the CA bundle: {result.stderr.strip()}")

    def set_allowed_domains(self, sandbox_id: str, allowed_domains: Sequence[str]) -> None:
        """Replace a network-enabled sandbox's allowed domains; the next connection obeys."""
        box = self.get(sandbox_id)
        if not box.network_enabled:
            raise UsageError(
                f"sandbox {sandbox_id} has no network; create it with network_enabled=True"
            )
        self.networks.set_allowed(sandbox_id, allowed_domains)
        box.allowed_domains = tuple(allowed_domains)

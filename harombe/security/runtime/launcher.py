"""Container start-up: from a language and a network choice to a sandbox whose supervisor has
answered, and back to nothing.

:class:`Launcher` creates the container (attached before start, so no output is missed),
binds a network-enabled sandbox's proxy to its address, waits for the supervisor's greeting,
applies the CPU quota before any code can run, writes the CA bundle of a network-enabled
sandbox, and brings up the runtime layer of a sandbox with a policy profile (its limits and
environment from :mod:`.profiled`). Nothing half-started is kept: a failure or a cancellation
at any step removes the channel, the container and the network again. Removals Docker cannot
do while it is away are remembered and retried when it answers.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from harombe.config import Language, SandboxConfig
from harombe.errors import (
    ConfigError,
    DockerUnavailableError,
    HarombeError,
    LimitNotAppliedError,
    SandboxLostError,
    SandboxStartError,
)
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.cgroups import CpuQuota
from harombe.security.runtime.channel import Channel, blob_cap_bytes
from harombe.security.runtime.network import CA_BUNDLE, Lease, SandboxNetworks
from harombe.security.runtime.profiled import check_language, profile_config, profile_env
from harombe.security.runtime.runs import Runs
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_MANAGER,
    LABEL_OWNER,
    SESSION_LANGUAGES,
    Sandbox,
    container_spec,
    new_sandbox_id,
    owner_is_gone,
)
from harombe.security.runtime.tasks import Background, settle

log = structlog.get_logger(__name__)

START_TIMEOUT_S = 30.0
#: How long a profile's runtime layer may take to come up (its preimports included).
LAYER_START_TIMEOUT_S = 120.0
#: How long a pooled sandbox may take to answer the ping that precedes handing it out.
CLAIM_PING_TIMEOUT_S = 3.0


class Launcher:
    """Starts and removes the sandboxes of one manager (``owner`` and ``manager_id`` label
    every container it makes)."""

    def __init__(
        self,
        docker: DockerBackend,
        config: SandboxConfig,
        *,
        networks: SandboxNetworks,
        runs: Runs,
        owner: str,
        manager_id: str,
        environments_dir: str | None = None,
    ) -> None:
        self._docker = docker
        self._environments_dir = environments_dir
        self._config = config
        self._networks = networks
        self._runs = runs
        self._owner = owner
        self._manager_id = manager_id
        self._cpu = CpuQuota(docker)
        self._late_cpu_limit = True  # see harombe.security.runtime.cgroups
        self._extra_cas = b""
        # Containers whose removal failed because Docker could not be reached: retried when it
        # answers again, and by the manager's stop().
        self.unremoved: set[str] = set()
        self.background = Background()

    async def read_extra_cas(self) -> None:
        """Read the configured extra CA certificates (once, when the manager starts)."""
        extra = b""
        for path in self._config.network.extra_ca_certificates:
            try:
                pem = await asyncio.to_thread(Path(path).read_bytes)
            except OSError as exc:
                raise ConfigError(
                    f"security.sandbox.network.extra_ca_certificates: cannot read {path} "
                    f"({exc.strerror}); give the path of a PEM file on this host"
                ) from None
            extra += pem.rstrip(b"\n") + b"\n"
        self._extra_cas = extra

    async def launch(
        self,
        language: Language,
        *,
        network_enabled: bool = False,
        allowed_domains: Sequence[str] = (),
        pooled: bool = False,
        profile: Profile | None = None,
    ) -> Sandbox:
        """A started sandbox for ``language``; with ``network_enabled``, on its own network
        whose proxy lets it reach ``allowed_domains`` only; with ``profile`` (Python only),
        its runtime layer up (preimports done) before it is returned."""
        if profile is not None:
            check_language(profile, language)
        image = self._config.image_for(language)
        sandbox_id = new_sandbox_id()
        started = time.perf_counter()
        await self._docker.image_id(image)  # a clear ImageNotFoundError before creating anything
        if self.unremoved:
            self.retry_removals()
        lease = None
        if network_enabled:
            # Its own --internal network, the egress proxy on the gateway, firewall rules; made
            # whole even if the caller is cancelled meanwhile, and then taken down again.
            lease = await settle(
                self._networks.attach(sandbox_id, allowed_domains),
                undo=lambda _: self._networks.detach(sandbox_id),
            )
        try:
            box = await self._start(sandbox_id, language, image, pooled=pooled, lease=lease,
                                    allowed_domains=allowed_domains, profile=profile)  # fmt: skip
        except BaseException:
            if lease is not None:
                await settle(self.detach(sandbox_id))
            raise
        try:
            await self.check_layer(box)
        except BaseException:
            await settle(self.discard(box))  # a sandbox without its layer is nobody's
            raise
        log.info(
            "sandbox.created", sandbox_id=sandbox_id, language=language, image=image,
            runtime=box.runtime, pooled=pooled, profile=profile and profile.name,
            duration_s=round(time.perf_counter() - started, 4),
        )  # fmt: skip
        return box

    async def launch_pooled(self, language: Language, profile: Profile | None = None) -> Sandbox:
        """A sandbox for the warm pool: started, and its session interpreter running (with
        ``profile``'s layer applied and its preimports done)."""
        box = await self.launch(language, pooled=True, profile=profile)
        if not (self._config.stateful and box.language in SESSION_LANGUAGES):
            return box
        # Start the session interpreter now, so the first call on it pays nothing.
        try:
            reply, _ = await box.channel.request(
                {"op": "warm", **self._runs.session_fields(box, box.language)},
                timeout_s=START_TIMEOUT_S,
            )
        except BaseException:
            await settle(self.discard(box))  # cancelled (stop()) or lost: keep nothing
            raise
        if not reply.get("ok"):
            await settle(self.discard(box))
            raise SandboxStartError(f"session interpreter did not start: {reply}")
        return box

    async def check_layer(self, box: Sandbox) -> None:
        """Bring up the runtime layer of a new profiled sandbox (its interpreter starts and
        preimports) and check it holds; :class:`SandboxStartError` naming the failure if not.

        Runs no code: the request is empty, and it does not count as a run of the sandbox."""
        profile = box.profile
        if profile is None:
            return
        async with box.lock:
            result = await self._runs.run(
                box, ["python3", "-"], b"", language="python",
                timeout_s=LAYER_START_TIMEOUT_S, session=True,
            )  # fmt: skip
        box.runs -= 1  # nothing of the user's ran: a pooled sandbox stays unused
        if not result.success:
            why = (result.stderr.strip() or result.error or result.status)[-800:]
            raise SandboxStartError(
                f"the runtime layer of profile {profile.name!r} could not be applied in "
                f"sandbox {box.sandbox_id}: {why}; fix the profile (its preimport modules must "
                "be in the sandbox image) and try again"
            )

    async def _start(
        self,
        sandbox_id: str,
        language: Language,
        image: str,
        *,
        pooled: bool,
        lease: Lease | None,
        allowed_domains: Sequence[str],
        profile: Profile | None = None,
    ) -> Sandbox:
        cfg = profile_config(self._config, profile)
        env = lease.environment() if lease is not None else {}
        if profile is not None:
            env.update(profile_env(profile))
        spec = container_spec(
            sandbox_id, image=image, config=cfg, owner=self._owner,
            manager_id=self._manager_id, language=language, pooled=pooled,
            cpu_at_create=not self._late_cpu_limit,
            network=lease.network_name if lease is not None else None, extra_env=env,
            environments_dir=self._environments_dir,
        )  # fmt: skip
        container_id = await self._docker.create_container(**spec)
        channel: Channel | None = None
        try:
            channel = await self._connect(sandbox_id, container_id)
            info = await self._boot(sandbox_id, container_id, channel, lease)
            box = Sandbox(
                sandbox_id=sandbox_id, container_id=container_id, language=language,
                image=image, runtime=spec["runtime"], channel=channel, info=info,
                network_enabled=lease is not None, allowed_domains=tuple(allowed_domains),
                env=env, profile=profile, limits=None if cfg is self._config else cfg.limits,
            )  # fmt: skip
            if lease is not None:
                await self.install_ca_bundle(box)
        except BaseException as exc:
            # Nothing half-started is kept: not the channel, not the container — even when the
            # caller is cancelled again while this clean-up runs.
            await settle(self.scrap(channel, container_id))
            if not isinstance(exc, LimitNotAppliedError):
                raise
            log.warning("sandbox.cpu_limit_fallback", reason=str(exc))
            self._late_cpu_limit = False  # Docker's create-time quota from now on
            return await self._start(sandbox_id, language, image, pooled=pooled, lease=lease,
                                     allowed_domains=allowed_domains, profile=profile)  # fmt: skip
        return box

    async def _connect(self, sandbox_id: str, container_id: str) -> Channel:
        limits = self._config.limits
        stdio = await self._docker.attach(container_id)
        return Channel(
            stdio,
            sandbox_id=sandbox_id,
            max_blob_bytes=blob_cap_bytes(limits.max_file_bytes, limits.max_output_bytes),
        )

    async def _boot(
        self, sandbox_id: str, container_id: str, channel: Channel, lease: Lease | None
    ) -> dict[str, Any]:
        """Start the container and wait for its supervisor; the supervisor's greeting."""
        await self._docker.start_container(container_id)
        if lease is not None:  # its proxy serves this container's address and no other
            await self._networks.bind(sandbox_id, container_id)
        info = await channel.hello(timeout_s=START_TIMEOUT_S)
        if self._late_cpu_limit:
            # The boot ran unthrottled; the quota binds before any code can run here.
            await self._cpu.apply(container_id, cpu_cores=self._config.limits.max_cpu_cores)
        return info

    async def answers(self, box: Sandbox) -> bool:
        """Whether ``box``'s supervisor answers a ping in time (a paused or hung one does not)."""
        if box.channel.lost is not None:
            return False
        try:
            reply, _ = await box.channel.request({"op": "ping"}, timeout_s=CLAIM_PING_TIMEOUT_S)
        except SandboxLostError:
            return False
        return reply.get("ok") is True

    async def install_ca_bundle(self, box: Sandbox) -> None:
        """The image's CA bundle plus the configured extra CAs, before any code runs."""
        script = (
            f"mkdir -p {CA_BUNDLE.rsplit('/', 1)[0]} && "
            f"cat /etc/ssl/certs/ca-certificates.crt - > {CA_BUNDLE}"
        )
        result = await self._runs.run(box, ["bash", "-c", script], self._extra_cas,
                                      language="shell", timeout_s=30)  # fmt: skip
        if not result.success:
            raise SandboxStartError(f"could not write the CA bundle: {result.stderr.strip()}")

    async def discard(self, box: Sandbox) -> None:
        """Close ``box``'s channel and remove its container (and network)."""
        await self.scrap(box.channel, box.container_id)
        if box.network_enabled:
            await self.detach(box.sandbox_id)

    async def scrap(self, channel: Channel | None, container_id: str) -> None:
        if channel is not None:
            await channel.close()
        await self.remove(container_id)

    async def remove(self, container_id: str) -> None:
        """Remove a container; if Docker cannot be reached, remember it and retry later."""
        try:
            await self._docker.remove_container(container_id)
        except DockerUnavailableError as exc:
            self.unremoved.add(container_id)
            log.warning("sandbox.removal_deferred", container=container_id[:12], error=str(exc))
        else:
            self.unremoved.discard(container_id)

    async def remove_all(self, boxes: list[Sandbox]) -> int:
        """Remove ``boxes`` and every container and network labelled with this manager's id
        (also ones a failed or cancelled create left); how many sandboxes were removed. With
        Docker away, says what it left (the next start's sweep removes it) and removes none."""
        if not self._docker.started:
            if boxes or self.unremoved:
                log.warning("sandbox_manager.containers_left", fix="start Docker and call "
                            "stop() again, or the next start() sweeps them",
                            containers=sorted(b.container_id[:12] for b in boxes))  # fmt: skip
            return 0
        leftovers = await self._docker.list_containers({LABEL_MANAGER: self._manager_id})
        ids = {box.container_id for box in boxes} | {c.id for c in leftovers} | self.unremoved
        await asyncio.gather(*(self._docker.remove_container(cid) for cid in ids))
        self.unremoved.clear()
        await self._networks.close()
        # Networks no lease knows of any more (a detach that failed while Docker was away).
        await self._networks.sweep(lambda labels: labels.get(LABEL_MANAGER) == self._manager_id)
        return len(boxes)

    def retry_removals(self) -> None:
        """Docker answers again: remove what could not be removed while it was away."""
        for container_id in list(self.unremoved):
            self.unremoved.discard(container_id)
            self.background.spawn(self.remove(container_id), name=f"remove-{container_id[:12]}")

    async def sweep_orphans(self) -> int:
        """Remove containers whose owning harombe process is gone; how many were removed."""
        found = await self._docker.list_containers({LABEL_MANAGED: "1"})
        host = socket.gethostname()
        orphans = [c for c in found if owner_is_gone(c.labels.get(LABEL_OWNER, ""), hostname=host)]
        await asyncio.gather(*(self._docker.remove_container(c.id) for c in orphans))
        if orphans:
            log.info("sandbox.orphans_removed", count=len(orphans))
        # Their networks (and firewall rules) go after them: a network in use cannot be removed.
        await self._networks.sweep(
            lambda labels: owner_is_gone(labels.get(LABEL_OWNER, ""), hostname=host)
        )
        return len(orphans)

    async def detach(self, sandbox_id: str) -> None:
        """Take a sandbox's network down; Docker being away leaves it for stop()'s sweep."""
        try:
            await self._networks.detach(sandbox_id)
        except HarombeError as exc:
            log.warning("network.removal_deferred", sandbox_id=sandbox_id, error=str(exc))

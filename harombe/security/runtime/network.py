"""Per-sandbox networks: an ``--internal`` Docker network, the egress proxy on its gateway, and
firewall rules that let the sandbox reach nothing on the host but that proxy.

See ``docs/network.md``. One network per network-enabled sandbox, so a sandbox never shares a
network with another, and the proxy on a gateway serves exactly one sandbox: the firewall lets
only that sandbox's address, on that network's bridge, reach that gateway's proxy port, and the
proxy itself refuses any other peer address. Until :meth:`SandboxNetworks.bind` learns the
sandbox's address (after its container starts, before any code runs), nothing reaches the proxy.
IPv6 is switched off on the bridge, so the host has no address a sandbox could reach it by
there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from harombe.errors import InfrastructureError
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.egress import EgressProxy
from harombe.security.runtime.egress_resources import (
    ConnectionBudget,
    Resolver,
    raise_fd_limit,
    system_resolver,
)
from harombe.security.runtime.tasks import settle

log = structlog.get_logger(__name__)

PROXY_PORT = 3128
#: The CA bundle of a network-enabled sandbox (the image's, plus configured extra CAs), written
#: before any code runs, and the variables that make common clients use it.
CA_BUNDLE = "/home/sandbox/.harombe/ca-certificates.pem"
CA_ENV = {name: CA_BUNDLE for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                        "PIP_CERT", "NODE_EXTRA_CA_CERTS")}  # fmt: skip
LABEL_NETWORK = "harombe.network"


@dataclass
class Lease:
    """A sandbox's network: its Docker network, bridge, proxy and current allowlist."""

    sandbox_id: str
    network_id: str
    network_name: str
    bridge: str
    gateway: str
    allowlist: Allowlist
    proxy: EgressProxy | None = None
    rules: list[list[str]] = field(default_factory=list)
    client_ip: str | None = None  # the sandbox's address on the network, once bound

    @property
    def proxy_url(self) -> str:
        return f"http://{self.gateway}:{PROXY_PORT}"

    def environment(self) -> dict[str, str]:
        """What code in the sandbox needs to go through the proxy (every common spelling)."""
        url = self.proxy_url
        env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        env.update(NO_PROXY="localhost,127.0.0.1", no_proxy="localhost,127.0.0.1")
        env["npm_config_proxy"] = env["npm_config_https_proxy"] = url
        env["NODE_USE_ENV_PROXY"] = "1"  # Node's fetch() honours HTTP(S)_PROXY only with this
        env.update(CA_ENV)
        return env


async def _iptables(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "iptables", "-w", *args, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise InfrastructureError(
            f"iptables {' '.join(args)} failed: {err.decode().strip()}; harombe needs root on "
            "the Docker host to keep network-enabled sandboxes away from host services"
        )


async def _rules_for(chain: str, bridge: str) -> list[list[str]]:
    """The rules in ``chain`` that match traffic coming in on ``bridge``."""
    proc = await asyncio.create_subprocess_exec(
        "iptables", "-w", "-S", chain, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    rules = []
    for line in out.decode().splitlines():
        words = line.split()
        if words[:2] == ["-A", chain] and "-i" in words and bridge in words:
            rules.append(words[2:])
    return rules


async def _disable_ipv6(bridge: str) -> None:
    """Switch IPv6 off on the host side of ``bridge``: no link-local address the sandbox could
    reach host services by (the IPv4 firewall rules do not cover IPv6). A host without IPv6
    has nothing to switch off."""
    path = f"/proc/sys/net/ipv6/conf/{bridge}/disable_ipv6"

    def write() -> None:
        with contextlib.suppress(FileNotFoundError), open(path, "w") as f:
            f.write("1\n")

    try:
        await asyncio.get_running_loop().run_in_executor(None, write)
    except OSError as exc:
        raise InfrastructureError(
            f"cannot switch IPv6 off on {bridge} ({exc.strerror}); harombe needs root on the "
            "Docker host to keep network-enabled sandboxes away from host services"
        ) from exc


def _is_admission(rule: list[str]) -> bool:
    """Whether a recorded rule is the one that lets the sandbox reach its proxy."""
    return rule[-1] == "ACCEPT"


class SandboxNetworks:
    """Creates and removes sandbox networks; see the module docstring."""

    def __init__(
        self,
        docker: DockerBackend,
        *,
        labels: dict[str, str],
        resolver: Resolver = system_resolver,
        allow_private: bool = False,
    ) -> None:
        self.docker = docker
        self.labels = labels
        self.resolver = resolver
        self.allow_private = allow_private
        self._leases: dict[str, Lease] = {}
        # Every proxy of this process shares one budget, derived from the fd limit raised here.
        self.budget = ConnectionBudget.from_fd_limit(raise_fd_limit())

    def get(self, sandbox_id: str) -> Lease | None:
        return self._leases.get(sandbox_id)

    async def attach(self, sandbox_id: str, allowed_domains: Sequence[str]) -> Lease:
        """A new network for ``sandbox_id`` with its proxy and firewall rules in place."""
        allowlist = Allowlist.parse(allowed_domains)
        name = f"harombe-{sandbox_id}"
        labels = {**self.labels, LABEL_NETWORK: sandbox_id}
        network_id, gateway = await self.docker.create_network(name, labels=labels)
        lease = Lease(sandbox_id, network_id, name, "", gateway, allowlist)
        try:
            lease.bridge = await self.docker.network_bridge(network_id)
            lease.proxy = EgressProxy(
                # Only the sandbox's own address is served, and only once it is known.
                lambda client: (
                    (sandbox_id, lease.allowlist)
                    if lease.client_ip is not None and client == lease.client_ip
                    else None
                ),
                identify=self.sandbox_at,
                resolver=self.resolver,
                allow_private=self.allow_private,
                budget=self.budget,
            )
            try:
                await lease.proxy.start(gateway, PROXY_PORT)
            except OSError as exc:
                raise InfrastructureError(
                    f"the egress proxy cannot listen on {gateway}:{PROXY_PORT} ({exc.strerror}); "
                    "network-enabled sandboxes need harombe to run on the Docker host"
                ) from exc
            await _disable_ipv6(lease.bridge)
            # Into the host from this bridge: nothing until bind() opens the proxy's port to
            # the sandbox's own address; anything else is refused at once (REJECT, not DROP,
            # so it fails fast). Out of this bridge to anywhere else (other networks, other
            # sandboxes, outside): refused at once too, rather than left to time out.
            # The proxy's port is refused from every other interface too (other Docker
            # networks, the host itself), so only this bridge can ever reach it.
            reject = ["-j", "REJECT", "--reject-with", "icmp-port-unreachable"]
            proxy_port = ["-d", f"{gateway}/32", "-p", "tcp", "--dport", str(PROXY_PORT)]
            for chain, rule in (
                ("INPUT", ["-i", lease.bridge, *reject]),
                ("INPUT", ["!", "-i", lease.bridge, *proxy_port, *reject]),
                ("FORWARD", ["-i", lease.bridge, *reject]),
            ):
                await self._add_rule(lease, chain, rule)
        except BaseException:
            await self._release(lease)
            raise
        self._leases[sandbox_id] = lease
        allowed = sorted(allowlist.exact | {"*" + suffix for suffix in allowlist.suffixes})
        log.info("network.attached", sandbox_id=sandbox_id, network=name, gateway=gateway,
                 allowed=allowed)  # fmt: skip
        return lease

    async def bind(self, sandbox_id: str, container_id: str) -> str:
        """Let the sandbox's container, and it alone, reach its proxy; its address.

        Called once the container has started (Docker assigns the address then) and before
        any code runs in it. The firewall rule names the bridge, the source address and the
        gateway, so neither another sandbox nor this one on another gateway matches it."""
        lease = self._leases.get(sandbox_id)
        if lease is None:
            raise InfrastructureError(f"sandbox {sandbox_id} has no network to bind")
        address = await self.docker.container_address(container_id, lease.network_name)
        if not address:
            raise InfrastructureError(
                f"sandbox {sandbox_id} got no address on {lease.network_name}; check that "
                "Docker's bridge networks work (docker network inspect)"
            )
        # A container started again on the same network (a retried start) replaces the one
        # before it: the old address loses its way in and the proxy stops serving it before
        # the new one gets either, so no address ever keeps a stale admission.
        lease.client_ip = None
        for rule in [r for r in lease.rules if _is_admission(r)]:
            await _iptables("-D", *rule)
            lease.rules.remove(rule)
        await self._add_rule(lease, "INPUT", [
            "-i", lease.bridge, "-s", f"{address}/32", "-d", f"{lease.gateway}/32",
            "-p", "tcp", "--dport", str(PROXY_PORT), "-j", "ACCEPT",
        ])  # fmt: skip
        lease.client_ip = address
        log.info("network.bound", sandbox_id=sandbox_id, client=address, bridge=lease.bridge)
        return address

    def sandbox_at(self, address: str) -> str | None:
        """The sandbox whose network address ``address`` is, if any (for the audit)."""
        for lease in self._leases.values():
            if lease.client_ip == address:
                return lease.sandbox_id
        return None

    async def _add_rule(self, lease: Lease, chain: str, rule: list[str]) -> None:
        """Insert a rule and record it for removal; a caller cancelled meanwhile leaves no
        rule behind that nothing knows of."""
        await settle(_iptables("-I", chain, *rule), undo=lambda _: _iptables("-D", chain, *rule))
        lease.rules.append([chain, *rule])

    def set_allowed(self, sandbox_id: str, allowed_domains: Sequence[str]) -> None:
        """Replace the allowlist; the next connection through the proxy uses it."""
        lease = self._leases.get(sandbox_id)
        if lease is None:
            raise InfrastructureError(f"sandbox {sandbox_id} has no network to change")
        lease.allowlist = Allowlist.parse(allowed_domains)
        log.info("network.allowlist_changed", sandbox_id=sandbox_id,
                 allowed=list(allowed_domains))  # fmt: skip

    async def detach(self, sandbox_id: str) -> None:
        """Remove the sandbox's proxy, rules and network (after its container is gone)."""
        lease = self._leases.pop(sandbox_id, None)
        if lease is not None:
            await self._release(lease)

    async def _release(self, lease: Lease) -> None:
        """Proxy and way in first, then the network, and only then the rules that fence the
        bridge: a network Docker cannot remove yet (its container could not be removed) keeps
        its REJECT rules until :meth:`sweep` removes network and rules together."""
        lease.client_ip = None
        if lease.proxy is not None:
            await lease.proxy.stop()
        admissions = [r for r in lease.rules if _is_admission(r)]
        fences = [r for r in lease.rules if not _is_admission(r)]
        await self._delete_rules(admissions)
        await self.docker.remove_network(lease.network_id)
        await self._delete_rules(fences)

    @staticmethod
    async def _delete_rules(rules: list[list[str]]) -> None:
        for rule in rules:
            try:
                await _iptables("-D", *rule)
            except InfrastructureError as exc:
                log.warning("network.rule_left", rule=rule, error=str(exc))

    async def sweep(self, is_orphan: Callable[[dict[str, str]], bool]) -> int:
        """Remove sandbox networks (and their firewall rules) whose owner is gone."""
        removed = 0
        found = await self.docker.list_networks({LABEL_NETWORK: ""})
        for network_id, labels in found:
            if network_id in {lease.network_id for lease in self._leases.values()}:
                continue
            if not is_orphan(labels):
                continue
            bridge = await self.docker.network_bridge(network_id)
            for chain in ("INPUT", "FORWARD"):
                for rule in await _rules_for(chain, bridge):
                    try:
                        await _iptables("-D", chain, *rule)
                    except InfrastructureError as exc:
                        log.warning("network.rule_left", rule=rule, error=str(exc))
            await self.docker.remove_network(network_id)
            removed += 1
        if removed:
            log.info("network.orphans_removed", count=removed)
        return removed

    async def close(self) -> None:
        for sandbox_id in list(self._leases):
            await self.detach(sandbox_id)

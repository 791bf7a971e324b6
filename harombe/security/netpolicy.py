"""Which destinations a network-enabled sandbox may reach: pure policy, no I/O.

An allowlist holds exact host names (``pypi.example``) and wildcard patterns
(``*.example.com``, which matches ``a.example.com`` and ``b.a.example.com`` but not
``example.com`` itself, as in TLS certificates). Names are compared in their ASCII (IDNA) form,
lowercase, without a trailing dot. IP literals are never allowed by name: a sandbox that may
reach ``files.example`` may not reach whatever address it likes. After the proxy resolves an
allowed name, :func:`address_is_public` refuses loopback, private, link-local and other
special addresses, so a name that resolves inward (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from harombe.errors import ConfigError

DEFAULT_PORTS = frozenset({80, 443})


def normalize_host(host: str) -> str:
    """``host`` lowercase, IDNA-encoded, without brackets or a trailing dot."""
    text = host.strip().strip("[]").rstrip(".").lower()
    if not text:
        raise ValueError("empty host name")
    try:
        return text.encode("idna").decode("ascii")
    except UnicodeError:
        return text


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Allowlist:
    """Exact names and ``*.suffix`` patterns; see the module docstring."""

    exact: frozenset[str]
    suffixes: frozenset[str]  # ".example.com" for "*.example.com"
    ports: frozenset[int] = DEFAULT_PORTS

    @classmethod
    def parse(cls, domains: Iterable[str], *, ports: Iterable[int] = DEFAULT_PORTS) -> Allowlist:
        """An allowlist from user input; bad entries raise :class:`ConfigError` naming the fix."""
        exact: set[str] = set()
        suffixes: set[str] = set()
        for raw in domains:
            if not isinstance(raw, str) or not raw.strip():
                raise ConfigError(f"allowed domain {raw!r} is empty; write a host name")
            entry = raw.strip()
            if "://" in entry or "/" in entry or ":" in entry.strip("[]"):
                raise ConfigError(
                    f"allowed domain {raw!r} must be a bare host name such as 'example.com' "
                    "(no scheme, port or path)"
                )
            if is_ip_literal(entry):
                raise ConfigError(f"allowed domain {raw!r} is an IP address; allow host names only")
            if entry.startswith("*."):
                suffix = normalize_host(entry[2:])
                if "." not in suffix:
                    raise ConfigError(
                        f"allowed domain {raw!r} is too broad; a pattern needs a domain with a "
                        "dot, such as '*.example.com'"
                    )
                suffixes.add("." + suffix)
            elif "*" in entry:
                raise ConfigError(
                    f"allowed domain {raw!r}: '*' is only allowed as a leading '*.' label"
                )
            else:
                exact.add(normalize_host(entry))
        return cls(frozenset(exact), frozenset(suffixes), frozenset(ports))

    def allows(self, host: str, port: int) -> tuple[bool, str]:
        """Whether ``host:port`` may be reached, and why (for the audit log)."""
        if port not in self.ports:
            return False, f"port {port} is not allowed (allowed: {sorted(self.ports)})"
        if is_ip_literal(host):
            return False, "IP addresses are never allowed; use an allowed host name"
        try:
            name = normalize_host(host)
        except ValueError:
            return False, "no host name"
        if name in self.exact:
            return True, f"{name} is allowed"
        for suffix in self.suffixes:
            if name.endswith(suffix):
                return True, f"{name} matches *{suffix}"
        return False, f"{name} is not in the sandbox's allowed domains"


def address_is_public(address: str) -> bool:
    """Whether a resolved address is an ordinary internet address (not local or special)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast

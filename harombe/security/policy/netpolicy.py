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
import re
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


_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def is_host_name(host: str) -> bool:
    """Whether ``host`` (already normalised) is a plain DNS name: letters, digits, ``-`` and
    ``_`` in labels of at most 63 characters, 253 in all. Anything else (``%``, ``\\``, ``@``,
    spaces, empty labels) is not a name the proxy will resolve."""
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split("."))


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IP address in any spelling a resolver accepts: dotted IPv4 and
    IPv6, and also the numeric forms ``inet_aton`` reads (``127.1``, ``2130706433``,
    ``0x7f.0.0.1``). No real host name ends in a numeric label, so such a name is an address."""
    text = host.strip().strip("[]").rstrip(".")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        last = text.rsplit(".", 1)[-1].lower()
        return bool(last) and (last.isdigit() or bool(re.fullmatch(r"0x[0-9a-f]*", last)))
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
                if not is_host_name(suffix):
                    raise ConfigError(f"allowed domain {raw!r} is not a valid host name pattern")
                suffixes.add("." + suffix)
            elif "*" in entry:
                raise ConfigError(
                    f"allowed domain {raw!r}: '*' is only allowed as a leading '*.' label"
                )
            else:
                name = normalize_host(entry)
                if not is_host_name(name):
                    raise ConfigError(
                        f"allowed domain {raw!r} is not a valid host name (letters, digits, "
                        "'-' and '.' only)"
                    )
                exact.add(name)
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
        if not is_host_name(name):
            return False, "not a valid host name"
        if name in self.exact:
            return True, f"{name} is allowed"
        for suffix in self.suffixes:
            if name.endswith(suffix):
                return True, f"{name} matches *{suffix}"
        return False, f"{name} is not in the sandbox's allowed domains"


#: IPv4 ranges that are never an ordinary internet destination (IANA special-purpose registry):
#: "this network", private, shared CGNAT, loopback, link-local, IETF protocol assignments,
#: documentation, 6to4 relay anycast, benchmarking, multicast, reserved and broadcast.
NON_PUBLIC_V4 = tuple(
    ipaddress.IPv4Network(n)
    for n in ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
              "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
              "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
              "224.0.0.0/4", "240.0.0.0/4")
)  # fmt: skip
#: IPv6 is public only inside global unicast 2000::/3, and not in these parts of it:
#: IETF protocol assignments (Teredo and the rest), benchmarking, ORCHID, documentation, SRv6.
#: Everything outside 2000::/3 (unspecified, loopback, IPv4-compatible ``::a.b.c.d``, the
#: discard prefix, ULA fc00::/7, site-local fec0::/10, link-local, multicast) is not public.
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
NON_PUBLIC_V6 = tuple(
    ipaddress.IPv6Network(n)
    for n in ("2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16")
)  # fmt: skip
#: IPv6 forms that wrap an IPv4 address: judged by the IPv4 address inside.
NAT64_V6 = ipaddress.IPv6Network("64:ff9b::/96")
TRANSLATED_V6 = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT "IPv4-translated"
SIXTOFOUR_V6 = ipaddress.IPv6Network("2002::/16")
TEREDO_V6 = ipaddress.IPv6Network("2001::/32")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (IPv4-mapped, NAT64, SIIT, 6to4, Teredo
    server and client), or ``[]``. IPv4-compatible ``::a.b.c.d`` is not unwrapped: it is
    deprecated and never public in itself."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in NAT64_V6 or ip in TRANSLATED_V6:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    return []


def address_is_public(address: str) -> bool:
    """Whether a resolved address is an ordinary internet address (not local or special).

    An IPv6 address that wraps an IPv4 address is judged by what it wraps (all of it, for
    Teredo), and then must itself be in a public range too; so ``64:ff9b::10.0.0.1``,
    ``2002:a00:1::``, ``::ffff:127.0.0.1`` and ``::10.0.0.1`` are all refused. An address that
    does not parse is not public.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner:
            # NAT64 and mapped forms stand for their IPv4 address; 6to4 and Teredo are IPv6
            # addresses in their own right, but lead to the IPv4 one.
            wrapped_public = all(_v4_public(v4) for v4 in inner)
            if ip.ipv4_mapped is not None or ip in NAT64_V6 or ip in TRANSLATED_V6:
                return wrapped_public
            return wrapped_public and ip in SIXTOFOUR_V6  # Teredo (2001::/32) stays refused
        return (
            ip in GLOBAL_UNICAST_V6 and not any(ip in net for net in NON_PUBLIC_V6) and ip.is_global
        )
    return _v4_public(ip)


def _v4_public(ip: ipaddress.IPv4Address) -> bool:
    return not any(ip in net for net in NON_PUBLIC_V4) and ip.is_global

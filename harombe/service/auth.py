"""Who is calling, and how much they may hold: bearer tokens, tenants and their limits.

Tokens come from ``service.tokens`` (the secret itself, its SHA-256, or the name of an
environment variable). Only digests are kept in memory; a presented token is hashed and
compared with every known digest in constant time (``hmac.compare_digest``, no early exit), so
neither timing nor an error message tells which prefix was right.

With no token configured the service is for this machine only: callers are the one
``anonymous`` tenant, and a request from any other address is refused (``harombe serve`` also
refuses to bind a non-loopback address then).

Each sandbox belongs to the tenant that made it: another tenant gets 404 for it, exactly as
for a sandbox that does not exist. Past a tenant's ``max_sandboxes`` live sandboxes or
``max_concurrent_runs`` running calls, the answer is 429 with ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import structlog

from harombe.config_service import ServiceConfig, secret_problem, token_digest
from harombe.errors import ConfigError
from harombe.service.problems import HTTPProblem

log = structlog.get_logger(__name__)

ANONYMOUS = "anonymous"
#: Seconds a caller over its run limit is told to wait before trying again.
RUN_RETRY_AFTER_S = 1
#: Seconds a caller over its sandbox limit is told to wait (it should destroy one).
SANDBOX_RETRY_AFTER_S = 5


@dataclass
class Tenant:
    """A caller: its name, role, limits, and what it holds now."""

    name: str
    role: str = "client"
    max_sandboxes: int = 8
    max_concurrent_runs: int = 4
    #: A person operates this client (``human: true``): its elicitation answers count.
    human: bool = False
    sandboxes: set[str] = field(default_factory=set)
    creating: int = 0
    running: int = 0

    @contextlib.contextmanager
    def run_slot(self) -> Iterator[None]:
        """One of the tenant's concurrent runs, or 429 when all are taken."""
        if self.running >= self.max_concurrent_runs:
            raise HTTPProblem(
                429,
                "TooManyRequests",
                f"{self.name} already has {self.running} calls running (the limit is "
                f"{self.max_concurrent_runs}); wait for one to finish and retry",
                headers={"Retry-After": str(RUN_RETRY_AFTER_S)},
            )
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    @contextlib.contextmanager
    def creation_slot(self) -> Iterator[None]:
        """Room for one more live sandbox while it is made, or 429 when the tenant is full."""
        held = len(self.sandboxes) + self.creating
        if held >= self.max_sandboxes:
            raise HTTPProblem(
                429,
                "TooManySandboxes",
                f"{self.name} holds {held} live sandboxes (the limit is {self.max_sandboxes}); "
                "destroy one with DELETE /v1/sandboxes/{id} and retry",
                headers={"Retry-After": str(SANDBOX_RETRY_AFTER_S)},
            )
        self.creating += 1
        try:
            yield
        finally:
            self.creating -= 1


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine's loopback."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TokenTable:
    """Digests of the configured tokens → their tenants."""

    def __init__(self, config: ServiceConfig, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._entries: list[tuple[bytes, Tenant]] = []
        names: set[str] = set()
        for entry in config.tokens:
            if entry.name in names or entry.name == ANONYMOUS:
                raise ConfigError(
                    f"service.tokens names {entry.name!r} twice (or uses the reserved name "
                    f"{ANONYMOUS!r}); give every token its own name"
                )
            names.add(entry.name)
            digest = entry.sha256 or self._digest_from_env(entry.name, entry.env, env)
            tenant = Tenant(
                entry.name,
                entry.role,
                entry.max_sandboxes,
                entry.max_concurrent_runs,
                human=entry.human,
            )
            self._entries.append((bytes.fromhex(digest), tenant))
        self.anonymous = Tenant(
            ANONYMOUS,
            "client",
            config.anonymous_max_sandboxes,
            config.anonymous_max_concurrent_runs,
        )

    @staticmethod
    def _digest_from_env(name: str, variable: str | None, env: Mapping[str, str]) -> str:
        secret = env.get(variable or "")
        problem = "it is not set" if not secret else secret_problem(secret)
        if problem:
            raise ConfigError(
                f"token {name!r} reads environment variable {variable}, but {problem}; "
                "export a valid token before starting harombe serve"
            )
        return token_digest(secret or "")

    @property
    def enabled(self) -> bool:
        """Whether any token is configured (else the service is loopback-only)."""
        return bool(self._entries)

    def tenants(self) -> list[Tenant]:
        return [tenant for _, tenant in self._entries] + [self.anonymous]

    def lookup(self, presented: str) -> Tenant | None:
        """The tenant whose token is ``presented``: every digest is compared, in constant
        time, whatever matched first."""
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found = None
        for known, tenant in self._entries:
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def unauthorized(why: str) -> HTTPProblem:
    return HTTPProblem(
        401,
        "Unauthorized",
        f"{why}; send the header 'Authorization: Bearer <token>' with a token from service.tokens",
        headers={"WWW-Authenticate": "Bearer"},
    )

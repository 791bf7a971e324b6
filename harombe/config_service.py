"""The ``service:`` section of the configuration: where ``harombe serve`` listens and who may
call it. Part of :class:`harombe.config.HarombeConfig` (same precedence, same strictness)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ServiceConfig", "TokenConfig", "secret_problem", "token_digest"]


class _Strict(BaseModel):
    # As harombe.config's models: unknown keys refused, NaN and infinity never limits.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class TokenConfig(_Strict):
    """One bearer token of the HTTP service. Give exactly one of ``token`` (the secret itself;
    hashed as soon as it is read, never kept), ``sha256`` (its hex digest) or ``env`` (the name
    of an environment variable holding it). ``role: approver`` may decide approvals; a client
    (an agent) may not, so it can never approve its own calls. ``human: true`` marks a client
    token that a person operates (a desktop MCP client, say): its MCP elicitation answers may
    approve its own calls; any other client's held calls wait on the approvals page."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    token: str | None = Field(None, min_length=16, max_length=512, repr=False)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    role: Literal["client", "approver"] = "client"
    human: bool = False
    max_sandboxes: int = Field(8, ge=1, le=10_000, description="live sandboxes at once")
    max_concurrent_runs: int = Field(4, ge=1, le=10_000, description="calls running at once")

    @model_validator(mode="before")
    @classmethod
    def _hash_the_secret(cls, data: Any) -> Any:
        # The secret itself is never stored: only its digest outlives validation.
        if not isinstance(data, Mapping):
            return data
        given = [k for k in ("token", "sha256", "env") if data.get(k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"token {str(data.get('name'))[:64]!r} must give exactly one of token, sha256 "
                f"or env (got {', '.join(given) or 'none'})"
            )
        if data.get("human") is True and data.get("role") == "approver":
            raise ValueError(
                f"token {str(data.get('name'))[:64]!r}: human marks a client token whose MCP "
                "elicitation answers may approve its own calls; an approver token runs nothing, "
                "so drop human (or make it a client)"
            )
        secret = data.get("token")
        if isinstance(secret, str):
            problem = secret_problem(secret)
            if problem:
                raise ValueError(problem)
            return {**data, "token": None, "sha256": token_digest(secret)}
        return data


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot be a bearer token, or ``None``: it must travel in an HTTP header
    unchanged, so printable ASCII without spaces, 16 to 512 characters."""
    if not 16 <= len(secret) <= 512:
        return "a token must be 16 to 512 characters; use a long random one"
    if not (secret.isascii() and secret.isprintable()) or any(c.isspace() for c in secret):
        return (
            "a token must be printable ASCII without spaces (it travels in an HTTP header); "
            "use e.g. the output of `python -c 'import secrets; print(secrets.token_urlsafe())'`"
        )
    return None


def token_digest(secret: str) -> str:
    """The hex SHA-256 of a bearer token, as ``TokenConfig.sha256`` holds it."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class ServiceConfig(_Strict):
    """``harombe serve``: where it listens, who may call it, and the fips sidecar's profile."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # The fips endpoints' active profile; the SANDBOX_PROFILE environment variable overrides it.
    profile: str = "minimal"
    # Profiles a POST /execute may name with "profile" instead of the active one. Empty: the
    # field may only repeat the active profile, so a caller cannot pick a looser one.
    request_profiles: list[str] = Field(default_factory=list, max_length=64)
    tokens: list[TokenConfig] = Field(default_factory=list)
    # Limits of the anonymous caller when no tokens are configured (loopback only).
    anonymous_max_sandboxes: int = Field(16, ge=1, le=10_000)
    anonymous_max_concurrent_runs: int = Field(8, ge=1, le=10_000)
    max_request_bytes: int = Field(
        8 * 1_048_576, ge=1024, description="largest request body, bytes (uploads included)"
    )
    # Seconds a connection has to send a whole request head (each request's, on a kept-alive
    # connection too); one that has not is closed, so slow heads cannot hold connections.
    header_timeout_s: float = Field(10.0, gt=0, le=600)

"""The ``install_cache:`` and ``environments:`` sections of ``security.sandbox``: where
downloaded packages are kept for the next sandbox, and named dependency sets with pools of
their own. Part of :class:`harombe.config.HarombeConfig` (same precedence, same strictness)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["EnvironmentConfig", "InstallCacheConfig"]

#: A name of an environment: what ``create_sandbox(environment=...)`` and the config use.
ENVIRONMENT_NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class _Strict(BaseModel):
    # As harombe.config's models: unknown keys refused, NaN and infinity never limits.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class InstallCacheConfig(_Strict):
    """The host-side cache of resolved, unpacked PyPI packages (docs/dependencies.md)."""

    enabled: bool = True
    # None: $XDG_CACHE_HOME/harombe/environments, else ~/.cache/harombe/environments.
    directory: str | None = None
    max_mb: int = Field(8192, ge=64, description="cache size; least recently used go first")
    resolve_ttl_s: float = Field(
        86400, ge=0, description="how long a request is answered without resolving it again"
    )


class EnvironmentConfig(_Strict):
    """A named set of PyPI requirements, built once and shared by its sandboxes."""

    requirements: list[str] = Field(min_length=1, max_length=200)
    # Modules imported in each pooled sandbox before it is handed out (Python sessions).
    preimport: list[str] = Field(default_factory=list, max_length=50)
    pool_size: int = Field(1, ge=0, le=100, description="ready sandboxes of this environment")

    @field_validator("preimport")
    @classmethod
    def _modules(cls, value: list[str]) -> list[str]:
        for name in value:
            if not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"preimport {name[:80]!r} is not a module name like 'pandas'")
        return value

"""Configuration: the usage guide's ``harombe.yaml`` schema as strict pydantic models.

Precedence, lowest to highest: built-in defaults < YAML file < ``HAROMBE__…`` environment
variables < constructor arguments (applied by the caller with :func:`override`).

Environment overrides use double underscores for nesting, and values are parsed as YAML
scalars, so ``HAROMBE__SECURITY__SANDBOX__LIMITS__MAX_MEMORY_MB=1024`` sets
``security.sandbox.limits.max_memory_mb`` to the integer 1024.

Unknown keys are rejected with a message that names the key and lists the valid ones, because a
misspelt limit that is silently ignored is a limit that does not exist.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from harombe.config_environments import ENVIRONMENT_NAME, EnvironmentConfig, InstallCacheConfig
from harombe.config_hitl import HITLConfig
from harombe.config_registries import MAX_REGISTRY_URLS, is_host_name, registry_entry, url_host
from harombe.config_service import ServiceConfig
from harombe.errors import ConfigError

Language = Literal["python", "javascript", "shell"]
LANGUAGES: tuple[Language, ...] = ("python", "javascript", "shell")
# The program each language's code runs under inside the sandbox image.
INTERPRETERS: dict[Language, str] = {"python": "python3", "javascript": "node", "shell": "bash"}
Registry = Literal["pypi", "npm"]
#: How a run's output comes back: ``full`` (up to max_output_bytes per stream) or ``llm`` (a
#: long stream as head, marker and tail, the full text saved in the sandbox).
OutputMode = Literal["full", "llm"]
OUTPUT_MODES: tuple[OutputMode, ...] = ("full", "llm")
REGISTRIES: tuple[Registry, ...] = ("pypi", "npm")
#: The language whose interpreter installs and imports each registry's packages.
REGISTRY_LANGUAGES: dict[Registry, Language] = {"pypi": "python", "npm": "javascript"}
DEFAULT_IMAGE = "harombe/sandbox:latest"
ENV_PREFIX = "HAROMBE__"
CONFIG_PATH_ENV = "HAROMBE_CONFIG"


class _Strict(BaseModel):
    # NaN and infinity are never meaningful limits (NaN compares false with every cap).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


#: The largest memory or disk size a limit may name (4 TiB).
MAX_SIZE_MB = 4 << 20


class Limits(_Strict):
    """Per-sandbox resource limits; names carry their units."""

    # Sizes stop at 4 TiB: Docker takes a container's memory in bytes as an int64.
    max_memory_mb: int = Field(
        512, ge=32, le=MAX_SIZE_MB, description="RAM for user processes, summed"
    )
    max_cpu_cores: float = Field(0.5, gt=0, le=64)
    max_disk_mb: int = Field(1024, ge=1, le=MAX_SIZE_MB, description="size of the /workspace tmpfs")
    max_execution_time: float = Field(
        30, gt=0, description="timeout of a call that names none, seconds"
    )
    max_timeout_s: float = Field(
        600,
        gt=0,
        description="hard ceiling on a call's own timeout, seconds; longer ones are capped to "
        "it with a warning (at least max_execution_time)",
    )
    max_output_bytes: int = Field(1_048_576, ge=1, description="per stream, stdout and stderr")
    max_pids: int = Field(128, ge=8, description="processes and threads in one sandbox")
    max_file_bytes: int = Field(64 * 1_048_576, ge=1, description="largest file read or written")
    kill_grace_s: float = Field(2.0, ge=0, le=30, description="SIGTERM to SIGKILL on timeout")
    llm_output_head_bytes: int = Field(
        4096, ge=0, description="output mode llm: bytes of a long stream's start kept, per stream"
    )
    llm_output_tail_bytes: int = Field(
        4096, ge=0, description="output mode llm: bytes of a long stream's end kept, per stream"
    )

    @model_validator(mode="after")
    def _ceiling_covers_default(self) -> Limits:
        if self.max_timeout_s < self.max_execution_time:
            raise ValueError(
                f"max_timeout_s ({self.max_timeout_s:g}) is below max_execution_time "
                f"({self.max_execution_time:g}); the ceiling on per-call timeouts must be at "
                "least the default, so raise security.sandbox.limits.max_timeout_s"
            )
        return self


def _empty_registries() -> dict[Registry, list[str]]:
    return {registry: [] for registry in REGISTRIES}


class NetworkConfig(_Strict):
    """Network of sandboxes that ask for it, and where the host downloads packages from."""

    # The network a code_execute call that does not pass network_enabled gets.
    enabled_by_default: bool = False
    # Where installs download from. pypi: the first URL is pip's index, the others extra
    # indexes; npm: the one registry. Empty lists mean "whatever this machine's pip / npm
    # configuration points at", read at run time; registry host names are never written into
    # configuration shipped with harombe. Bare host names (the usage guide's form) are the
    # hosts downloads may come from: the index in use must be on one, and so every file.
    allowed_registries: dict[Registry, list[str]] = Field(default_factory=_empty_registries)
    # The runtime of network-enabled sandboxes: runsc registered with --network=host, which
    # uses the container's own namespace (an --internal network with no route out).
    runtime: str = "runsc-net"
    # Let allowed names resolve to private addresses (an internal package mirror, say).
    allow_private_destinations: bool = False
    # PEM files of extra CA certificates that network-enabled sandboxes trust besides the
    # image's own (TLS inspection in company networks); read on the host at start.
    extra_ca_certificates: list[str] = Field(default_factory=list)

    @field_validator("allowed_registries")
    @classmethod
    def _registry_urls(cls, value: dict[Registry, list[str]]) -> dict[Registry, list[str]]:
        npm_urls = [u for u in value.get("npm", []) if not (isinstance(u, str) and is_host_name(u))]
        if len(npm_urls) > 1:
            raise ValueError(
                f"allowed_registries.npm lists {len(npm_urls)} URLs, but npm takes one "
                "registry; keep one (scoped registries belong in the machine's .npmrc)"
            )
        for registry, urls in value.items():
            if len(urls) > MAX_REGISTRY_URLS:
                raise ValueError(
                    f"allowed_registries.{registry} lists {len(urls)} URLs, over "
                    f"{MAX_REGISTRY_URLS}; keep the indexes pip should really search"
                )
        checked = {reg: [registry_entry(reg, url) for url in urls] for reg, urls in value.items()}
        return {**_empty_registries(), **checked}

    def registry_urls(self, registry: Registry) -> tuple[str, ...]:
        """The configured URLs of ``registry``; empty means the machine's own pip / npm setup."""
        return tuple(u for u in self.allowed_registries.get(registry, ()) if not is_host_name(u))

    def registry_hosts(self, registry: Registry) -> frozenset[str]:
        """The hosts ``registry``'s downloads may come from: the host names listed, and the
        hosts of the URLs listed beside them. Empty (no host name listed): any host."""
        entries = self.allowed_registries.get(registry, ())
        hosts = {u for u in entries if is_host_name(u)}
        if not hosts:
            return frozenset()
        return frozenset(hosts | {url_host(u) for u in entries} - {""})


class PoolConfig(_Strict):
    """The warm pool: sandboxes started ahead of need, per language (and image and limits)."""

    size: int = Field(2, ge=0, le=1000, description="ready sandboxes kept per language; 0: off")
    max_age_s: float = Field(
        3600, gt=0, description="a waiting sandbox older than this is replaced"
    )
    # Languages whose pool fills when the manager starts; others fill after their first use.
    prewarm: list[Language] = Field(default_factory=list)


class LanguageConfig(_Strict):
    image: str = DEFAULT_IMAGE


def _default_languages() -> dict[Language, LanguageConfig]:
    return {lang: LanguageConfig() for lang in LANGUAGES}


class SandboxConfig(_Strict):
    enabled: bool = True
    runtime: str = "runsc"
    # Opting out of gVisor must be explicit; results then say which runtime ran the code.
    allow_insecure_runtime: bool = False
    # uid:gid that user code runs as; never root, which is the supervisor's (see _user).
    user: str = "1000:1000"
    # Python and JavaScript keep variables, imports and functions between calls on a sandbox
    # (one live interpreter); False, or code_execute(fresh=True), runs a new process instead.
    stateful: bool = True
    # How code_execute returns output when its call leaves output_mode out: "full" (up to
    # limits.max_output_bytes per stream) or "llm" (a long stream as head, marker and tail).
    output_mode: OutputMode = "full"
    pool: PoolConfig = Field(default_factory=PoolConfig)  # type: ignore[arg-type]
    limits: Limits = Field(default_factory=Limits)  # type: ignore[arg-type]
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    languages: dict[Language, LanguageConfig] = Field(default_factory=_default_languages)
    install_cache: InstallCacheConfig = Field(default_factory=InstallCacheConfig)  # type: ignore[arg-type]
    environments: dict[Annotated[str, StringConstraints(pattern=ENVIRONMENT_NAME)],
                       EnvironmentConfig] = Field(default_factory=dict)  # fmt: skip

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        uid, sep, gid = value.partition(":")
        if not (sep and uid.isdecimal() and gid.isdecimal() and uid.isascii() and gid.isascii()):
            raise ValueError(
                f"user must be numeric 'uid:gid' like '1000:1000', got {value[:40]!r}; the "
                "sandbox image has no user database to look names up in"
            )
        if max(int(uid), int(gid)) >= 2**31 - 1:
            raise ValueError(f"user {value[:40]!r} is out of range; ids are below 2147483647")
        if int(uid) == 0 or int(gid) == 0:
            raise ValueError(
                f"user {value!r} is root: user code would share the supervisor's uid and could "
                "signal it; use an unprivileged 'uid:gid' such as '1000:1000'"
            )
        return f"{int(uid)}:{int(gid)}"

    def image_for(self, language: Language) -> str:
        """The image configured for ``language`` (the default image if the entry is missing)."""
        entry = self.languages.get(language)
        return entry.image if entry else DEFAULT_IMAGE


class ProfilesConfig(_Strict):
    """Where policy profiles (import allowlists, AST guardrails) come from, besides the shipped
    ``minimal`` and ``data-science``."""

    # A directory of *.yaml profiles (one per file); relative paths are read from the current
    # directory. None: the shipped profiles only.
    directory: str | None = None


class SecurityConfig(_Strict):
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    hitl: HITLConfig = Field(default_factory=HITLConfig)
    profiles: ProfilesConfig = Field(default_factory=ProfilesConfig)


class HarombeConfig(_Strict):
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)  # type: ignore[arg-type]


def _describe(err: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            parent = _model_at(model, item["loc"][:-1])
            valid = ", ".join(parent.model_fields) if parent else "see docs/configuration.md"
            lines.append(
                f"unknown key '{where}': valid keys there are {valid}; "
                "fix the spelling or remove it"
            )
        elif "tokens" in item["loc"]:  # never echo a secret into an error or a log
            lines.append(f"'{where}': {item['msg']}")
        else:
            lines.append(f"'{where}': {item['msg']} (got {item.get('input')!r})")
    return "invalid harombe configuration: " + "; ".join(lines)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:  # dict[Language, X]: the key indexes into the value type
            args = getattr(current, "__args__", ())
            current = args[-1] if args else None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Nested dict built from ``HAROMBE__A__B=value`` variables (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            raise ConfigError(f"environment variable {name} names no key; use {ENV_PREFIX}A__B")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"environment variable {name} is not a YAML value: {exc}") from exc
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {name} conflicts with another override")
        node[path[-1]] = value
    return tree


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in ``extra`` replaces."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_config(data: Mapping[str, Any] | None) -> HarombeConfig:
    """Validate an already-loaded mapping; raises :class:`ConfigError` naming the bad key."""
    try:
        return HarombeConfig.model_validate(dict(data or {}))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, HarombeConfig)) from None


def load_config(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> HarombeConfig:
    """Load defaults, then ``path`` (or ``$HAROMBE_CONFIG``), then environment overrides."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    chosen = path if path is not None else env.get(CONFIG_PATH_ENV)
    if chosen:
        file = Path(chosen)
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist; fix the path") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {file} must hold a mapping at the top level")
        data = loaded or {}
    return parse_config(merge(data, env_overrides(env)))


def override(config: HarombeConfig, **limits: Any) -> HarombeConfig:
    """A copy of ``config`` with non-None sandbox ``limits`` / ``runtime`` replaced.

    A ``max_execution_time`` above the configured ``max_timeout_s`` lifts the ceiling to it
    (a caller who makes 900 s the default means 900 s to be allowed), unless ``max_timeout_s``
    is given too."""
    data = config.model_dump()
    sandbox = data["security"]["sandbox"]
    default_s, ceiling_s = limits.get("max_execution_time"), limits.get("max_timeout_s")
    if isinstance(default_s, int | float) and ceiling_s is None:
        ceiling = sandbox["limits"]["max_timeout_s"]
        limits["max_timeout_s"] = max(ceiling, default_s) if default_s == default_s else None
    for key, value in limits.items():
        if value is None:
            continue
        if key in ("runtime", "allow_insecure_runtime", "user"):
            sandbox[key] = value
        elif key in Limits.model_fields:
            sandbox["limits"][key] = value
        else:
            raise ConfigError(f"unknown sandbox setting '{key}'")
    return parse_config(data)

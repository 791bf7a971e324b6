"""sandbubble's way of calling :func:`harombe.run_sandboxed`: a config object first, and a
result read by attribute.

::

    from harombe import get_default_sandbox_config, run_sandboxed

    conf = get_default_sandbox_config()
    res, _files = run_sandboxed(conf, code="print('hello from sandbox')", timeout=5)
    print(res.returncode, res.stdout, res.stderr)     # also res["exit_code"], res["stdout"]

:class:`SandboxConfig`'s fields map onto harombe's: ``enable_network`` is the sandbox's network,
which harombe only gives with a list of hosts (``allowed_domains``); ``venv_path``'s packages
are installed into the sandbox (through the host's install cache) rather than bound in;
``memory_mb`` and ``cpus`` are the sandbox's limits. ``apparmor_profile_name`` has nothing to
constrain (the sandbox is a gVisor kernel, not an AppArmor-confined process): the result's
``warnings`` say so. A field that cannot be honoured is a :class:`UsageError` naming the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from harombe.config import HarombeConfig, override
from harombe.errors import ConfigError, UsageError

__all__ = ["RunResult", "SandboxConfig", "get_default_sandbox_config"]

#: sandbubble's environment variables for its default config.
VENV_VARIABLE = "CODEEXEC_SANDBOX_VENV"
APPARMOR_VARIABLE = "CODEEXEC_SANDBOX_AA_PROFILE_NAME"
#: What every virtualenv holds: not dependencies of the code.
VENV_TOOLING = frozenset({"pip", "setuptools", "wheel", "distribute", "pkg-resources"})


class RunResult(dict[str, Any]):
    """:func:`~harombe.run_sandboxed`'s result: the result dict (``res["stdout"]``, ``==`` a
    dict, ``json.dumps(res)``), whose keys also read as attributes (``res.stdout``,
    ``res.status``, ``res.refused``), plus sandbubble's ``res.returncode`` (the exit code;
    ``None`` when the program never ran)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            keys = ", ".join(sorted(map(str, self)))  # a caller's key may not be text
            raise AttributeError(f"the run's result has no {name!r}; it has {keys}") from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(k for k in self if isinstance(k, str))})

    @property
    def returncode(self) -> int | None:
        """The program's exit code (``exit_code``), as ``subprocess`` names it."""
        code = self.get("exit_code")
        return code if isinstance(code, int) else None


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """sandbubble's ``SandboxConfig``, read by harombe (see the module docstring).

    ``venv_path``: a virtualenv whose packages the code needs (they are installed in the
    sandbox, pinned to the venv's versions); ``apparmor_profile_name``: accepted, not used (a
    warning in the result says so); ``enable_network``: with ``allowed_domains``, the hosts the
    code may reach through harombe's egress proxy (harombe never opens the whole network);
    ``memory_mb``, ``cpus``: the sandbox's limits; ``config``: the harombe config to start
    from (``None``: :func:`harombe.config.load_config`)."""

    venv_path: str | os.PathLike[str] | None = None
    apparmor_profile_name: str | None = None
    enable_network: bool = False
    allowed_domains: Sequence[str] = ()
    memory_mb: int | None = None
    cpus: float | None = None
    config: HarombeConfig | None = None


def get_default_sandbox_config() -> SandboxConfig:
    """The default config: no network, the configured limits; ``venv_path`` and
    ``apparmor_profile_name`` from sandbubble's variables (``CODEEXEC_SANDBOX_VENV``,
    ``CODEEXEC_SANDBOX_AA_PROFILE_NAME``) when they are set."""
    return SandboxConfig(
        venv_path=os.environ.get(VENV_VARIABLE) or None,
        apparmor_profile_name=os.environ.get(APPARMOR_VARIABLE) or None,
    )


@dataclasses.dataclass(frozen=True)
class Call:
    """What a :class:`SandboxConfig` (or a harombe config) asks of one run."""

    code: str | None
    config: HarombeConfig | None
    network: bool
    allowed_domains: tuple[str, ...]
    dependencies: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    limited: bool = False  # memory or CPU limits of its own: needs a manager of its own


def read_call(
    conf: object,
    code: str | None,
    *,
    config: HarombeConfig | None,
    network: bool,
    allowed_domains: Sequence[str],
) -> Call:
    """The run that ``run_sandboxed(conf, code=..., ...)`` asks for. ``conf`` is a
    :class:`SandboxConfig`, a :class:`HarombeConfig`, ``None``, or (as before configs were
    accepted there) the code itself. Raises :class:`UsageError` naming the fix."""
    network = _flag("run_sandboxed's network", network)
    domains = _hosts("run_sandboxed's allowed_domains", allowed_domains)
    if config is not None and not isinstance(config, HarombeConfig):
        raise UsageError(
            f"run_sandboxed's config= is a harombe.config.HarombeConfig (e.g. "
            f"load_config()), not {type(config).__name__}"
        )
    if isinstance(conf, str):
        if code is not None:
            raise UsageError(
                "run_sandboxed got the code twice (first argument and code=); pass a "
                "SandboxConfig first, or the code once"
            )
        return Call(conf, config, network, domains)
    if conf is None or isinstance(conf, HarombeConfig):
        if conf is not None and config is not None:
            raise UsageError(
                "run_sandboxed got two harombe configs (first argument and config=); pass one"
            )
        return Call(code, config or conf, network, domains)
    if not isinstance(conf, SandboxConfig):
        raise UsageError(
            f"run_sandboxed's first argument is a config: a harombe.SandboxConfig (e.g. "
            f"get_default_sandbox_config()) or a harombe.config.HarombeConfig, not "
            f"{type(conf).__name__}; pass the code as code=..."
        )
    # Each field read once (a subclass's property may answer differently each time), then
    # checked: a truthy string is not a network, a bad limit names this field, not the config's.
    fields = {f.name: getattr(conf, f.name) for f in dataclasses.fields(SandboxConfig)}
    return _from_sandbox_config(fields, code, config=config, network=network, domains=domains)


def _flag(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise UsageError(
            f"{what} must be True or False, got {str(value)[:40]!r} ({type(value).__name__})"
        )
    return value


def _hosts(what: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes):
        raise UsageError(f"{what} is a list of host names; write [{value[:80]!r}]")
    if not isinstance(value, Iterable):
        raise UsageError(
            f"{what} is a list of host names, not {type(value).__name__}; write "
            "e.g. ['api.example.com']"
        )
    hosts = tuple(value)
    for host in hosts:
        if not isinstance(host, str):
            raise UsageError(
                f"{what} is a list of host names (text), and holds a "
                f"{type(host).__name__}; write e.g. ['api.example.com']"
            )
    return hosts


def _number(what: str, value: object, kinds: tuple[type, ...]) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        kind = "a whole number" if kinds == (int,) else "a number"
        raise UsageError(
            f"SandboxConfig.{what} is {kind} or None, not {type(value).__name__} "
            f"{str(value)[:40]!r}"
        )


def _checked_types(conf: dict[str, Any]) -> tuple[HarombeConfig | None, Any, str | None]:
    """``config``, ``venv_path`` and ``apparmor_profile_name``, each of a type they may be."""
    own_config, venv_path, apparmor = (
        conf["config"],
        conf["venv_path"],
        conf["apparmor_profile_name"],
    )
    if own_config is not None and not isinstance(own_config, HarombeConfig):
        raise UsageError(
            f"SandboxConfig.config is a harombe.config.HarombeConfig (e.g. "
            f"load_config()) or None, not {type(own_config).__name__}"
        )
    if venv_path is not None and not isinstance(venv_path, str | os.PathLike):
        raise UsageError(
            f"SandboxConfig.venv_path is a path (text) or None, not {type(venv_path).__name__}"
        )
    if apparmor is not None and not isinstance(apparmor, str):
        raise UsageError(
            f"SandboxConfig.apparmor_profile_name is text or None, not {type(apparmor).__name__}"
        )
    return own_config, venv_path, apparmor


def _with_limits(base: HarombeConfig | None, memory_mb: object, cpus: object) -> HarombeConfig:
    """``base`` (or the loaded config) with SandboxConfig's limits; a bad one names its field."""
    from harombe.config import load_config

    _number("memory_mb", memory_mb, (int,))
    _number("cpus", cpus, (int, float))
    config = base or load_config()
    for field, key, value in (
        ("memory_mb", "max_memory_mb", memory_mb),
        ("cpus", "max_cpu_cores", cpus),
    ):
        try:
            config = override(config, **{key: value})
        except ConfigError as err:  # it names the config's key: name the field given
            reason = str(err).partition(f"{key}': ")[2] or str(err)
            raise UsageError(
                f"SandboxConfig.{field}={value!r} cannot be the sandbox's limit: {reason}"
            ) from None
    return config


def _from_sandbox_config(
    conf: dict[str, Any],
    code: str | None,
    *,
    config: HarombeConfig | None,
    network: bool,
    domains: tuple[str, ...],
) -> Call:
    own_config, venv_path, apparmor = _checked_types(conf)
    if config is not None and own_config is not None:
        raise UsageError(
            "run_sandboxed got two harombe configs (SandboxConfig.config and config=); pass one"
        )
    enable_network = _flag("SandboxConfig.enable_network", conf["enable_network"])
    listed = _hosts("SandboxConfig.allowed_domains", conf["allowed_domains"])
    domains = domains or listed
    if listed and not enable_network:
        raise UsageError(
            "SandboxConfig lists allowed_domains with enable_network=False; set "
            "enable_network=True to let the code reach them, or drop the list"
        )
    if enable_network and not domains:
        raise UsageError(
            "SandboxConfig(enable_network=True) asks for the whole network, which harombe "
            "never gives a sandbox; list the hosts the code may reach: SandboxConfig("
            "enable_network=True, allowed_domains=['api.example.com'])"
        )
    memory_mb, cpus = conf["memory_mb"], conf["cpus"]
    limited = memory_mb is not None or cpus is not None
    base = _with_limits(config or own_config, memory_mb, cpus) if limited else config or own_config
    warnings: tuple[str, ...] = ()
    if apparmor:
        warnings = (
            f"apparmor_profile_name {apparmor[:80]!r} is not used: harombe runs the code in a "
            "gVisor sandbox (its own kernel), not under an AppArmor profile",
        )
    return Call(
        code,
        base,
        network or enable_network or bool(domains),
        domains,
        dependencies=venv_requirements(venv_path) if venv_path else (),
        warnings=warnings,
        limited=limited,
    )


def venv_requirements(venv_path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The packages installed in the virtualenv at ``venv_path``, as pinned requirements
    (``name==version``), without pip and the other tools every venv has. Raises
    :class:`UsageError` when ``venv_path`` is not a virtualenv, or holds a package that did
    not come from a package index (see :func:`_not_from_an_index`)."""
    root = Path(venv_path)
    if not (root / "pyvenv.cfg").is_file():
        raise UsageError(
            f"venv_path {str(venv_path)[:200]!r} is not a virtualenv (it has no pyvenv.cfg); "
            "give the path of the venv whose packages the code needs, or leave venv_path out"
        )
    found = [str(p) for p in sorted(root.glob("lib*/python*/site-packages")) if p.is_dir()]
    pins: dict[str, str] = {}
    local: list[str] = []
    for dist in metadata.distributions(path=found):
        name = dist.name
        if not name or name.lower().replace("_", "-") in VENV_TOOLING:
            continue
        why = _not_from_an_index(dist)
        if why is not None:
            local.append(f"{name} ({why})")
        pins.setdefault(name.lower(), f"{name}=={dist.version}")
    if local:
        raise UsageError(
            f"venv_path holds packages not from a package index: {', '.join(sorted(local)[:10])}"
            "; harombe installs a venv's packages by name and version from the configured "
            "index, where that name may be someone else's package. Leave them out of the venv "
            "(or install them from the index there), or copy their code in with mnt_dir"
        )
    return tuple(pins[key] for key in sorted(pins))


def _not_from_an_index(dist: metadata.Distribution) -> str | None:
    """Why ``dist`` was not installed from a package index (its ``direct_url.json``, PEP 610:
    an editable or local directory, a file or URL, a VCS checkout; or a local version label,
    which an index never serves), or ``None``."""
    if "+" in str(dist.version):
        return f"local version {str(dist.version)[:40]}"
    text = dist.read_text("direct_url.json")
    if text is None:
        return None
    try:
        direct = json.loads(text)
    except ValueError:
        direct = {}
    direct = direct if isinstance(direct, dict) else {}
    url = str(direct.get("url", ""))[:120]
    info = direct.get("dir_info")
    if isinstance(info, dict) and info.get("editable"):
        return f"editable, from {url}"
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict):
        return f"{str(vcs.get('vcs', 'vcs'))[:10]}, from {url}"
    return f"from {url or 'a direct URL'}"

"""Sandboxes under a policy profile, on the host side: what a profile changes about a sandbox
and which calls on a profiled sandbox are refused.

A profiled sandbox is a Python sandbox whose session interpreter carries the profile's runtime
layer (``harombe/security/guest/profile_layer.py``). The profile is fixed when the sandbox is
made and kept on its record; every call runs in that session interpreter, so calls that would
run code outside it (another language, ``fresh=True``) are refused. The layer's spec travels in
the sandbox's run environment (``PROFILE_ENV``): the worker applies it whenever it starts, also
after a restart, before any code of the user. The profile's ``timeout_max_s`` caps a call's
timeout and its ``memory_mb``, when below the configured limit, becomes the sandbox's.
"""

from __future__ import annotations

import json
import os

import structlog

from harombe.config import Language, Limits, SandboxConfig
from harombe.errors import UsageError
from harombe.host_paths import remember_host_path
from harombe.profile_files import read_profile_files, shipped_names
from harombe.security.guest import PROFILE_ENV
from harombe.security.policy.profile_set import ProfileSet, assemble
from harombe.security.policy.profiles import Profile, import_warnings
from harombe.security.runtime.sandbox import Sandbox

log = structlog.get_logger(__name__)

#: The languages a profile can govern: the runtime layer is Python's.
PROFILE_LANGUAGES: tuple[Language, ...] = ("python",)


def check_language(profile: Profile, language: str) -> None:
    """Refuse a profiled sandbox for a language the runtime layer does not cover."""
    if language not in PROFILE_LANGUAGES:
        raise UsageError(
            f"profile {profile.name!r} applies to Python only, not {language}: its runtime "
            "layer lives in the Python interpreter; run this code without a profile, or as "
            "Python"
        )


def check_call(box: Sandbox, *, language: str, fresh: bool | None) -> None:
    """Refuse a call on a profiled sandbox that would run outside its runtime layer."""
    profile = box.profile
    if profile is None:
        return
    if language not in PROFILE_LANGUAGES:
        raise UsageError(
            f"sandbox {box.sandbox_id} runs under profile {profile.name!r}, which allows "
            f"Python only, not {language}; use a sandbox without a profile for {language}"
        )
    if fresh:
        raise UsageError(
            f"sandbox {box.sandbox_id} runs under profile {profile.name!r}, whose runtime "
            "layer lives in its session interpreter; fresh=True would run outside it, so "
            "leave fresh out"
        )


def cap_timeout(
    profile: Profile | None, timeout_s: float, warnings: list[str]
) -> tuple[float, list[str]]:
    """``timeout_s`` capped to the profile's ``timeout_max_s``, with a warning when it is."""
    if profile is None:
        return timeout_s, warnings
    ceiling = float(profile.resources.timeout_max_s)
    if timeout_s <= ceiling:
        return timeout_s, warnings
    return ceiling, [
        *warnings,
        f"timeout {timeout_s:g}s capped to {ceiling:g}s, the timeout_max of profile "
        f"{profile.name!r}",
    ]


def profile_limits(limits: Limits, profile: Profile | None) -> Limits:
    """The sandbox limits under ``profile``: its ``memory_mb`` when below the configured one."""
    memory_mb = profile.resources.memory_mb if profile is not None else None
    if memory_mb is None or memory_mb >= limits.max_memory_mb:
        return limits
    return limits.model_copy(update={"max_memory_mb": max(memory_mb, 32)})


def profile_config(config: SandboxConfig, profile: Profile | None) -> SandboxConfig:
    """``config`` with the limits of a sandbox under ``profile`` (itself when unchanged)."""
    limits = profile_limits(config.limits, profile)
    if limits is config.limits:
        return config
    return config.model_copy(update={"limits": limits})


def profile_env(profile: Profile) -> dict[str, str]:
    """The run environment that carries ``profile``'s runtime layer into the sandbox."""
    spec = profile.runtime_spec()
    spec["enforce"] = profile.mode("runtime") == "enforce"
    if not spec["enforce"]:
        log.warning("profile.runtime_observed", profile=profile.name,
                    effect="imports and builtins are not restricted at run time")  # fmt: skip
    return {PROFILE_ENV: json.dumps(spec, sort_keys=True, separators=(",", ":"))}


def load_profile_set(directory: str | os.PathLike[str] | None) -> ProfileSet:
    """The shipped profiles and ``directory``'s, each read and resolved on its own: a file that
    cannot be read or resolved disables its profile only (and those extending it), with one
    ``profile.disabled`` warning naming the file and the fix; the manager and the service call
    it when they start. A risky import gets one ``profile.risky_import_allowed`` warning.
    Raises :class:`~harombe.errors.ConfigError` only for a broken shipped profile."""
    remember_host_path("<profiles directory>", directory)
    documents, problems = read_profile_files(directory)
    where = None if directory is None else os.fspath(directory)
    found = assemble(documents, problems, directory=where, shipped=shipped_names())
    for problem in found.problems:
        log.warning(
            "profile.disabled", profile=problem.profile, file=problem.path, error=problem.message
        )
    for profile in found.profiles.values():
        for warning in import_warnings(profile):
            log.warning("profile.risky_import_allowed", profile=profile.name, warning=warning)
    return found

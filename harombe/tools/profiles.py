"""Policy profiles for the tools: loading them, choosing the profile of a ``code_execute``
call, and running its scan stages before the HITL gate.

:func:`load_profiles` reads the shipped profiles and those of ``security.profiles.directory``
and resolves them (:func:`resolve_documents`: one ``profile.risky_import_allowed`` warning per
profile and module such as ``os`` or ``sys`` it allows); the HTTP service uses it as well.
:func:`~harombe.profile_files.load_profile_set` (the manager and the service call it when they
start) reads each file on its own: a broken one disables only its profile. :class:`ProfileTable`
holds one tools object's profiles (its manager's set, else loaded on first use). :func:`scan` runs a
profile's ``pre`` stages on the code in a worker thread (a large input never holds the event
loop) and emits exactly one ``guardrail.decided`` audit event per decision (``passed``,
``rejected``, or ``observed`` when the stages that found violations are in observe mode): a
rejection raises :class:`~harombe.errors.GuardrailError` carrying the violations, so nobody is
asked about refused code and no sandbox is made for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from harombe.config import HarombeConfig
from harombe.errors import ConfigError, GuardrailError, InvalidArgumentError
from harombe.profile_files import read_profile_documents
from harombe.security.policy.guardrails import run_stages
from harombe.security.policy.profile_set import ProfileSet
from harombe.security.policy.profiles import Profile, import_warnings, resolve_profiles
from harombe.security.runtime.profiled import check_language, load_profile_set
from harombe.security.runtime.sandbox import Sandbox

log = structlog.get_logger(__name__)

#: Violations a ``guardrail.decided`` event repeats (the count says how many there were).
AUDIT_VIOLATIONS = 3
#: Violations a refused result lists at most.
MAX_VIOLATIONS = 100


def load_profiles(config: HarombeConfig) -> dict[str, Profile]:
    """Every profile by name: the shipped ones and ``config.security.profiles.directory``'s,
    resolved (``extends`` applied). Raises :class:`~harombe.errors.ConfigError` naming the
    file or profile at fault."""
    return resolve_documents(read_profile_documents(config.security.profiles.directory))


def resolve_documents(documents: Mapping[str, Mapping[str, Any]]) -> dict[str, Profile]:
    """:func:`~harombe.security.policy.profiles.resolve_profiles`, then one
    ``profile.risky_import_allowed`` warning for each profile and module of
    :data:`~harombe.security.policy.profiles.WARNED_IMPORTS` it allows."""
    profiles = resolve_profiles(documents)
    for profile in profiles.values():
        for warning in import_warnings(profile):
            log.warning("profile.risky_import_allowed", profile=profile.name, warning=warning)
    return profiles


class ProfileTable:
    """The profiles of one tools object: ``profiles`` if given, else the set its manager
    loaded when it started (``loaded()``), else read from ``config`` on first use; kept (a
    profile directory changed later is read by a new manager or tools object). A profile
    whose file could not be used is disabled: naming it is a :class:`ConfigError` saying why.
    """

    def __init__(
        self,
        config: HarombeConfig,
        profiles: Mapping[str, Profile] | ProfileSet | None = None,
        *,
        loaded: Callable[[], ProfileSet | None] | None = None,
    ) -> None:
        self._config = config
        self._loaded = loaded
        self._set: ProfileSet | None = None
        if isinstance(profiles, ProfileSet):
            self._set = profiles
        elif profiles is not None:
            self._set = ProfileSet(dict(profiles))

    @property
    def profile_set(self) -> ProfileSet:
        """The profiles and the problems found loading them (loaded now if not yet)."""
        if self._set is None:
            found = self._loaded() if self._loaded is not None else None
            self._set = found or load_profile_set(self._config.security.profiles.directory)
        return self._set

    @property
    def profiles(self) -> dict[str, Profile]:
        """Profiles by name, the disabled ones left out (loaded now if not yet)."""
        return self.profile_set.profiles

    def get(self, name: str) -> Profile:
        """The profile ``name``; :class:`ConfigError` when it is disabled (saying why),
        :class:`InvalidArgumentError` naming the known ones when there is no such profile."""
        found = self.profile_set
        if name in found.profiles:
            return found.profiles[name]
        if name in found.disabled:
            raise ConfigError(disabled_message(name, found.disabled[name]))
        raise InvalidArgumentError(
            f"unknown profile {name!r}; use one of {', '.join(sorted(found.profiles))}, or add "
            "it to the directory security.profiles.directory names"
        )


def disabled_message(name: str, reason: str) -> str:
    """What a call naming the disabled profile ``name`` is told (``reason``: caller-safe)."""
    return (
        f"profile {name!r} is disabled: its file could not be used when harombe started "
        f"({reason}); fix the file and restart harombe, or use another profile (the others "
        "work)"
    )


def profile_for_call(
    table: ProfileTable,
    name: str | None,
    *,
    box: Sandbox | None,
    language: str,
    fresh: bool,
) -> Profile | None:
    """The profile a ``code_execute`` call runs under: the sandbox's own (``name`` may repeat
    it), else the one ``name`` gives a new sandbox, else none. Refuses a call that would
    change a sandbox's profile or run outside its runtime layer."""
    if box is not None:
        profile: Profile | None = getattr(box, "profile", None)
        if name is not None and (profile is None or profile.name != name):
            has = f"profile {profile.name!r}" if profile is not None else "no profile"
            raise InvalidArgumentError(
                f"sandbox {box.sandbox_id} was created with {has}, and a sandbox keeps the "
                f"profile it was created with; leave out profile={name!r}, or leave out "
                "sandbox_id to create a sandbox under it"
            )
    else:
        profile = table.get(name) if name is not None else None
    if profile is None:
        return None
    check_language(profile, language)
    if fresh:
        raise InvalidArgumentError(
            f"fresh=True cannot be used with profile {profile.name!r}: its runtime layer lives "
            "in the sandbox's session interpreter, and a fresh process would run outside it; "
            "leave fresh out"
        )
    return profile


async def scan(code: str, profile: Profile, *, sandbox_id: str | None = None) -> list[str]:
    """Run ``profile``'s ``pre`` scan stages on ``code`` in a worker thread; one
    ``guardrail.decided`` event.

    Returns the warnings of observe-mode findings (the code runs, the runtime layer still
    applies); raises :class:`GuardrailError` with the violations when a stage in enforce mode
    reports any."""
    # The scan is CPU work bounded by its budgets (up to about a second for the largest
    # input): off the loop, it does not stall other sandboxes' calls or HTTP requests.
    report = await asyncio.to_thread(run_stages, code, profile)
    violations = tuple(report.violations)
    outcome = "passed" if not violations else "rejected" if report.rejected else "observed"
    log.info(
        "guardrail.decided",
        profile=profile.name,
        stage=report.stage,
        outcome=outcome,
        violation_count=len(violations),
        violations=list(violations[:AUDIT_VIOLATIONS]),
        sandbox_id=sandbox_id,
    )
    if outcome == "passed":
        return []
    if outcome == "observed":
        shown = report.findings[:MAX_VIOLATIONS]
        return [f"guardrail {stage} (observe mode): {v}" for stage, v in shown]
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    raise GuardrailError(
        f"Code validation failed: profile {profile.name!r}, stage {report.stage}: "
        f"{violations[0]}{more}; change the code to stay within the profile (its allowed "
        "imports and names), or run it without a profile",
        violations=violations[:MAX_VIOLATIONS],
        stage=str(report.stage),
        profile=profile.name,
    )

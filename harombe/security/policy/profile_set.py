"""A set of policy profiles resolved one by one: those that resolve, and for each one that does
not, why — so one broken file disables its own profile (and those extending it), never the
others. Pure: :func:`harombe.security.runtime.profiled.load_profile_set` reads the files and
logs what :func:`assemble` finds.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from harombe.errors import ConfigError
from harombe.profile_files import ProfileProblem, profile_path, public_text
from harombe.security.policy.profile_values import short
from harombe.security.policy.profiles import Profile, build_profile, checked_document


@dataclass(frozen=True)
class ProfileSet:
    """Every profile that loaded, and every problem found loading them (see
    :class:`~harombe.profile_files.ProfileProblem`)."""

    profiles: dict[str, Profile]
    problems: tuple[ProfileProblem, ...] = ()

    @property
    def disabled(self) -> dict[str, str]:
        """Disabled profile name → why, in words a caller may be told (no host path)."""
        return {p.profile: p.public for p in self.problems if p.profile is not None}


def assemble(
    documents: Mapping[str, Mapping[str, Any]],
    problems: Collection[ProfileProblem],
    *,
    directory: str | None,
    shipped: Collection[str],
) -> ProfileSet:
    """The set of ``documents`` (read from the shipped profiles and ``directory``), with
    ``problems`` (the files that could not be read) and one more problem for each profile that
    does not resolve. Raises :class:`ConfigError` when a ``shipped`` profile does not (a broken
    install, not a user's file)."""
    unreadable = {p.profile for p in problems if p.profile is not None}
    profiles, failed = resolve_each(documents, unreadable=unreadable)
    found = list(problems)
    for name in sorted(failed):
        if directory is None or name in shipped:
            raise ConfigError(f"harombe's shipped profile '{name}' is broken: {failed[name]}")
        path = profile_path(directory, name)
        message = f"profile file {path}: {failed[name]}"
        found.append(ProfileProblem(name, path, message, public_text(message, directory)))
    return ProfileSet(profiles, tuple(found))


def resolve_each(
    documents: Mapping[str, Mapping[str, Any]], *, unreadable: Collection[str] = ()
) -> tuple[dict[str, Profile], dict[str, ConfigError]]:
    """Resolve every profile of ``documents`` on its own: those that resolve, and for each one
    that does not, why (a :class:`ConfigError` naming it, the key and the fix). A profile that
    extends a failed one, or one of ``unreadable`` (names whose file could not be read), fails
    too, saying which; so does every member of an ``extends`` cycle."""
    walk = _Walk(documents, frozenset(unreadable))
    for name in sorted(documents):
        walk.resolve(name, ())
    return walk.resolved, walk.failed


class _Walk:
    """One resolution of ``documents``: what resolved, what failed and why, and for a profile
    that failed only through its parent, the profile at fault (``root_of``)."""

    def __init__(self, documents: Mapping[str, Mapping[str, Any]], unreadable: frozenset[str]):
        self.documents, self.unreadable = documents, unreadable
        self.resolved: dict[str, Profile] = {}
        self.failed: dict[str, ConfigError] = {}
        self.root_of: dict[str, str] = {}

    def resolve(self, name: str, chain: tuple[str, ...]) -> Profile | None:
        """``name`` resolved, or None with the reason kept in ``failed``."""
        if name in self.resolved or name in self.failed:
            return self.resolved.get(name)
        if name in chain:
            loop = chain[chain.index(name) :]
            for at, member in enumerate(loop):
                path = " -> ".join((*loop[at:], *loop[:at], member))
                self.failed[member] = ConfigError(
                    f"profiles extend each other in a cycle ({path}); remove one of these "
                    "extends keys"
                )
            return None
        try:
            document = checked_document(name, self.documents[name])
            parent = self._parent(name, document.get("extends"), chain)
            if name in self.failed:  # a member of a cycle found through the parent
                return None
            self.resolved[name] = build_profile(name, document, parent)
        except ConfigError as err:
            self.failed[name] = err
            return None
        return self.resolved[name]

    def _parent(self, name: str, parent_name: object, chain: tuple[str, ...]) -> Profile | None:
        if parent_name is None:
            return None
        if isinstance(parent_name, str) and parent_name in self.unreadable:
            raise ConfigError(
                f"profile '{name}' extends '{parent_name}', whose file could not be read; fix "
                "that file (its own error says how)"
            )
        if not isinstance(parent_name, str) or parent_name not in self.documents:
            known = ", ".join(sorted(self.documents))
            raise ConfigError(
                f"profile '{name}' extends {short(parent_name)}, which is not a profile (known: "
                f"{known}); fix its extends key"
            )
        parent = self.resolve(parent_name, (*chain, name))
        if parent is None and name not in self.failed:
            root = self.root_of.get(parent_name, parent_name)
            self.root_of[name] = root
            raise ConfigError(
                f"profile '{name}' extends '{parent_name}', which cannot be used: "
                f"{self.failed[root]}"
            )
        return parent

"""Profiles the guardrail tests judge code against: the shipped ones, and one that allows the
modules the guardrails refuse member by member (os, subprocess…), to test that layer alone."""

from __future__ import annotations

from functools import cache
from typing import Any

from harombe.profile_files import read_profile_documents
from harombe.security.policy.profiles import Profile, resolve_profiles

#: A profile allowing modules that minimal refuses, so their members' checks can be seen.
PERMISSIVE: dict[str, Any] = {
    "extends": "minimal",
    "imports": {
        "additional": ["os", "posix", "subprocess", "socket", "signal", "pickle",
                       "marshal", "shelve", "yaml", "hashlib", "dill", "numpy", "pandas"]
    },
}  # fmt: skip
#: Allowed in "permissive" past the profile checks, which refuse them in any profile file.
UNLOADABLE = ("importlib",)


@cache
def profiles() -> dict[str, Profile]:
    documents: dict[str, dict[str, Any]] = dict(read_profile_documents(None))
    documents["permissive"] = PERMISSIVE
    resolved = resolve_profiles(documents)
    wide = tuple(sorted({*resolved["permissive"].allowed_imports, *UNLOADABLE}))
    resolved["permissive"] = resolved["permissive"].model_copy(update={"allowed_imports": wide})
    return resolved


def profile(name: str) -> Profile:
    return profiles()[name]

"""Judging one attribute name: on any object, on a known module, against a profile's blocklist,
and inside strings that name attributes (``attrgetter("a.b")``, ``"{0.__class__}"``).

Each function returns the violation text (without the ``Line N:`` prefix) or None.
"""

from __future__ import annotations

import functools

from harombe.security.policy.guardrails.source import normal
from harombe.security.policy.guardrails.tables import (
    ALIAS_EXCEPTIONS,
    ATTRIBUTE_EXCEPTIONS,
    BLOCKED_ATTRIBUTES,
    BLOCKED_DUNDERS,
    BLOCKED_MODULES,
    DUNDER,
    FORMAT_FIELD,
    FORMAT_HARMLESS_DUNDERS,
    FORMAT_PART,
    FRAME_ATTRIBUTES,
    MODULE_ALIASES,
    OS_MODULES,
    OS_PROCESS_NAMES,
    OS_PROCESS_PREFIXES,
)
from harombe.security.policy.profiles import Profile


def any_object(attr: str, owner: str | None) -> str | None:
    """Why reading ``attr`` is refused whatever it hangs on (``owner``: the dotted name of the
    object when known, for the few harmless exceptions such as ``re.compile``)."""
    if attr in BLOCKED_DUNDERS or attr == "__forward_code__":
        return f"access to '{attr}' is not permitted"
    if attr in FRAME_ATTRIBUTES:
        return f"access to '{attr}' is not permitted (frame introspection)"
    if attr in BLOCKED_ATTRIBUTES and (owner, attr) not in ATTRIBUTE_EXCEPTIONS:
        return f"access to '{attr}' attribute is not allowed (dangerous function)"
    if attr in MODULE_ALIASES and (owner, attr) not in ALIAS_EXCEPTIONS:
        return f"access to '{attr}' attribute is not allowed (module reference)"
    return None


def on_module(owner: str, attr: str, *, call: bool) -> str | None:
    """Why ``owner.attr`` is refused when ``owner`` is a module the scan resolved."""
    top = owner.split(".")[0]
    use = f"call to '{owner}.{attr}()'" if call else f"access to '{owner}.{attr}'"
    if top in BLOCKED_MODULES:
        return f"{use} is not allowed (module '{top}' is blocked)"
    if owner in OS_MODULES and (attr in OS_PROCESS_NAMES or attr.startswith(OS_PROCESS_PREFIXES)):
        return f"{use} is not allowed (it runs or signals processes)"
    return None


def blocked_by_profile(owner: str | None, attr: str, profile: Profile) -> str | None:
    """Why ``owner.attr`` is refused by the profile's blocklist. ``owner`` is the module the
    scan resolved (``pd`` → ``pandas``; a submodule counts: ``pandas.core.api.read_pickle``),
    or None. The attribute name alone decides: the object may be the module under another
    name (``[pd][0].read_pickle``), which static analysis cannot always see."""
    modules = _blocked_modules(profile.blocklist).get(attr, ())
    for module in modules:
        if owner is not None and (owner == module or owner.startswith(module + ".")):
            return f"access to '{owner}.{attr}' is blocked by profile '{profile.name}'"
    if modules:
        return f"access to '{attr}' is blocked by profile '{profile.name}' (as {modules[0]}.{attr})"
    return None


@functools.lru_cache(maxsize=64)
def _blocked_modules(blocklist: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, ...]]:
    """Attribute name → the modules whose member of that name the blocklist refuses."""
    index: dict[str, tuple[str, ...]] = {}
    for module, attr in blocklist:
        index[attr] = (*index.get(attr, ()), module)
    return index


def in_module_path(path: str, profile: Profile) -> str | None:
    """Why importing the dotted ``path`` (``numpy.ctypeslib``, ``scipy.io.loadmat``) reaches a
    member the profile blocks."""
    parts = path.split(".")
    for index in range(1, len(parts)):
        owner, attr = ".".join(parts[:index]), parts[index]
        if (owner, attr) in profile.blocklist:
            return f"import of '{path}' is blocked by profile '{profile.name}' ({owner}.{attr})"
    return None


def dynamic_name(text: str, function: str, profile: Profile) -> list[str]:
    """Why ``attrgetter(text)`` / ``methodcaller(text)`` is refused: each dotted part is read
    as an attribute, so every name refused as an attribute is refused here too, and so is any
    dunder."""
    problems = []
    blocklisted = _blocked_modules(profile.blocklist)
    for part in normal(text).split("."):
        if DUNDER.fullmatch(part):
            problems.append(f"dynamic access to dunder '{part}' via {function}() is not allowed")
        elif (
            part in FRAME_ATTRIBUTES
            or part in BLOCKED_ATTRIBUTES
            or part in MODULE_ALIASES
            or part in OS_PROCESS_NAMES
            or part in blocklisted
        ):
            problems.append(f"dynamic attribute access to '{part}' via {function}() is not allowed")
    return problems


def dangerous_key(text: str) -> bool:
    """Whether ``text`` names a blocked dunder or frame attribute."""
    text = normal(text)
    return text in BLOCKED_DUNDERS or text in FRAME_ATTRIBUTES


def in_string(text: str, *, built: bool = False) -> list[str]:
    """Why a string is refused: it is (or spells a dotted path through) a blocked attribute
    name, or holds a ``str.format`` field that reads one (``"{0.__globals__}"``). ``built``:
    the string is computed from literals (``"__glo" + "bals__"``) rather than written."""
    text = normal(text)
    problems = []
    what = "string built here" if built else "string literal"
    if dangerous_key(text):
        verb = "spells" if built else "matches"
        problems.append(f"{what} '{text}' {verb} a blocked attribute name")
    elif "." in text and len(text) < 200 and text.replace(".", "").replace("_", "").isalnum():
        for part in text.split("."):
            if dangerous_key(part):
                problems.append(f"{what} '{text}' names a blocked attribute ('{part}')")
                break
    if "{" in text:
        for field in FORMAT_FIELD.findall(text):
            for part in FORMAT_PART.findall(field):
                part = part.strip()
                if dangerous_key(part) or (
                    DUNDER.fullmatch(part) and part not in FORMAT_HARMLESS_DUNDERS
                ):
                    problems.append(f"{what} has a format field that reads '{part}'")
    return problems

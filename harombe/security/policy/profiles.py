"""Policy profiles: which modules code may import, which module members it may not touch, which
scan stages judge it, and the limits and preimports of the sandbox it runs in.

A profile is written as YAML (shipped ones in ``harombe/profiles/``, a user's in the directory
``security.profiles.directory`` names; :mod:`harombe.profile_files` reads them). This module is
the pure part: it checks the parsed documents and resolves ``extends``::

    name: data-science                # the profile's name (its file's stem)
    description: …
    extends: minimal                  # start from another profile (chains allowed, no cycles)
    imports:
      allowed: [math, json]           # replaces the parent's allowlist
      additional: [numpy]             # adds to it (or to ``allowed`` given beside it)
    blocklist:                        # added to the parent's entries
      - [numpy, frompyfunc]           # [module (dotted allowed), attribute]
    resources:                        # each key inherited unless given
      memory: 512Mi                   # Mi, Gi or a plain number of MiB
      cpu: 500m                       # millicores, or a number of cores
      timeout_max: 30                 # seconds; caps a call's timeout
      subprocess_memory_mb: 512       # the runtime layer's address-space limit
    scan_stages: {pre: [ast_scan, blocklist_audit], post: []}   # each phase inherited unless given
    preimport: [numpy]                # imported before user code; must be allowed imports
                                      # (numpy, pandas, scipy: always, when allowed)
    audit:
      mode: {ast_scan: enforce, blocklist_audit: observe, runtime: enforce}

An unknown key, a value of the wrong form, an unknown parent or a cycle is a
:class:`~harombe.errors.ConfigError` naming the profile, the key and the fix. An unknown scan
stage name is not: the scan refuses the code (see :mod:`~harombe.security.policy.guardrails`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from harombe.errors import ConfigError
from harombe.security.policy import profile_values as values
from harombe.security.policy.profile_values import short

AuditMode = Literal["enforce", "observe"]
#: The scan stages harombe knows, in the order a profile usually lists them.
STAGES = ("ast_scan", "blocklist_audit")
#: The layers whose audit mode a profile sets: the two scan stages and the in-sandbox layer.
AUDIT_LAYERS = (*STAGES, "runtime")
DEFAULT_STAGES_PRE = ("ast_scan", "blocklist_audit")

_TOP_KEYS = ("name", "description", "extends", "imports", "blocklist", "resources",
             "scan_stages", "preimport", "audit")  # fmt: skip
_IMPORT_KEYS = ("allowed", "additional")
_RESOURCE_KEYS = ("memory", "cpu", "timeout_max", "subprocess_memory_mb")
_STAGE_KEYS = ("pre", "post")
#: Modules no profile may allow: each hands code what the guardrails exist to withhold.
REFUSED_IMPORTS = {
    "builtins": "the real builtins (open, exec, __import__)",
    "gc": "every live object, the runtime layer's own included",
    "ctypes": "foreign code and raw memory",
    "_ctypes": "foreign code and raw memory",
    "importlib": "imports by a computed name, past the allowlist",
    "_imp": "imports by a computed name, past the allowlist",
    "_frozen_importlib": "imports by a computed name, past the allowlist",
    "_frozen_importlib_external": "imports by a computed name, past the allowlist",
}
#: Allowed modules the runtime layer (enforce mode) imports ahead even when ``preimport`` does
#: not list them: their first import starts threads (OpenBLAS) or loads ``ctypes``, both refused
#: once user code runs, so a later ``import numpy`` could only fail.
NEEDS_PREIMPORT = ("numpy", "pandas", "scipy")
#: Modules a profile may allow, with a warning when it is loaded: the scans judge their
#: members one by one, not the module as a whole.
WARNED_IMPORTS = {
    "os": "files, the environment and processes",
    "posix": "files, the environment and processes",
    "sys": "every loaded module (sys.modules) and the interpreter's state",
    "subprocess": "processes",
    "socket": "the network",
    "signal": "signal handlers",
    "shutil": "files",
    "pathlib": "files",
    "io": "files",
    "tempfile": "files",
    "multiprocessing": "processes",
    "pickle": "unpickling, which runs code",
    "marshal": "code objects",
    "inspect": "frames and their globals",
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_MODULE = re.compile(r"[A-Za-z_]\w*")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class Resources(BaseModel):
    """A profile's limits. ``memory_mb`` (MiB) and ``cpu`` (cores) are None when not set, so the
    sandbox's configured limits apply; ``timeout_max_s`` caps a call's timeout;
    ``subprocess_memory_mb`` is the address-space limit of the code's process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int | None = None
    cpu: float | None = None
    timeout_max_s: float = 30.0
    subprocess_memory_mb: int = 512


class Profile(BaseModel):
    """A resolved profile: ``extends`` applied, every value checked. Immutable and hashable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    allowed_imports: tuple[str, ...] = ()  # top-level module names, sorted, unique
    blocklist: tuple[tuple[str, str], ...] = ()  # (module, attribute); module may be dotted
    resources: Resources = Resources()
    scan_pre: tuple[str, ...] = DEFAULT_STAGES_PRE
    scan_post: tuple[str, ...] = ()
    preimport: tuple[str, ...] = ()
    audit_modes: tuple[tuple[str, AuditMode], ...] = ()  # (layer, mode), sorted by layer

    def mode(self, layer: str) -> AuditMode:
        """The audit mode of ``layer`` (a scan stage or ``runtime``): ``enforce`` unless set."""
        return dict(self.audit_modes).get(layer, "enforce")

    def fingerprint(self) -> str:
        """12 hex digits of the canonical JSON of everything in the profile: equal profiles
        share it, any change of content changes it (warm pools are keyed by it)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]

    def describe(self) -> dict[str, Any]:
        """The body of the sidecar's ``GET /profile``."""
        return {
            "name": self.name,
            "description": self.description,
            "allowed_imports": list(self.allowed_imports),
            "blocklist_entries": len(self.blocklist),
            "scan_stages": {"pre": list(self.scan_pre), "post": list(self.scan_post)},
        }

    def runtime_spec(self) -> dict[str, Any]:
        """What the in-sandbox layer needs, as JSON-able data. ``preimport_needed`` (only when
        not empty): the allowed :data:`NEEDS_PREIMPORT` modules ``preimport`` does not list,
        which an enforced layer imports ahead if installed."""
        spec: dict[str, Any] = {
            "allowed_imports": list(self.allowed_imports),
            "preimport": list(self.preimport),
            "subprocess_memory_mb": self.resources.subprocess_memory_mb,
            "blocklist": [[module, attr] for module, attr in self.blocklist],
        }
        listed = {module.split(".")[0] for module in self.preimport}
        needed = [m for m in NEEDS_PREIMPORT if m in self.allowed_imports and m not in listed]
        if needed and self.mode("runtime") == "enforce":
            spec["preimport_needed"] = needed
        return spec


def import_warnings(profile: Profile) -> list[str]:
    """Why ``profile``'s allowed imports deserve a warning (empty: none do), one text per
    module of :data:`WARNED_IMPORTS` it allows."""
    return [
        f"profile '{profile.name}' allows importing '{module}', which reaches "
        f"{WARNED_IMPORTS[module]}: the scans refuse only its members they know by name, so "
        "the runtime layer and gVisor are what contain such code; drop it unless needed"
        for module in profile.allowed_imports
        if module in WARNED_IMPORTS
    ]


def resolve_profiles(documents: Mapping[str, Mapping[str, Any]]) -> dict[str, Profile]:
    """Every profile of ``documents`` (profile name → its parsed YAML mapping), resolved.

    A document's ``name`` key, when present, must equal its name in ``documents``. Raises
    :class:`ConfigError` naming the profile, the key and the fix on the first problem found.
    """
    resolved: dict[str, Profile] = {}
    for name in sorted(documents):
        _resolve(name, documents, resolved, ())
    return resolved


def _resolve(
    name: str,
    documents: Mapping[str, Mapping[str, Any]],
    resolved: dict[str, Profile],
    chain: tuple[str, ...],
) -> Profile:
    if name in resolved:
        return resolved[name]
    if name in chain:
        loop = " -> ".join((*chain[chain.index(name) :], name))
        raise ConfigError(
            f"profiles extend each other in a cycle ({loop}); remove one of these extends keys"
        )
    document = checked_document(name, documents[name])
    parent_name = document.get("extends")
    parent: Profile | None = None
    if parent_name is not None:
        if not isinstance(parent_name, str) or parent_name not in documents:
            known = ", ".join(sorted(documents))
            raise ConfigError(
                f"profile '{name}' extends {short(parent_name)}, which is not a profile (known: "
                f"{known}); fix its extends key"
            )
        parent = _resolve(parent_name, documents, resolved, (*chain, name))
    resolved[name] = build_profile(name, document, parent)
    return resolved[name]


def checked_document(name: str, document: object) -> Mapping[str, Any]:
    """``document`` when ``name`` and its top-level keys are valid; else :class:`ConfigError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"profile name {short(name)} is not allowed; use 1-64 characters of a-z, 0-9, '-', '_' "
            "and '.', starting with a letter or digit"
        )
    if not isinstance(document, Mapping):
        raise ConfigError(
            f"profile '{name}' must be a mapping of keys, not {values.kind(document)}"
        )
    values.known_keys(name, "", document, _TOP_KEYS)
    given = document.get("name", name)
    if given != name:
        raise ConfigError(
            f"profile '{name}' has name {short(given)}; a profile's name key must match the "
            f"name it is loaded as (its file's stem): set name: {name}"
        )
    return document


def build_profile(name: str, document: Mapping[str, Any], parent: Profile | None) -> Profile:
    """The profile ``document`` describes over ``parent``; :class:`ConfigError` naming the fix."""
    allowed = _imports(name, document.get("imports"), parent)
    preimport = _modules(name, "preimport", document.get("preimport"), dotted=True)
    preimports = parent.preimport if parent and preimport is None else tuple(preimport or ())
    for module in preimports:
        if module.split(".")[0] not in allowed:
            raise ConfigError(
                f"profile '{name}': preimport {short(module)} is not an allowed import; add "
                f"{short(module.split('.')[0])} to imports.additional or drop it from "
                "preimport"
            )
    pre, post = _stages(name, document.get("scan_stages"), parent)
    return Profile(
        name=name,
        description=values.text(name, "description", document.get("description", "")),
        allowed_imports=tuple(sorted(allowed)),
        blocklist=_blocklist(name, document.get("blocklist"), parent),
        resources=_resources(name, document.get("resources"), parent),
        scan_pre=pre,
        scan_post=post,
        preimport=preimports,
        audit_modes=_audit(name, document.get("audit"), parent),
    )


def _imports(name: str, section: object, parent: Profile | None) -> set[str]:
    base = set(parent.allowed_imports) if parent else set()
    if section is None:
        return base
    section = values.mapping(name, "imports", section)
    values.known_keys(name, "imports.", section, _IMPORT_KEYS)
    allowed = _modules(name, "imports.allowed", section.get("allowed"), dotted=False)
    additional = _modules(name, "imports.additional", section.get("additional"), dotted=False)
    for key, modules in (("imports.allowed", allowed), ("imports.additional", additional)):
        refused = [module for module in modules or () if module in REFUSED_IMPORTS]
        if refused:
            module = refused[0]
            raise ConfigError(
                f"profile '{name}': {key} lists '{module}', which hands code "
                f"{REFUSED_IMPORTS[module]} and undoes the guardrails; remove it (no profile "
                f"may allow {', '.join(sorted(REFUSED_IMPORTS))})"
            )
    result = set(allowed) if allowed is not None else base
    return result | set(additional or ())


def _modules(name: str, key: str, value: object, *, dotted: bool) -> list[str] | None:
    if value is None:
        return None
    form = _DOTTED if dotted else _MODULE
    entries = values.as_list(name, key, value)
    for entry in entries:
        if not isinstance(entry, str) or not form.fullmatch(entry):
            what = "module names" if dotted else "top-level module names (no dots)"
            fix = ""
            if not dotted and isinstance(entry, str) and _DOTTED.fullmatch(entry):
                top = entry.split(".")[0]
                fix = f": write '{top}', which allows its submodules too"
            raise ConfigError(f"profile '{name}': {key} holds {short(entry)}; it lists {what}{fix}")
    return list(dict.fromkeys(entries))


def _blocklist(name: str, value: object, parent: Profile | None) -> tuple[tuple[str, str], ...]:
    entries: list[tuple[str, str]] = list(parent.blocklist) if parent else []
    for entry in values.as_list(name, "blocklist", value) if value is not None else []:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], str)
            or not _DOTTED.fullmatch(entry[0])
            or not _MODULE.fullmatch(entry[1])
        ):
            raise ConfigError(
                f"profile '{name}': blocklist entry {short(entry)} is not [module, attribute] "
                "(e.g. [scipy.io, loadmat])"
            )
        entries.append((entry[0], entry[1]))
    return tuple(dict.fromkeys(entries))


def _resources(name: str, value: object, parent: Profile | None) -> Resources:
    base = parent.resources if parent else Resources()
    if value is None:
        return base
    section = values.mapping(name, "resources", value)
    values.known_keys(name, "resources.", section, _RESOURCE_KEYS)
    fields: dict[str, Any] = base.model_dump()
    if "memory" in section:
        fields["memory_mb"] = values.memory_mb(name, section["memory"])
    if "cpu" in section:
        fields["cpu"] = values.cpu(name, section["cpu"])
    if "timeout_max" in section:
        fields["timeout_max_s"] = values.timeout_s(name, section["timeout_max"])
    if "subprocess_memory_mb" in section:
        fields["subprocess_memory_mb"] = values.subprocess_mb(name, section["subprocess_memory_mb"])
    return Resources(**fields)


def _stages(
    name: str, value: object, parent: Profile | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pre = parent.scan_pre if parent else DEFAULT_STAGES_PRE
    post = parent.scan_post if parent else ()
    if value is None:
        return pre, post
    section = values.mapping(name, "scan_stages", value)
    values.known_keys(name, "scan_stages.", section, _STAGE_KEYS)
    phases = {"pre": pre, "post": post}
    for phase in _STAGE_KEYS:
        if phase in section:
            stages = values.as_list(name, f"scan_stages.{phase}", section[phase] or [])
            if not all(isinstance(stage, str) for stage in stages):
                raise ConfigError(
                    f"profile '{name}': scan_stages.{phase} lists stage names (known: "
                    f"{', '.join(STAGES)}), not {short(stages)}"
                )
            phases[phase] = tuple(stages)
    return phases["pre"], phases["post"]


def _audit(name: str, value: object, parent: Profile | None) -> tuple[tuple[str, AuditMode], ...]:
    modes: dict[str, AuditMode] = dict(parent.audit_modes) if parent else {}
    if value is None:
        return tuple(sorted(modes.items()))
    section = values.mapping(name, "audit", value)
    values.known_keys(name, "audit.", section, ("mode",))
    layers = values.mapping(name, "audit.mode", section.get("mode") or {})
    values.known_keys(name, "audit.mode.", layers, AUDIT_LAYERS)
    for layer, mode in layers.items():
        if mode not in get_args(AuditMode):
            raise ConfigError(
                f"profile '{name}': audit.mode.{layer} is {short(mode)}; use enforce or observe"
            )
        modes[layer] = mode
    return tuple(sorted(modes.items()))

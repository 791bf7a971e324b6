"""Package specs: where a spec points, and which specs harombe accepts. The one rule.

Only plain registry specs pass: a name and optional version constraint (``requests==2.31.0``,
``pandas>=2,<3``, ``axios@1.6.0``, ``@types/node@^20``). URLs, VCS references, local paths,
archives, npm aliases, option-looking strings and malformed specs are refused.

:func:`judge_spec` is the single decision; everything else reads it. The runtime installs only
what :func:`parse_spec` accepts, and the risk table rates CRITICAL whatever
:func:`source_kind` does not call ``"registry"`` — so a spec the gate rated as a plain registry
package is one the installer takes, and a spec the installer refuses was never rated lower.

Pure: no I/O; the registry list comes from :data:`harombe.config.REGISTRIES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement

from harombe.config import REGISTRIES, Registry
from harombe.errors import PackageSpecError

__all__ = [
    "MAX_SPEC_CHARS",
    "REGISTRIES",
    "PackageSpec",
    "Registry",
    "SourceKind",
    "SpecVerdict",
    "judge_spec",
    "parse_spec",
    "source_kind",
]

#: Where a spec points. Only ``"registry"`` is installable; ``"option"`` is a string pip / npm
#: would read as a command-line option, ``"invalid"`` one that is not a spec at all.
SourceKind = Literal[
    "registry", "unknown-registry", "url", "vcs", "path", "archive", "alias", "option", "invalid"
]

NPM_NAME = re.compile(r"^(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
NPM_RANGE = re.compile(r"^[0-9A-Za-z.+\-*^~<>=| ]{1,128}$")
#: npm refuses longer package names.
NPM_NAME_MAX_CHARS = 214
MAX_SPEC_CHARS = 512
#: Schemes that make pip or npm fetch from version control instead of the registry.
_VCS_MARKERS = ("git+", "git:", "github:", "gitlab:", "bitbucket:", "gist:", "hg+", "svn+", "bzr+")
#: Schemes that make pip or npm read the local file system instead of the registry.
_PATH_MARKERS = ("file:", "link:")
#: Endings pip and npm read as a downloaded archive (a file name), not a package name.
_ARCHIVE_SUFFIXES = (
    ".whl", ".zip", ".tar", ".tgz", ".tar.gz", ".tbz", ".tar.bz2", ".txz", ".tar.xz",
    ".tlz", ".tar.lz", ".tar.lzma",
)  # fmt: skip
_PYPI_SOURCE = "only PyPI names with versions are allowed (e.g. 'requests==2.31.0')"
_NPM_SOURCE = "only npm registry names with versions are allowed (e.g. 'axios@1.6.0')"


@dataclass(frozen=True)
class PackageSpec:
    """A validated spec: ``text`` is what is handed to pip / npm, unchanged."""

    registry: Registry
    name: str
    text: str


@dataclass(frozen=True)
class SpecVerdict:
    """What :func:`judge_spec` concluded: the kind of source; for a registry package the
    validated :class:`PackageSpec`, otherwise a sentence saying why it is refused and what to
    write."""

    kind: SourceKind
    reason: str = ""
    spec: PackageSpec | None = None


def judge_spec(package: object, registry: object = "pypi") -> SpecVerdict:
    """Classify ``package`` as a spec for ``registry``. Never raises; cheap on any input (a
    spec past :data:`MAX_SPEC_CHARS` is refused before it is read)."""
    if not isinstance(registry, str) or registry not in REGISTRIES:
        return SpecVerdict(
            "unknown-registry",
            reason=f"unknown registry {registry!r}; harombe installs from 'pypi' or 'npm' only",
        )
    if not isinstance(package, str) or not package.strip():
        return SpecVerdict(
            "invalid", reason="package spec is empty; give a name such as 'requests==2.31.0'"
        )
    if len(package) > MAX_SPEC_CHARS:
        return SpecVerdict(
            "invalid",
            reason=f"package spec is {len(package)} characters long; a registry spec (name and "
            f"version) is at most {MAX_SPEC_CHARS}",
        )
    text = package.strip()
    if text.startswith("-") or any(c in text for c in "\n\r\t\\"):
        return SpecVerdict(
            "option", reason=f"package spec {package!r} looks like an option; give a name"
        )
    kind = _common_source(text)
    if registry == "pypi":
        return _judge_pypi(text, kind)
    return _judge_npm(text, kind)


def source_kind(package: object, registry: object = "pypi") -> SourceKind:
    """Where ``package`` points for ``registry``: ``"registry"`` for a plain registry package
    that :func:`parse_spec` accepts, anything else for a spec it refuses."""
    return judge_spec(package, registry).kind


def parse_spec(package: str, registry: str = "pypi") -> PackageSpec:
    """Validate ``package`` for ``registry``; :class:`PackageSpecError` says what to write."""
    verdict = judge_spec(package, registry)
    if verdict.spec is None:
        raise PackageSpecError(verdict.reason)
    return verdict.spec


def _common_source(text: str) -> SourceKind | None:
    """The markers both registries share. A VCS, path or alias scheme or a URL anywhere in the
    text, a leading ``.``, ``/`` or ``~``, or an archive ending makes the spec that kind,
    whichever registry it is for: no plain registry spec contains them, so failing safe costs
    nothing (``foo===file:x`` is a valid PyPI requirement, and refused)."""
    lowered = text.lower()
    if any(marker in lowered for marker in _VCS_MARKERS):
        return "vcs"
    if any(marker in lowered for marker in _PATH_MARKERS) or text.startswith((".", "/", "~")):
        return "path"
    if "://" in text or " @ " in text:
        return "url"
    if lowered.endswith(_ARCHIVE_SUFFIXES):
        return "archive"
    if "npm:" in lowered:
        return "alias"
    return None


def _judge_pypi(text: str, kind: SourceKind | None) -> SpecVerdict:
    if kind is not None or "/" in text:
        return SpecVerdict(kind or "path", reason=f"{text!r} is a URL or path; {_PYPI_SOURCE}")
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return SpecVerdict("invalid", reason=f"{text!r} is not a valid PyPI requirement: {exc}")
    if req.url:
        return SpecVerdict(
            "url", reason=f"{text!r} names a URL; only registry packages are allowed"
        )
    if req.marker is not None:
        return SpecVerdict(
            "invalid", reason=f"{text!r} has an environment marker; drop the ';' part"
        )
    return SpecVerdict("registry", spec=PackageSpec("pypi", req.name, text))


def _judge_npm(text: str, kind: SourceKind | None) -> SpecVerdict:
    scoped = text.startswith("@")
    at = text.find("@", 1 if scoped else 0)
    name, version = (text, "") if at < 0 else (text[:at], text[at + 1 :])
    if kind is None:
        kind = _npm_source(text, name, scoped)
    if kind is not None:
        return SpecVerdict(
            kind, reason=f"{text!r} is a URL, alias, git or path reference; {_NPM_SOURCE}"
        )
    if not NPM_NAME.match(name) or len(name) > NPM_NAME_MAX_CHARS:
        return SpecVerdict("invalid", reason=f"{name!r} is not a valid npm package name")
    if at >= 0 and not NPM_RANGE.match(version):
        return SpecVerdict("invalid", reason=f"{version!r} is not an npm version or range")
    return SpecVerdict("registry", spec=PackageSpec("npm", name, text))


def _npm_source(text: str, name: str, scoped: bool) -> SourceKind | None:
    """npm's own spellings of other sources: ``user/repo`` (a GitHub repository), a slash
    where a name has none, and any ``scheme:`` the shared markers do not name."""
    if ":" in text:
        return "url"
    if name.count("/") != (1 if scoped else 0):
        return "vcs" if not scoped and name.count("/") == 1 else "path"
    return None

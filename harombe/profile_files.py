"""Reading policy profiles from disk: the shipped ones and a user's directory.

The only I/O of profiles; checking and ``extends`` are pure
(:func:`harombe.security.policy.profiles.resolve_profiles`)::

    documents = read_profile_documents(config.security.profiles.directory)
    profiles = resolve_profiles(documents)

The manager and the service load them with
:func:`harombe.security.runtime.profiled.load_profile_set` when they start: each file is read
(:func:`read_profile_files`) and resolved on its own, so a broken one is reported then
(``profile.disabled``) and disables its own profile only (and those extending it).

Rules:

* the shipped profiles are ``harombe/profiles/*.yaml`` (``minimal``, ``data-science``);
* a user directory contributes its ``*.yaml`` files (not ``.yml``, not dot files, not
  subdirectories), each one profile;
* a profile's name is its file's stem; a ``name`` key, when given, must say the same (checked
  when the profiles are resolved);
* a user profile may not take a shipped profile's name: copy-and-change is done with
  ``extends`` under a new name, so a shipped profile always means what the docs say;
* a file over :data:`MAX_PROFILE_BYTES`, not UTF-8, not YAML or not a mapping at the top is a
  :class:`~harombe.errors.ConfigError` naming the file and the fix; so is a directory that does
  not exist;
* so is anything hostile: a path that is not a regular file (a FIFO named ``x.yaml`` is never
  waited on), YAML anchors and aliases (``&a`` / ``*a``: a profile never needs them, and they
  make a few hundred bytes stand for a billion values), and nesting deeper than
  :data:`MAX_PROFILE_DEPTH` (checked on the parser's events, before anything is built).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from harombe.errors import ConfigError

log = structlog.get_logger(__name__)

#: The profiles harombe ships.
SHIPPED_DIR = Path(__file__).resolve().parent / "profiles"
#: The largest profile file read; a profile is a few dozen lines.
MAX_PROFILE_BYTES = 1024 * 1024
#: The deepest nesting of lists and mappings read; a profile needs three levels.
MAX_PROFILE_DEPTH = 32
_SUFFIX = ".yaml"
#: libyaml's loader when PyYAML has it (faster); the pure-Python one otherwise. Safe either way.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class ProfileProblem:
    """A profile file (or the directory) that cannot be used, found when profiles are loaded.

    ``profile``: the profile it disables (None when it disables none: a file taking a shipped
    profile's name, or a directory that cannot be listed). ``message`` names the host path
    (logs, the operator's terminal); ``public`` says the same with the file's name only (what a
    caller may be told)."""

    profile: str | None
    path: str
    message: str
    public: str


def read_profile_documents(
    directory: str | os.PathLike[str] | None,
) -> dict[str, dict[str, Any]]:
    """Profile name → parsed YAML mapping, for the shipped profiles and those in ``directory``
    (None: the shipped ones only). Raises :class:`ConfigError` naming the file at fault."""
    documents, problems = read_profile_files(directory)
    if problems:
        raise ConfigError(problems[0].message)
    return documents


def read_profile_files(
    directory: str | os.PathLike[str] | None,
) -> tuple[dict[str, dict[str, Any]], list[ProfileProblem]]:
    """Like :func:`read_profile_documents`, but a user file (or directory) that cannot be read
    is a :class:`ProfileProblem` instead of an error; the other files are still read."""
    documents = _read_directory(SHIPPED_DIR, "the shipped profiles")
    if directory is None:
        return documents, []
    user_dir = Path(directory).expanduser()
    problems: list[ProfileProblem] = []

    def problem(profile: str | None, path: Path, message: str) -> None:
        problems.append(ProfileProblem(profile, str(path), message, public_text(message, user_dir)))

    if not user_dir.is_dir():
        problem(
            None,
            user_dir,
            f"profiles directory {user_dir} does not exist or is not a directory; fix "
            "security.profiles.directory in the config (or set it to null)",
        )
        return documents, problems
    try:
        files = _list(user_dir, "security.profiles.directory")
    except ConfigError as err:
        problem(None, user_dir, str(err))
        return documents, problems
    for path in files:
        name = path.stem
        if name in documents:
            problem(
                None,
                path,
                f"profile file {path} is named '{name}', which harombe ships; rename the file "
                f"(e.g. '{name}-custom{_SUFFIX}') and write 'extends: {name}' in it to start "
                "from the shipped profile",
            )
            continue
        try:
            documents[name] = _read_file(path)
        except ConfigError as err:
            problem(name, path, str(err))
    log.info("profiles.read", directory=str(user_dir), profiles=sorted(documents))
    return documents, problems


def shipped_names() -> set[str]:
    """The names of the profiles harombe ships."""
    return {path.stem for path in SHIPPED_DIR.glob("*" + _SUFFIX)}


def profile_path(directory: str | os.PathLike[str], name: str) -> str:
    """The file of the user profile ``name`` in ``directory``."""
    return str(Path(directory).expanduser() / (name + _SUFFIX))


def public_text(message: str, directory: str | os.PathLike[str]) -> str:
    """``message`` with the profiles directory's host path taken out: a file is named by its
    name, the directory by its setting (what a caller may be told)."""
    where = str(Path(directory).expanduser())
    return message.replace(where + os.sep, "").replace(where, "security.profiles.directory")


def _read_directory(directory: Path, origin: str) -> dict[str, dict[str, Any]]:
    return {path.stem: _read_file(path) for path in _list(directory, origin)}


def _list(directory: Path, origin: str) -> list[Path]:
    try:
        return sorted(
            path
            for path in directory.iterdir()
            if path.suffix == _SUFFIX and not path.name.startswith(".") and not path.is_dir()
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot list the profiles in {directory} ({origin}): {exc.strerror or exc}; "
            "check that it exists and is readable"
        ) from None


def _read_file(path: Path) -> dict[str, Any]:
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"profile file {path} is not UTF-8 text; save it as UTF-8") from None
    try:
        _check_shape(path, text)
        loaded = yaml.load(text, Loader=_LOADER)  # _LOADER is a safe loader
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):
            # libyaml (0.2.6+) stops at its own depth limit while scanning ahead, before the
            # events that _check_shape counts reach ours.
            raise ConfigError(
                f"profile file {path} nests lists and mappings more than {MAX_PROFILE_DEPTH} "
                "levels deep; a profile needs three"
            ) from None
        raise ConfigError(f"profile file {path} is not valid YAML: {exc}") from None
    except (RecursionError, MemoryError) as exc:
        raise ConfigError(
            f"profile file {path} is too large or deep to read ({type(exc).__name__}); a "
            "profile is a short YAML mapping"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"profile file {path} must hold a mapping (name:, imports:, …) at the top level, "
            f"not {type(loaded).__name__}"
        )
    return loaded


def _read_bytes(path: Path) -> bytes:
    """Up to ``MAX_PROFILE_BYTES + 1`` bytes of the regular file ``path``. Opened without
    blocking, so a FIFO is refused (by fstat) instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"cannot read profile file {path}: {exc.strerror or exc}; check its permissions"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(
                f"profile file {path} is not a regular file (a FIFO, socket or device); "
                "profiles are plain YAML files: remove it or rename it"
            )
        chunks, size = [], 0
        while size <= MAX_PROFILE_BYTES and (chunk := os.read(fd, MAX_PROFILE_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read profile file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_PROFILE_BYTES:
        raise ConfigError(
            f"profile file {path} is larger than {MAX_PROFILE_BYTES} bytes; a profile is a "
            "short YAML mapping"
        )
    return b"".join(chunks)


def _check_shape(path: Path, text: str) -> None:
    """Refuse anchors, aliases and deep nesting from the parser's events, before any value
    is built (raises :class:`ConfigError`; a syntax error raises ``yaml.YAMLError``)."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError(
                f"profile file {path} uses a YAML anchor or alias (&name / *name), line "
                f"{_line(event)}; write the values out: profiles do not need them"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_PROFILE_DEPTH:
                raise ConfigError(
                    f"profile file {path} nests lists and mappings more than "
                    f"{MAX_PROFILE_DEPTH} levels deep (line {_line(event)}); a "
                    "profile needs three"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _line(event: yaml.Event) -> int:
    mark = event.start_mark
    return mark.line + 1 if mark is not None else 0

"""Reading policy profiles from disk: the shipped ones and a user's directory.

The only I/O of profiles; checking and ``extends`` are pure
(:func:`harombe.security.policy.profiles.resolve_profiles`)::

    documents = read_profile_documents(config.security.profiles.directory)
    profiles = resolve_profiles(documents)

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
  not exist.
"""

from __future__ import annotations

import os
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
_SUFFIX = ".yaml"


def read_profile_documents(
    directory: str | os.PathLike[str] | None,
) -> dict[str, dict[str, Any]]:
    """Profile name → parsed YAML mapping, for the shipped profiles and those in ``directory``
    (None: the shipped ones only). Raises :class:`ConfigError` naming the file at fault."""
    documents = _read_directory(SHIPPED_DIR, "the shipped profiles")
    if directory is None:
        return documents
    user_dir = Path(directory).expanduser()
    if not user_dir.is_dir():
        raise ConfigError(
            f"profiles directory {user_dir} does not exist or is not a directory; fix "
            "security.profiles.directory in the config (or set it to null)"
        )
    for name, document in _read_directory(user_dir, "security.profiles.directory").items():
        if name in documents:
            raise ConfigError(
                f"profile file {user_dir / (name + _SUFFIX)} is named '{name}', which harombe "
                f"ships; rename the file (e.g. '{name}-custom{_SUFFIX}') and write "
                f"'extends: {name}' in it to start from the shipped profile"
            )
        documents[name] = document
    log.info("profiles.read", directory=str(user_dir), profiles=sorted(documents))
    return documents


def _read_directory(directory: Path, origin: str) -> dict[str, dict[str, Any]]:
    try:
        files = sorted(
            path
            for path in directory.iterdir()
            if path.suffix == _SUFFIX and not path.name.startswith(".") and not path.is_dir()
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot list the profiles in {directory} ({origin}): {exc.strerror or exc}; "
            "check that it exists and is readable"
        ) from None
    return {path.stem: _read_file(path) for path in files}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read profile file {path}: {exc.strerror or exc}; check its permissions"
        ) from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ConfigError(
            f"profile file {path} is larger than {MAX_PROFILE_BYTES} bytes; a profile is a "
            "short YAML mapping"
        )
    try:
        loaded = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"profile file {path} is not UTF-8 text; save it as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile file {path} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"profile file {path} must hold a mapping (name:, imports:, …) at the top level, "
            f"not {type(loaded).__name__}"
        )
    return loaded

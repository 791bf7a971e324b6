"""Reading one value of a profile document: sizes, CPU amounts, seconds, and the shape checks
(mapping, list, known keys) whose errors name the profile, the key and the fix. Pure.

Values in error messages are shown through :func:`short`, a bounded repr: a hostile document
(a value nested thousands deep, or a list that repeats itself a billion times through YAML
aliases) is shown as a few dozen characters, never built out in memory."""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from typing import Any

from harombe.errors import ConfigError

_MEMORY = re.compile(r"(\d+)\s*(Mi|Gi|Ti)?")
_CPU = re.compile(r"(\d+)m")
_UNITS_MB = {None: 1, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
MAX_MEMORY_MB = 1024 * 1024
MAX_CPU = 1024.0
MAX_TIMEOUT_S = 3600.0
MIN_SUBPROCESS_MEMORY_MB = 64

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxfrozenset = 6
_SHORT.maxdict = 4
_SHORT.maxlong = 40


def short(value: object) -> str:
    """A repr of ``value`` of at most about 80 characters, however large or deep it is."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # noqa: BLE001 - a value's own __repr__ failing must not hide the error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def memory_mb(name: str, value: object) -> int | None:
    if value is None:
        return None
    match = _MEMORY.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        megabytes = value
    elif match:
        megabytes = int(match.group(1)) * _UNITS_MB[match.group(2)]
    else:
        raise ConfigError(
            f"profile '{name}': resources.memory {short(value)} is not a size; write e.g. 256Mi, "
            "1Gi or a whole number of MiB"
        )
    if not 1 <= megabytes <= MAX_MEMORY_MB:
        raise ConfigError(
            f"profile '{name}': resources.memory {short(value)} is out of range; use 1 MiB to 1 TiB"
        )
    return megabytes


def cpu(name: str, value: object) -> float | None:
    if value is None:
        return None
    cores: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        cores = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if match := _CPU.fullmatch(text):
            cores = int(match.group(1)) / 1000
        elif re.fullmatch(r"\d+(?:\.\d+)?", text):
            cores = float(text)
    if cores is None or not math.isfinite(cores) or not 0 < cores <= MAX_CPU:
        raise ConfigError(
            f"profile '{name}': resources.cpu {short(value)} is not a CPU amount; write e.g. 500m "
            f"(half a core) or 1 (one core), above 0 and at most {MAX_CPU:g}"
        )
    return cores


def timeout_s(name: str, value: object) -> float:
    seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise ConfigError(
            f"profile '{name}': resources.timeout_max {short(value)} is not a number of seconds "
            f"above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return seconds


def subprocess_mb(name: str, value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not MIN_SUBPROCESS_MEMORY_MB <= value <= MAX_MEMORY_MB
    ):
        raise ConfigError(
            f"profile '{name}': resources.subprocess_memory_mb {short(value)} is not a whole "
            f"number of MiB from {MIN_SUBPROCESS_MEMORY_MB} to {MAX_MEMORY_MB} (Python needs room "
            "to start)"
        )
    return value


def known_keys(name: str, prefix: str, section: Mapping[Any, Any], valid: tuple[str, ...]) -> None:
    for key in section:
        if key not in valid:
            raise ConfigError(
                f"profile '{name}': unknown key '{prefix}{key_text(key)}'; valid keys there: "
                f"{', '.join(valid)}"
            )


def key_text(key: object) -> str:
    """A key as the message shows it: a short str as is, anything else as :func:`short`."""
    return key if isinstance(key, str) and len(key) <= 60 else short(key)


def mapping(name: str, key: str, value: object) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"profile '{name}': {key} must be a mapping, not {kind(value)}")
    return value


def as_list(name: str, key: str, value: object) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"profile '{name}': {key} must be a list, not {kind(value)}")
    return list(value)


def text(name: str, key: str, value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"profile '{name}': {key} must be text, not {kind(value)}")
    return " ".join(value.split())


def kind(value: object) -> str:
    """``value``'s type and bounded repr, for "must be a list, not …" messages."""
    return f"{type(value).__name__} {short(value)}"[:100]

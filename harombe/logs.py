"""Where harombe's structured log events go.

Out of the box (structlog's own default prints every event, debug included, to *stdout*),
importing harombe configures structlog so that:

* events go to **stderr**, one line each, never into a program's stdout;
* the level is **info**: audit events (``tool.called``, ``hitl.decided``, ``egress.*``,
  ``sandbox.*``) are shown, and nothing that carries code or file contents is, because those
  are logged at debug level only (``tool.params``);
* ``HAROMBE_LOG_LEVEL=debug|info|warning|error`` changes the level;
* ``HAROMBE_LOG_JSON=/path/audit.jsonl`` also appends every event as one JSON object per line
  to that file (with ``timestamp`` in UTC ISO 8601 and ``level``).

This happens only if structlog has not been configured yet, so a program's own
``structlog.configure(...)`` is left alone (and one made after importing harombe replaces
harombe's). Setting ``HAROMBE_LOG_JSON`` or ``HAROMBE_LOG_LEVEL`` is asking for harombe's
configuration, so it is applied either way. To ask from code, in one line::

    harombe.logs.configure(json_file="audit.jsonl")
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from harombe.errors import ConfigError

LEVEL_ENV = "HAROMBE_LOG_LEVEL"
JSON_ENV = "HAROMBE_LOG_JSON"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class JsonLinesFile:
    """A structlog processor that appends each event to a file as one JSON object per line,
    then passes the event on unchanged. Safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot open the JSON log file {self.path} ({exc.strerror}); give a writable "
                f"path in {JSON_ENV} or configure(json_file=...)"
            ) from None
        self._lock = threading.Lock()

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        # ensure_ascii keeps a line valid UTF-8 whatever the event holds (lone surrogates too).
        line = json.dumps(dict(event_dict), default=str, ensure_ascii=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
        return event_dict

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _Stderr:
    """A structlog logger that writes to whatever ``sys.stderr`` is at the time of writing."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        if stream is not None:
            stream.write(message + "\n")
            stream.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _stderr_factory(*_: Any) -> _Stderr:
    return _Stderr()


def _drop(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    raise structlog.DropEvent


_json_sink: JsonLinesFile | None = None


def configure(
    *,
    level: str | None = None,
    json_file: str | os.PathLike[str] | None = None,
    stderr: bool = True,
) -> None:
    """Configure structlog for harombe's events (replacing any configuration).

    ``level``: debug, info, warning or error (default: ``$HAROMBE_LOG_LEVEL``, else info).
    ``json_file``: also append every event to this file as JSON lines (default:
    ``$HAROMBE_LOG_JSON``, else none). ``stderr=False`` keeps only the JSON file."""
    global _json_sink
    name = (level or os.environ.get(LEVEL_ENV) or "info").lower()
    if name not in LEVELS:
        raise ConfigError(f"unknown log level {name!r}; use one of {', '.join(LEVELS)}")
    target = os.environ.get(JSON_ENV) if json_file is None else json_file
    sink = JsonLinesFile(target) if target else None
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if sink is not None:
        processors.append(sink)
    processors.append(structlog.dev.ConsoleRenderer(colors=False) if stderr else _drop)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[name]),
        logger_factory=_stderr_factory,
        cache_logger_on_first_use=False,
    )
    if _json_sink is not None:
        _json_sink.close()
    _json_sink = sink


def ensure_configured() -> None:
    """harombe's defaults, unless structlog is configured already and no ``HAROMBE_LOG_*``
    variable asks for them; called when harombe is imported."""
    asked = bool(os.environ.get(JSON_ENV) or os.environ.get(LEVEL_ENV))
    if not asked and structlog.is_configured():
        return
    try:
        configure()
    except ConfigError as exc:
        # A bad variable must not make `import harombe` fail; say so where logs go.
        configure(level="info", json_file="")
        structlog.get_logger(__name__).warning("logs.config_refused", error=str(exc))

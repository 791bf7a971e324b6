"""Where harombe's structured log events go.

Out of the box structlog prints every event, debug included, to *stdout*. Importing harombe
therefore gives harombe's own loggers (those named ``harombe…``) a configuration of theirs,
and prints nothing:

* events go to **stderr**, one line each, never into a program's stdout;
* stderr shows **warnings** and errors only, so a program using harombe stays quiet;
  ``HAROMBE_LOG_LEVEL=debug|info|warning|error`` (or :func:`configure`, or the CLI's ``-v``)
  changes that level;
* ``HAROMBE_LOG_JSON=/path/audit.jsonl`` appends every event at **info** and above to that
  file as one JSON object per line (with ``timestamp`` in UTC ISO 8601 and ``level``),
  whatever stderr's level: audit events (``tool.called``, ``hitl.decided``, ``egress.*``,
  ``sandbox.*``) are info. Debug events, the only ones that carry code or file contents
  (``tool.params``), are written only when the level asked for is debug;
* loggers outside harombe keep structlog's built-in behaviour, unless harombe's configuration
  is asked for (below), which then applies to every logger.

This happens only if structlog has not been configured yet, so a program's own
``structlog.configure(...)`` is left alone (and one made after importing harombe replaces
harombe's). Setting ``HAROMBE_LOG_JSON`` or ``HAROMBE_LOG_LEVEL`` is asking for harombe's
configuration, so it is applied either way. To ask from code, in one line::

    harombe.logs.configure(json_file="audit.jsonl")
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
import threading
import unicodedata
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from harombe.errors import ConfigError

LEVEL_ENV = "HAROMBE_LOG_LEVEL"
JSON_ENV = "HAROMBE_LOG_JSON"
#: Longest value shown on the console, and longest fallback text of a value in the JSON file.
MAX_VALUE_CHARS = 4096
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: What stderr shows unless a level is asked for: a program using harombe stays quiet.
LIBRARY_LEVEL = "warning"


class JsonLinesFile:
    """A structlog processor that appends each event to a file as one JSON object per line,
    then passes the event on unchanged. Safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: IO[str] = _open_regular(self.path)
        self._lock = threading.Lock()
        self._failing = False

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        # ensure_ascii keeps a line valid UTF-8 whatever the event holds (lone surrogates too).
        line = json.dumps(dict(event_dict), default=_bounded_str, ensure_ascii=True)
        with self._lock:
            closed = self._file.closed
            if not closed:
                self._write(line)
        if closed and (current := _json_sink) is not None and current is not self:
            # Logged through a configuration replaced meanwhile (another thread's call
            # started before configure() returned): the event goes to the file now in use.
            current(logger, method_name, event_dict)
        return event_dict

    def _write(self, line: str) -> None:
        """Append ``line`` (under the lock); a failure is said once, never raised."""
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:  # full disk: never fail a call
            if not self._failing:
                _warn(
                    f"harombe: cannot write the JSON log file {self.path} ({exc}); "
                    "events are not being saved to it"
                )
            self._failing = True
        else:
            self._failing = False

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _open_regular(path: Path) -> IO[str]:
    """``path`` opened for appending, if it is (or a link to) a regular file; never blocks.

    O_NONBLOCK keeps a FIFO with no reader from hanging ``import harombe``; anything but a
    regular file (a FIFO, a device, a directory) is refused, because writes to it could block
    every later log call or fail on each one."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    fix = f"give a writable regular file in {JSON_ENV} or configure(json_file=...)"
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot open the JSON log file {path} ({exc.strerror}); {fix}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"the JSON log file {path} is not a regular file; {fix}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


def _bounded_str(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def _warn(message: str) -> None:
    with contextlib.suppress(Exception):
        if sys.stderr is not None:
            sys.stderr.write(message + "\n")


#: Control, format (bidirectional, zero-width), separator and surrogate characters: on a
#: terminal they move the cursor, recolour or reorder text, or start a fake new line.
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def escape_unsafe(text: str, *, keep: str = "") -> str:
    """``text`` with control characters (C0, DEL, C1) and invisible ones (zero-width,
    bidirectional, line separators, surrogates) escaped as ``\\x1b``, ``\\u202e``, except
    those in ``keep``: text from a caller or a sandbox, shown on a terminal, cannot move the
    cursor, recolour, reorder or hide what is around it."""
    if text.isprintable():
        return text
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if char not in keep and unicodedata.category(char) in _UNSAFE
        else char
        for char in text
    )


def _escaped(text: str) -> str:
    if len(text) > MAX_VALUE_CHARS:
        text = f"{text[:MAX_VALUE_CHARS]}…({len(text)} characters)"
    return escape_unsafe(text)


def escape_for_console(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: every value as text with control and invisible characters
    escaped (``\\x1b``, ``\\u202e``) and cut to ``MAX_VALUE_CHARS``, so no value from a
    caller can forge a log line, recolour the terminal or flood it."""
    for key, value in event_dict.items():
        if key == "exc_info":
            continue
        if isinstance(value, str):
            event_dict[key] = _escaped(value)
        elif not isinstance(value, bool | int | float | type(None)):
            # The console shows these by repr, which escapes what is unsafe; only the length
            # needs a bound.
            text = repr(value)
            if len(text) > MAX_VALUE_CHARS:
                event_dict[key] = _escaped(text)
    return event_dict


class _Stderr:
    """A structlog logger that writes to whatever ``sys.stderr`` is at the time of writing;
    the logger of every harombe module."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        if stream is not None:
            stream.write(message + "\n")
            stream.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def is_harombes(name: object) -> bool:
    """Whether a logger named ``name`` (``structlog.get_logger(__name__)``) is harombe's."""
    return isinstance(name, str) and (name == "harombe" or name.startswith("harombe."))


def _stderr_factory(*args: Any) -> _Stderr:
    return _Stderr()


def _logger_factory(*args: Any) -> Any:
    if args and is_harombes(args[0]):
        return _Stderr()
    return structlog.PrintLogger()  # structlog's own default: stdout


#: The level of each logging method's events (``exception`` logs at error).
_METHOD_LEVELS = {
    "debug": logging.DEBUG, "info": logging.INFO, "msg": logging.INFO,
    "warning": logging.WARNING, "warn": logging.WARNING, "error": logging.ERROR,
    "exception": logging.ERROR, "critical": logging.CRITICAL, "fatal": logging.CRITICAL,
}  # fmt: skip


def _at_least(threshold: int) -> Any:
    """A processor that drops events below ``threshold``."""

    def keep(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        if _METHOD_LEVELS.get(method_name, logging.INFO) < threshold:
            raise structlog.DropEvent
        return event_dict

    return keep


class _Route:
    """The one processor harombe configures: harombe's events (from a :class:`_Stderr`
    logger) go through harombe's chain, everyone else's through structlog's built-in one."""

    def __init__(self, ours: list[Any]) -> None:
        self.ours = ours
        self.theirs: list[Any] = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(),
        ]

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        result: Any = event_dict
        for processor in self.ours if isinstance(logger, _Stderr) else self.theirs:
            result = processor(logger, method_name, result)  # DropEvent: structlog drops it
        return result


def _drop(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    raise structlog.DropEvent


_json_sink: JsonLinesFile | None = None


def _level(name: str | None, default: str) -> int:
    name = (name or os.environ.get(LEVEL_ENV) or default).lower()
    if name not in LEVELS:
        raise ConfigError(f"unknown log level {name!r}; use one of {', '.join(LEVELS)}")
    return LEVELS[name]


def configure(
    *,
    level: str | None = None,
    json_file: str | os.PathLike[str] | None = None,
    stderr: bool = True,
) -> None:
    """Configure structlog for harombe's events, and every other logger's (replacing any
    configuration).

    ``level``: what stderr shows, debug, info, warning or error (default:
    ``$HAROMBE_LOG_LEVEL``, else warning). ``json_file``: also append every event at info and
    above to this file as JSON lines, whatever ``level`` is, and debug events too when
    ``level`` is debug (default: ``$HAROMBE_LOG_JSON``, else none). ``stderr=False`` keeps
    only the JSON file. Raises :class:`ConfigError` for an unknown level or a file that
    cannot be opened (the configuration is then left as it was)."""
    _configure(level=level, json_file=json_file, stderr=stderr, every_logger=True)


def _configure(
    *,
    level: str | None,
    json_file: str | os.PathLike[str] | None,
    stderr: bool,
    every_logger: bool,
) -> None:
    """:func:`configure`; unless ``every_logger``, only for harombe's loggers, the others
    keeping structlog's built-in behaviour."""
    global _json_sink
    console_level = _level(level, LIBRARY_LEVEL)
    target = os.environ.get(JSON_ENV) if json_file is None else json_file
    # The file in use is kept, not reopened, when asked for again (events logged meanwhile
    # by other threads go on to it).
    sink = _json_sink if target and _is_open(_json_sink, target) else None
    if sink is None and target:
        sink = JsonLinesFile(target)
    json_level = min(console_level, logging.INFO)
    lowest = json_level if sink is not None else console_level
    ours: list[Any] = [
        _at_least(lowest),
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if sink is not None:
        ours.append(sink)
    if stderr:
        if console_level > lowest:
            ours.append(_at_least(console_level))
        ours += [escape_for_console, structlog.dev.ConsoleRenderer(colors=False)]
    else:
        ours.append(_drop)
    structlog.configure(
        processors=ours if every_logger else [_Route(ours)],
        # Levels are filtered by the processors: the JSON file and stderr have their own.
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
        logger_factory=_stderr_factory if every_logger else _logger_factory,
        cache_logger_on_first_use=False,
    )
    previous, _json_sink = _json_sink, sink
    if previous is not None and previous is not sink:
        previous.close()


def _is_open(sink: JsonLinesFile | None, target: str | os.PathLike[str]) -> bool:
    """Whether ``sink`` writes to the file ``target`` names."""
    if sink is None:
        return False
    try:
        return os.path.samefile(sink.path, target)
    except OSError:
        return False


def ensure_configured() -> None:
    """harombe's defaults, unless structlog is configured already and no ``HAROMBE_LOG_*``
    variable asks for them; called when harombe is imported. Prints nothing unless a
    variable is refused (that is said as a ``logs.config_refused`` warning)."""
    asked = bool(os.environ.get(JSON_ENV) or os.environ.get(LEVEL_ENV))
    if not asked:
        if not structlog.is_configured():
            _configure(level=None, json_file=None, stderr=True, every_logger=False)
        return
    try:
        configure()
    except ConfigError as exc:
        # A bad variable must not make `import harombe` fail; say so where logs go.
        configure(level=LIBRARY_LEVEL, json_file="")
        structlog.get_logger(__name__).warning("logs.config_refused", error=str(exc))

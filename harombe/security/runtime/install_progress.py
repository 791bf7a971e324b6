"""Progress of an install or an environment build: one event type, one way to report it.

An :class:`InstallProgress` is the step's message as a ``str`` (so ``on_progress=print`` and
``steps.append`` keep working) that also carries its ``stage``, the ``package`` it is about and
``bytes`` where known; :meth:`InstallProgress.as_dict` is its JSON form (tool callbacks and the
service's server-sent events). Stages, in the order an install meets them:

``resolving``    a requirement is being resolved (one ``pip download`` per level of the tree)
``downloading``  a file is being downloaded (``bytes``: its size, or the bytes so far)
``unpacking``    wheels are unpacked into the install cache (or copied into the sandbox)
``compiling``    bytecode is compiled on the host
``installing``   the sandbox's own pip installs (install cache off), or npm's tree is copied
``linking``      the environment is put on the sandbox's ``sys.path``
``checking``     the set is imported once in the sandbox (NumPy and another compiled extension)
``done``         the install finished (``message`` says what was installed)

A :class:`Reporter` sends events to a sync or async callback and logs each as
``install.progressed`` (debug): build output never goes to the caller's terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import structlog

log = structlog.get_logger(__name__)

Stage = Literal[
    "resolving", "downloading", "unpacking", "compiling", "installing", "linking", "checking",
    "done",
]  # fmt: skip
STAGES: tuple[Stage, ...] = (
    "resolving",
    "downloading",
    "unpacking",
    "compiling",
    "installing",
    "linking",
    "checking",
    "done",
)


class InstallProgress(str):
    """One step of an install: its message as a string, with ``stage``, ``package`` and
    ``bytes`` (None where not known)."""

    stage: Stage
    package: str | None
    bytes: int | None

    def __new__(
        cls, message: str, *, stage: Stage, package: str | None = None, bytes: int | None = None
    ) -> InstallProgress:
        made = super().__new__(cls, message)
        made.stage, made.package, made.bytes = stage, package, bytes
        return made

    @property
    def message(self) -> str:
        return str.__str__(self)

    def as_dict(self) -> dict[str, Any]:
        """``{"stage", "package", "bytes", "message"}``: the JSON form."""
        return {
            "stage": self.stage,
            "package": self.package,
            "bytes": self.bytes,
            "message": self.message,
        }

    def __repr__(self) -> str:
        return f"InstallProgress({self.message!r}, stage={self.stage!r})"


#: What ``on_progress`` may be: called with each event; an awaitable it returns is awaited.
ProgressCallback = Callable[[InstallProgress], Awaitable[None] | None]


class Reporter:
    """Sends each event to ``callback`` (sync or async) and logs it. A callback that raises,
    or whose awaitable takes longer than :data:`CALLBACK_WAIT_S`, is logged and not called
    again: showing progress never fails or holds an install."""

    def __init__(self, callback: ProgressCallback | None = None, **context: Any) -> None:
        self._callback = callback
        self._context = context

    def with_callback(self, callback: ProgressCallback | None) -> Reporter:
        return self if callback is None else Reporter(callback, **self._context)

    async def __call__(
        self, stage: Stage, message: str, *, package: str | None = None, bytes: int | None = None
    ) -> None:
        name = None if package is None else printable(package)
        event = InstallProgress(printable(message), stage=stage, package=name, bytes=bytes)
        log.debug(
            "install.progressed",
            stage=stage,
            package=package,
            bytes=bytes,
            message=message,
            **self._context,
        )
        if self._callback is None:
            return
        try:
            answer = self._callback(event)
            if inspect.isawaitable(answer):
                # One that never finishes must not hold the install (and its lock) forever.
                await asyncio.wait_for(answer, CALLBACK_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the caller's display, not the install
            log.warning("install.progress_callback_failed", error=repr(exc)[:200])
            self._callback = None

    def threadsafe(self) -> Callable[..., None]:
        """A sync ``step(stage, message, package=None)`` for a worker thread of this loop:
        each event is sent on the loop and waited for (briefly), so they keep their order."""
        loop = asyncio.get_running_loop()

        def step(stage: Stage, message: str, package: str | None = None) -> None:
            done = asyncio.run_coroutine_threadsafe(self(stage, message, package=package), loop)
            with contextlib.suppress(Exception):
                done.result(timeout=THREAD_WAIT_S)

        return step


#: How long an async callback may take over one event before it is given up on.
CALLBACK_WAIT_S = 10.0
#: How long a worker thread waits for a progress callback before going on.
THREAD_WAIT_S = 5.0
#: Longest message or package name an event carries.
TEXT_MAX_CHARS = 500


def printable(text: str) -> str:
    """``text`` without control characters (names come from package indexes: no escape
    sequence reaches a terminal through a progress line), capped."""
    return "".join(c if c.isprintable() else "?" for c in text[:TEXT_MAX_CHARS])


#: Reports nowhere but the debug log.
SILENT = Reporter()


def human_bytes(count: int) -> str:
    """``1.5 MB``-style sizes for progress messages."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"  # pragma: no cover - the loop always returns

"""Code that runs inside the sandbox, never on the host: the supervisor (PID 1), the Python
session worker (with a policy profile's runtime layer) and the JavaScript session worker, and the
frame codec they share with the host.

The host never imports these files to run them: it sends them as source. The supervisor is one
program in several files, joined in the order of :data:`SUPERVISOR_PARTS` (``main()`` at the
end of ``supervisor.py`` runs once every part is defined) and started with
``python3 -I -S -c``; the Python worker is the wire codec, ``profile_hook.py``,
``profile_layer.py``, ``pyworker_artifacts.py`` (images a call displays) and ``pyworker.py``; the
JavaScript worker is ``jsworker.js``. They must run on the sandbox image's interpreters (Python
3.8+, Node 18+) with the standard library only. ``wire.py`` is the one file the host imports
too (``harombe.security.runtime.channel``): host, supervisor and Python worker read and write
frames with the same code.

A part uses the names of the parts before it freely, and those of later parts only inside
functions (called once all are defined); each part imports the modules it uses.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
#: The supervisor's parts, in the order they are joined.
SUPERVISOR_PARTS = (
    "wire.py",  # frames and JSON, without costly imports
    "supervisor_io.py",  # epoll selector, the frame writer to the host
    "supervisor_procs.py",  # the user's ids, child set-up, memory probes
    "supervisor_paths.py",  # the workspace walk
    "supervisor_files.py",  # read, write, list, untar
    "supervisor_artifacts.py",  # what a call leaves: changed files, images
    "supervisor_watch.py",  # inotify: the workspace walk only when events cannot tell
    "supervisor_output.py",  # output mode "llm": head, tail, the saved full text
    "supervisor_runs.py",  # fresh-process runs, output capture, the sweep
    "supervisor_workers.py",  # session interpreters
    "supervisor_sessions.py",  # calls on session interpreters
    "supervisor.py",  # the main loop and request dispatch; main() runs here
)
#: The Python session worker's parts (the profile's runtime layer is applied by the worker).
PY_WORKER_PARTS = (
    "wire.py",
    "profile_hook.py",
    "profile_layer.py",
    "pyworker_artifacts.py",
    "pyworker.py",
)
#: The parts the workspace file operations need, for running them on the host (tests).
FILE_PARTS = ("supervisor_paths.py", "supervisor_files.py")


def joined(parts: tuple[str, ...]) -> str:
    """The source of ``parts`` of this folder, joined in order."""
    return "\n\n".join((HERE / name).read_text(encoding="utf-8") for name in parts)


def load(parts: tuple[str, ...], name: str = "harombe_guest") -> ModuleType:
    """Run ``parts`` on the host as one module, as the sandbox joins them, and return it.

    For tests: a part that uses an earlier part's names cannot be imported on its own. What
    runs only as the supervisor (``if __name__ == "__main__"``) does not run here."""
    module = ModuleType(name)
    exec(compile(joined(parts), f"<{name}>", "exec"), module.__dict__)
    return module


PY_WORKER_SOURCE = joined(PY_WORKER_PARTS)
SUPERVISOR_SOURCE = f"PY_WORKER_SOURCE = {PY_WORKER_SOURCE!r}\n\n" + joined(SUPERVISOR_PARTS)
JS_WORKER_SOURCE = (HERE / "jsworker.js").read_text(encoding="utf-8")
#: The runtime layer of a policy profile (a part of ``PY_WORKER_SOURCE``).
PROFILE_LAYER_SOURCE = (HERE / "profile_layer.py").read_text(encoding="utf-8")
#: The environment variable that carries a profile's runtime spec (JSON) to the worker.
PROFILE_ENV = "HAROMBE_PROFILE"

__all__ = [
    "JS_WORKER_SOURCE",
    "PROFILE_ENV",
    "PROFILE_LAYER_SOURCE",
    "PY_WORKER_SOURCE",
    "SUPERVISOR_SOURCE",
    "load",
]

"""Code that runs inside the sandbox, never on the host: the supervisor (PID 1), the Python
session worker and the JavaScript session worker.

The host never imports these files to run them: it sends them as source. The supervisor is one
program in several files, joined in the order below (``main()`` at the end of ``supervisor.py``
runs once every part is defined) and started with ``python3 -I -S -c``; the Python worker is the
wire codec plus ``pyworker.py``; the JavaScript worker is ``jsworker.js``. They must run on the
sandbox image's interpreters (Python 3.8+, Node 18+) with the standard library only.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
#: The supervisor's parts, in the order they are joined.
SUPERVISOR_PARTS = (
    "supervisor_io.py",
    "supervisor_files.py",
    "supervisor_runs.py",
    "supervisor_sessions.py",
    "supervisor.py",
)
#: The Python session worker's parts.
PY_WORKER_PARTS = ("supervisor_io.py", "pyworker.py")


def joined(parts: tuple[str, ...]) -> str:
    """The source of ``parts`` of this folder, joined in order."""
    return "\n\n".join((HERE / name).read_text(encoding="utf-8") for name in parts)


PY_WORKER_SOURCE = joined(PY_WORKER_PARTS)
SUPERVISOR_SOURCE = f"PY_WORKER_SOURCE = {PY_WORKER_SOURCE!r}\n\n" + joined(SUPERVISOR_PARTS)
JS_WORKER_SOURCE = (HERE / "jsworker.js").read_text(encoding="utf-8")

__all__ = ["JS_WORKER_SOURCE", "PY_WORKER_SOURCE", "SUPERVISOR_SOURCE"]

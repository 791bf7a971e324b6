"""``harombe serve``: harombe over HTTP.

Three faces on one FastAPI app, over the same :class:`~harombe.tools.code_execution.
CodeExecutionTools`, gate and sandbox manager as the library:

* the fips-agents sidecar contract — ``GET /healthz``, ``GET /profile``, ``POST /execute`` —
  each run in a fresh gVisor sandbox from the warm pool (:mod:`.fips`);
* a REST API under ``/v1`` for the full tool set: sandboxes, execute (JSON or server-sent
  events), installs, files, approvals, health and version (:mod:`.v1`, :mod:`.v1_files`);
* an approvals page at ``/approvals`` where a person decides held calls (:mod:`.approvals`).

Callers authenticate with bearer tokens (:mod:`.auth`); each sandbox belongs to the token that
made it. :func:`create_app` builds the app; :mod:`.serve` runs it.
"""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: ``harombe --help`` and the other commands do not pay for importing FastAPI.
    if name == "create_app":
        from harombe.service.app import create_app

        return create_app
    raise AttributeError(name)

"""Public face of the Docker seam (the usage guide's ``harombe.security.docker_manager``).

The implementation, and the :class:`DockerBackend` protocol it satisfies, live in
:mod:`harombe.security.runtime.docker`.
"""

from __future__ import annotations

from harombe.security.runtime.docker import (
    AttachedStdio,
    ContainerInfo,
    DockerManager,
    settle,
    translate,
)

__all__ = ["AttachedStdio", "ContainerInfo", "DockerManager", "settle", "translate"]

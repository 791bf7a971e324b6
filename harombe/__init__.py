"""harombe: run LLM-written code in gVisor sandboxes, behind a human-in-the-loop risk gate."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from harombe import logs as _logs

# harombe's loggers to stderr at warning (silent), unless structlog is configured already;
# HAROMBE_LOG_JSON / HAROMBE_LOG_LEVEL are applied either way. Prints nothing.
_logs.ensure_configured()

#: Public names imported on first use (``harombe.run_sandboxed``): ``import harombe`` stays light.
_LAZY = {
    "run_sandboxed": "harombe.mounts",
    "run_sandboxed_async": "harombe.mounts",
    "MountLimits": "harombe.mounts",
    "sandbox": "harombe.decorator",
    "sandbox_async": "harombe.decorator",
}

if TYPE_CHECKING:  # what type checkers see of the lazy names
    from harombe.decorator import sandbox as sandbox
    from harombe.decorator import sandbox_async as sandbox_async


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harombe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

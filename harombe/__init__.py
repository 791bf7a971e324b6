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
    "RunResult": "harombe.mounts_compat",
    "SandboxConfig": "harombe.mounts_compat",
    "get_default_sandbox_config": "harombe.mounts_compat",
}
#: Every error, as pctx-sandbox users import them: ``from harombe import SandboxExecutionError``.
_ERRORS = (
    "HarombeError",
    "ConfigError",
    "UsageError",
    "InvalidArgumentError",
    "UnknownToolError",
    "FileError",
    "MountError",
    "InfrastructureError",
    "DockerUnavailableError",
    "RuntimeNotAvailableError",
    "InsecureRuntimeError",
    "ImageNotFoundError",
    "BuildError",
    "SandboxStartError",
    "SandboxStartupError",
    "SandboxLostError",
    "LimitNotAppliedError",
    "PackageFetchError",
    "PackageNotFoundError",
    "SandboxExecutionError",
    "SandboxTimeoutError",
    "SerializationError",
    "DependencyInstallError",
    "SandboxNotFoundError",
    "PolicyError",
    "WorkspacePathError",
    "PackageSpecError",
    "ApprovalDeniedError",
    "GuardrailError",
)
_LAZY.update(dict.fromkeys(_ERRORS, "harombe.errors"))
#: ``from harombe import *``: the public names (imported then), not the package's internals.
__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # what type checkers see of the lazy names
    from harombe.decorator import sandbox as sandbox
    from harombe.decorator import sandbox_async as sandbox_async
    from harombe.errors import *  # noqa: F403
    from harombe.mounts import run_sandboxed as run_sandboxed
    from harombe.mounts import run_sandboxed_async as run_sandboxed_async
    from harombe.mounts_compat import RunResult as RunResult
    from harombe.mounts_compat import SandboxConfig as SandboxConfig
    from harombe.mounts_compat import get_default_sandbox_config as get_default_sandbox_config


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harombe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

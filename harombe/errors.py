"""Every exception harombe raises, and nothing else.

Errors of the Docker SDK and of the daemon's socket are mapped to these in one place: the
Docker backend (``harombe.security.runtime.docker``'s ``ERROR_TABLE``, by type, and its socket
helper ``docker_socket``). Other foreign errors — a config file that cannot be read, a cgroup
that cannot be written, a download tool that fails — are mapped where they arise. Each
message says what went wrong *and* how to fix it.

User code that fails (non-zero exit, exception, timeout, out of memory) is never an exception: it
comes back as data in the result. Only infrastructure faults, policy refusals and misuse raise::

    HarombeError
     ├── ConfigError                   bad YAML, unknown key, bad value, bad environment override
     ├── UsageError                    misuse of the API: manager not started, unknown language
     │    ├── InvalidArgumentError     a tool argument of the wrong type, size or form
     │    ├── UnknownToolError         a tool call names no harombe tool (dispatch, MCP)
     │    ├── FileError                a file operation failed in the sandbox: missing, not a dir
     │    └── MountError               a host directory for /mnt: a link in it, over a limit
     ├── InfrastructureError           the machine is not ready or broke underneath us
     │    ├── DockerUnavailableError   daemon unreachable, or a Docker call failed
     │    ├── RuntimeNotAvailableError runsc (or the chosen runtime) is not registered with Docker
     │    ├── InsecureRuntimeError     a non-gVisor runtime was chosen without opting in
     │    ├── ImageNotFoundError       the sandbox image is not present locally
     │    ├── BuildError               the sandbox image could not be built
     │    ├── SandboxStartError        the container started but its supervisor never answered
     │    │    └── SandboxStartupError  a ``@sandbox`` call got no sandbox (Docker, runtime,
     │    │                             image or manager not usable; the cause is chained)
     │    ├── SandboxLostError         the sandbox died (killed, out of memory, supervisor gone)
     │    ├── LimitNotAppliedError     a limit could not be set on a running sandbox's cgroup
     │    └── PackageFetchError        the host could not download a package for installation
     │         └── PackageNotFoundError  the index answered, and has no installable version
     ├── SandboxExecutionError         a ``@sandbox`` function raised in its sandbox, or died there
     │    └── SandboxTimeoutError      … or ran past its ``timeout_sec`` (also a TimeoutError)
     ├── SerializationError            a ``@sandbox`` function, its arguments or its return value
     │                                 cannot cross: unpicklable arguments, over the size cap, a
     │                                 return type the host will not rebuild, another Python
     │                                 version inside
     ├── DependencyInstallError        a ``@sandbox`` dependency is malformed or did not install
     ├── SandboxNotFoundError          unknown, destroyed or malformed sandbox id
     └── PolicyError                   refused on purpose; nothing was touched
          ├── WorkspacePathError       path escapes /workspace (.., absolute, symlink out)
          ├── PackageSpecError         not a plain registry package spec, or unknown registry
          ├── ApprovalDeniedError      a human (or an approver) said no, or did not answer in time
          └── GuardrailError           a profile's scan refused the code (its ``violations``)

A few exceptions are signals inside one module and never leave it
(``tests/unit/test_architecture.py`` keeps their list; each module's tests show them caught):
the wire codec's ``ProtocolError`` (the channel ends: ``SandboxLostError``), the analyzers'
``JSSyntaxError`` / ``ShellSyntaxError`` (code that does not parse is a CRITICAL finding), the
egress proxy's ``Refused`` / ``BadRequest`` (an HTTP refusal to the sandbox) and ``_Stalled`` (a
tunnel closed), and the guest's own (``Refused``, ``Violation``: error replies inside the
sandbox).
"""

from __future__ import annotations


class HarombeError(Exception):
    """Base of every harombe error; ``str(err)`` is a complete, actionable sentence."""

    @property
    def kind(self) -> str:
        """The class name, used as the ``error`` prefix in tool results."""
        return type(self).__name__


class ConfigError(HarombeError, ValueError):
    """Configuration could not be loaded or validated."""


class UsageError(HarombeError):
    """The API was called in a way it does not support."""


class InvalidArgumentError(UsageError, ValueError):
    """A tool argument cannot be read unambiguously; the message names it and the fix."""


class UnknownToolError(UsageError):
    """A tool call named a tool that does not exist; the message lists the tools."""


class FileError(UsageError):
    """A file operation inside the sandbox failed: no such file, not a directory, too large…"""


class MountError(UsageError):
    """A run with a host directory cannot copy it in or its changes back (a link or special
    file in it, over a size limit, the directory replaced during the run)."""


class InfrastructureError(HarombeError):
    """Docker, gVisor or a sandbox is not in a usable state."""


class DockerUnavailableError(InfrastructureError):
    """The Docker daemon cannot be reached, or a Docker call failed."""


class RuntimeNotAvailableError(InfrastructureError):
    """The configured OCI runtime is not registered with the Docker daemon."""


class InsecureRuntimeError(InfrastructureError):
    """A runtime other than gVisor was configured without ``allow_insecure_runtime``."""


class ImageNotFoundError(InfrastructureError):
    """A sandbox image is not present in the local Docker image store."""


class BuildError(InfrastructureError):
    """The sandbox image could not be built (Docker build failed or the result is unusable)."""


class SandboxStartError(InfrastructureError):
    """A sandbox container was created but did not come up."""


class SandboxStartupError(SandboxStartError):
    """A ``@sandbox`` call could not get a sandbox: Docker, the runtime, the image or the
    manager is not usable. A :class:`SandboxStartError` (catching that catches this too); the
    harombe error that caused it is chained as ``__cause__``."""


class SandboxLostError(InfrastructureError):
    """A sandbox died underneath a call; its state is gone."""


class LimitNotAppliedError(InfrastructureError):
    """A resource limit could not be applied to a running sandbox (its host cgroup)."""


class PackageFetchError(InfrastructureError):
    """The host-side package download failed (package missing, registry unreachable)."""


class PackageNotFoundError(PackageFetchError):
    """The package index was reached and has no version of the package that fits the request
    and the sandbox: the request, not the index, needs changing."""


class SandboxExecutionError(HarombeError):
    """A ``@sandbox`` function raised inside its sandbox (or the sandbox ended it: out of
    memory, its process gone). ``str(err)`` is ``"{type}: {message}\n{traceback}"``;
    ``error_type`` is the remote exception's class name (``"MemoryError"`` when the sandbox's
    memory limit ended the call) and ``traceback_str`` the remote traceback as text."""

    def __init__(self, message: str, *, error_type: str = "", traceback_str: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.traceback_str = traceback_str


class SandboxTimeoutError(SandboxExecutionError, TimeoutError):
    """A ``@sandbox`` function ran past its ``timeout_sec`` and was stopped."""


class SerializationError(HarombeError):
    """A ``@sandbox`` call's function, arguments or return value could not cross into or out
    of the sandbox; the message names the value's type and what to do instead."""


class DependencyInstallError(HarombeError):
    """A ``@sandbox`` dependency is not a plain pip requirement, or did not install; the
    message names the package."""


class SandboxNotFoundError(HarombeError, KeyError):
    """No live sandbox has this id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "sandbox not found"


class PolicyError(HarombeError):
    """A request was refused by policy; nothing was executed or changed."""


class WorkspacePathError(PolicyError, ValueError):
    """A file path leaves ``/workspace`` or is otherwise unacceptable."""


class PackageSpecError(PolicyError, ValueError):
    """A package spec is not a plain registry requirement, or names an unknown registry."""


class ApprovalDeniedError(PolicyError):
    """The HITL gate denied the operation (explicitly or by timeout)."""


class GuardrailError(PolicyError):
    """A policy profile's scan refused the code before anyone was asked or anything ran.

    ``violations`` are the scan's findings (``"Line N: ..."``), ``stage`` the scan stage that
    reported them and ``profile`` the profile's name."""

    def __init__(
        self, message: str, *, violations: tuple[str, ...] = (), stage: str = "", profile: str = ""
    ) -> None:
        super().__init__(message)
        self.violations = violations
        self.stage = stage
        self.profile = profile

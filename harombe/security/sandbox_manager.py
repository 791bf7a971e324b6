"""Public face of sandbox lifecycle and operations (the usage guide's
``harombe.security.sandbox_manager``).

The manager lives in :mod:`harombe.security.runtime.manager`; the records it returns in
:mod:`harombe.security.runtime.sandbox`.
"""

from __future__ import annotations

from harombe.security.runtime.files import DirListing
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.sandbox import ExecutionResult, Sandbox

__all__ = ["DirListing", "ExecutionResult", "Sandbox", "SandboxManager"]

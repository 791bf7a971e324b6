"""Paths in Python code: deletes outside the workspace, writes to kernel, device and system
files, and scripts written from fixed text (analyzed in their own language). Used by the
Python analyzer, which hands it its name resolution and the way to report a finding."""

from __future__ import annotations

import ast
from collections.abc import Callable

from harombe.security.policy.code_risk import analyze_code, language_for_path, normalize_path
from harombe.security.policy.code_risk.python_names import (
    DELETERS,
    MOVERS,
    PATH_CLASSES,
    PATH_DELETERS,
    PATH_WRITERS,
)
from harombe.security.policy.code_risk.python_resolve import NameResolver, argument, const_str

#: Device and kernel files a write to which is never data processing.
_SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/shm/")
_KERNEL_PATHS = ("/dev/", "/proc/", "/sys/")
#: Directories a write into which changes the system rather than data.
_SYSTEM_DIRS = ("/etc/", "/bin/", "/sbin/", "/usr/", "/lib/", "/lib64/", "/boot/", "/root/",
                "/var/", "/opt/")  # fmt: skip
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_APPEND", "O_CREAT", "O_TRUNC"}


class PathChecks:
    """Checks on calls that touch literal paths, for one analysis: ``names`` resolves what a
    call's function is, ``report(node, construct, detail)`` records a finding, and ``depth``
    is how deep in scripts written by scripts the analysis is."""

    def __init__(
        self, names: NameResolver, report: Callable[[ast.AST, str, str], None], depth: int
    ) -> None:
        self.names = names
        self.report = report
        self.depth = depth
        #: Names bound by ``with open(<literal path>, …) as f``: the path each writes to.
        self.file_paths: dict[str, str] = {}

    def opened_path(self, node: ast.AST) -> str | None:
        """The literal path a file object was opened on: ``open("x.sh", "w")``,
        ``Path("x.sh").open("w")``, or a name bound by ``with … as f``."""
        if isinstance(node, ast.Name):
            return self.file_paths.get(node.id)
        if not isinstance(node, ast.Call):
            return None
        if (isinstance(node.func, ast.Name) and node.func.id == "open") or self.names.qualname(
            node.func
        ) in ("io.open", "codecs.open"):
            return const_str(argument(node, 0, "file"))
        if isinstance(node.func, ast.Attribute) and node.func.attr == "open":
            return self.literal_path(node.func.value)
        return None

    def check_written_script(self, node: ast.Call) -> None:
        """A script written from fixed text (``open("x.sh", "w").write("…")``,
        ``Path("m.py").write_text("…")``) is analyzed in its language: running or importing it
        later runs exactly that text."""
        if not isinstance(node.func, ast.Attribute) or node.func.attr not in (
            "write", "write_text", "writelines",
        ):  # fmt: skip
            return
        content = const_str(argument(node, 0, "data"))
        if content is None:
            return
        target = node.func.value
        writes_text = node.func.attr == "write_text"
        path = self.literal_path(target) if writes_text else self.opened_path(target)
        language = language_for_path(path, content) if path else None
        if path and language:
            for f in analyze_code(language, content, depth=self.depth + 1):
                self.report(node, f.construct, f"in the script written to {path}: {f.detail}")

    def literal_path(self, node: ast.AST | None) -> str | None:
        """A path written as a literal: ``'/etc/x'`` or ``Path('/etc/x')``."""
        if (text := const_str(node)) is not None:
            return text
        if (
            isinstance(node, ast.Call)
            and node.args
            and self.names.qualname(node.func) in PATH_CLASSES
        ):
            return const_str(node.args[0])
        return None

    def check_paths(self, node: ast.Call, func: str | None) -> None:
        """Deletes outside the workspace, writes to kernel, device and system files, whether
        by function (``os.remove``, ``open``, ``os.open``) or by a path object's method."""
        if func in MOVERS:
            path = self.literal_path(argument(node, 0, "src"))
            if path is not None and is_system_path(path) and path.startswith(_SYSTEM_DIRS):
                self.report(node, "delete", f"{func}() moves {path!r} away")
        if func in DELETERS:
            path = self.literal_path(argument(node, 0, "path"))
            if path is not None and is_system_path(path):
                self.report(node, "delete", f"{func}() deletes {path!r}")
        writing, path = False, None
        if (isinstance(node.func, ast.Name) and node.func.id == "open") or func in (
            "io.open", "codecs.open",
        ):  # fmt: skip
            path = const_str(argument(node, 0, "file"))
            writing = writes(const_str(argument(node, 1, "mode")) or "r")
        elif func == "os.truncate":
            path, writing = const_str(argument(node, 0, "path")), True
        elif func == "os.open":
            path = const_str(argument(node, 0, "path"))
            flags = argument(node, 1, "flags")
            writing = flags is not None and any(
                (isinstance(n, ast.Attribute) and n.attr in _WRITE_FLAGS)
                or (isinstance(n, ast.Name) and n.id in _WRITE_FLAGS)
                for n in ast.walk(flags)
            )
        elif isinstance(node.func, ast.Attribute):
            path = self.literal_path(node.func.value)
            method = node.func.attr
            if path is not None and method in PATH_DELETERS and is_system_path(path):
                self.report(node, "delete", f"Path.{method}() deletes {path!r}")
            writing = method in PATH_WRITERS or (
                method == "open" and writes(const_str(argument(node, 0, "mode")) or "r")
            )
        if not (path and writing):
            return
        path = normalize_path(path)
        if path.startswith(_KERNEL_PATHS) and not path.startswith(_SAFE_DEVICES):
            self.report(node, "device-write", f"writes to the kernel or device file {path}")
        elif path.startswith(_SYSTEM_DIRS):
            self.report(node, "system-write", f"writes to the system file {path}")


def writes(mode: str) -> bool:
    """Whether ``open()`` with ``mode`` writes."""
    return any(flag in mode for flag in "wax+")


def is_system_path(path: str) -> bool:
    """``path`` is the root, the home or a parent directory, or outside ``/workspace`` and
    ``/tmp``."""
    stripped = normalize_path(path).rstrip("/") or "/"
    if stripped in ("/", "~", ".", "..") or stripped.startswith(("~/", "../")):
        return True
    return stripped.startswith("/") and not stripped.startswith(("/workspace/", "/tmp/"))

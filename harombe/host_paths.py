"""Taking this host's paths out of text a caller is shown.

An error a caller sees (a tool result's ``error``, a ``/v1`` problem, a fips ``/execute``
error, an MCP error) may quote a path of the host: the install cache, the profiles directory,
a download's temporary directory, Python's own files in a tool's traceback. None of those is
the caller's business, so :func:`scrub_host_paths` replaces each such path with a label
(``<install cache>``, ``<python>``, ``<home>``, …) at the places where errors leave harombe;
host-side logs keep the paths.

Paths inside a sandbox (``/workspace/…``) are left alone. Under the host's temporary directory
only what is the host's is replaced: entries that exist there, and names harombe, pip and
``tempfile`` give their directories (``harombe-…``, ``pip-…``, ``tmp…``), so a ``/tmp/x`` that
only names a sandbox's file stays as written.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

#: Characters that end a path quoted in a message.
_END = r"""\s'"`:;,()\[\]<>{}"""
#: Roots never treated as the host's: the sandbox's own paths start with them.
_NOT_HOST = frozenset({"/", "/workspace", "/mnt", "/tmp", "/home", "/usr", "/opt", "/var"})
#: Names under the temporary directory that are the host's even once removed.
_TEMP_NAMES = ("harombe", "pip-", "tmp")


#: Directories of this process's configuration (the install cache, the profiles directory),
#: added by the parts that use them: label by directory.
_REMEMBERED: dict[str, str] = {}


def remember_host_path(label: str, directory: str | os.PathLike[str] | None) -> None:
    """Have :func:`scrub_host_paths` replace ``directory`` (and what is under it) by ``label``
    from now on; None is ignored."""
    if directory is not None:
        _REMEMBERED[os.fspath(directory)] = label


def scrub_host_paths(text: str) -> str:
    """``text`` with every path of this host replaced by a label (see the module docstring)."""
    if "/" not in text:
        return text
    remembered = [(label, path) for path, label in list(_REMEMBERED.items())]
    for label, root in _roots(remembered):
        text = re.sub(re.escape(root) + rf"(?![^/{_END}])[^{_END}]*", label, text)
    temp = os.path.normpath(tempfile.gettempdir())
    if temp != "/":
        text = re.sub(re.escape(temp) + rf"/([^/{_END}]+)[^{_END}]*", _temp_label(temp), text)
    return text


def _roots(extra: Iterable[tuple[str, str | os.PathLike[str] | None]]) -> list[tuple[str, str]]:
    """(label, root) pairs, longest root first, each root also in its resolved form."""
    pairs: list[tuple[str, str | os.PathLike[str] | None]] = [*extra]
    pairs += [("<harombe>", Path(__file__).resolve().parent.parent)]
    pairs += [("<python>", p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    pairs += [("<python>", p) for p in sysconfig.get_paths().values()]
    pairs += [("<python>", p) for p in [*site.getsitepackages(), site.getusersitepackages()]]
    pairs += [("<home>", Path.home()), ("<cwd>", _cwd())]
    pairs += [("<docker socket>", p) for p in ("/var/run/docker.sock", "/run/docker.sock")]
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://"):
        pairs.append(("<docker socket>", docker_host.removeprefix("unix://")))
    found: dict[str, str] = {}
    for label, root in pairs:
        if root is None:
            continue
        for form in {_clean(os.fspath(root)), _clean(os.path.realpath(root))}:
            if form and form not in found:
                found[form] = label
    return sorted(((label, root) for root, label in found.items()), key=lambda p: -len(p[1]))


def _clean(path: str) -> str | None:
    """``path`` without a trailing ``/``, or None when it is not one of the host's own."""
    path = os.path.normpath(os.path.expanduser(path)) if path else ""
    if not path.startswith("/") or path in _NOT_HOST:
        return None
    return path


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the working directory was removed
        return None


def _temp_label(temp: str) -> Callable[[re.Match[str]], str]:
    def label(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith(_TEMP_NAMES) or os.path.lexists(os.path.join(temp, name)):
            return "<tmp>"
        return match.group(0)

    return label

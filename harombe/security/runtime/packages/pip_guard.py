"""The guard pip runs under on the host: a script for ``python -I -S -c``.

It installs an audit hook in pip's own process before pip is imported, so that whatever an
index serves, pip cannot start a program (builds and VCS checkouts are subprocesses), import a
build tool, or read a file outside its work directory, its own code, the system's (``/usr``,
``/etc``, …) and the local sources the configuration names; and it caps pip's address space.
``-I -S`` keep the work directory, ``PYTHON*`` variables, ``.pth`` files and
``sitecustomize`` out of the interpreter. Used by :mod:`harombe.security.runtime.packages.pypi`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

from harombe.errors import PackageFetchError

#: Address space of the guarded pip (a zip with millions of members must not exhaust the host).
PIP_MEMORY_MAX_BYTES = 4 << 30
GUARD_MARK = "harombe-guard-refused"
#: Printed (with the host) when pip asks a host ``HAROMBE_ALLOWED_HOSTS`` does not list.
HOST_MARK = "harombe-host-refused"

#: With ``HAROMBE_ALLOWED_HOSTS`` set (host names, space-separated), every HTTP request pip
#: sends to another host is refused before it leaves (:data:`HOST_MARK` and the host).
#: Runs pip with an audit hook that refuses to start programs (pip builds and VCS checkouts are
#: always subprocesses), import build tools, or read files outside its own directory, its own
#: code, the system's (/usr, /etc, …) and the local sources the configuration names (an index
#: page linking ``file:///…`` must not make pip copy a host file into the sandbox). The
#: refusal is an OSError, which pip and its vendored libraries catch around their optional
#: probes (`rustc --version`, `lsb_release`); anything else pip needed fails the download.
#: Started with ``-I -S``: sys.path is the standard library plus argv[1], a directory that
#: holds pip and nothing else, so no build backend is even on the path.
PIP_GUARD = f"""
import sys
_BUILD_TOOLS = frozenset(("setuptools", "distutils", "_distutils_hack", "pkg_resources",
    "wheel", "hatchling", "flit_core", "poetry", "pdm", "maturin", "mesonpy",
    "scikit_build_core", "Cython", "pbr", "sipbuild", "enscons", "pyproject_hooks", "build"))
_SPAWN = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "os.fork", "os.forkpty", "pty.spawn"))
import os
_CWD = os.getcwd()
_ROOTS = [_CWD, sys.argv[1], os.path.realpath(os.path.join(sys.argv[1], "pip")), sys.prefix,
    sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr", "/etc", "/dev", "/proc",
    "/sys", "/lib", "/lib64"]
for _key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT",
             "PIP_CLIENT_CERT", "PIP_CONSTRAINT",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
    for _value in os.environ.get(_key, "").split():
        if _value.startswith("file:") or "://" not in _value:
            _path = _value[5:] if _value.startswith("file:") else _value
            # A local index's pages link to files beside its pages (``../files/x.whl``).
            _ROOTS.append(os.path.dirname(os.path.normpath(_path)) if "INDEX" in _key else _path)
_ROOTS = tuple(r for r in {{os.path.normpath(r) for r in _ROOTS if r}} if r not in ("/", "//"))
def _local(path):
    if isinstance(path, int):
        return
    path = os.path.normpath(os.path.join(_CWD, os.fsdecode(path)))
    if not any(path == r or path.startswith(r + "/") for r in _ROOTS):
        raise PermissionError("{GUARD_MARK}: pip tried to read %s, a host file outside its "
                              "directory and the configured sources" % (path,))
def _guard(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
        _local(args[0])
    if event == "shutil.copyfile":
        _local(args[0])
    if event in _SPAWN:
        raise PermissionError("{GUARD_MARK}: pip tried to start a program (%s %r)"
                              % (event, args[:2]))
    if event == "import" and str(args[0]).split(".")[0] in _BUILD_TOOLS:
        raise ImportError("{GUARD_MARK}: pip tried to import the build tool %s" % (args[0],))
import resource
resource.setrlimit(resource.RLIMIT_AS, ({PIP_MEMORY_MAX_BYTES}, {PIP_MEMORY_MAX_BYTES}))
sys.addaudithook(_guard)
sys.path.insert(0, sys.argv.pop(1))
_HOSTS = frozenset(os.environ.pop("HAROMBE_ALLOWED_HOSTS", "").split())
if _HOSTS:
    # Every request pip sends (index pages, files, redirects) goes through PipSession.send.
    from urllib.parse import urlsplit as _split
    from pip._internal.network.session import PipSession as _Session
    _send = _Session.send
    def _checked_send(self, request, **kwargs):
        _url = _split(request.url)
        _host = (_url.hostname or "").lower()
        if _url.scheme in ("http", "https") and _host not in _HOSTS:
            raise PermissionError("{HOST_MARK}: %s is not an allowed download host" % (_host,))
        return _send(self, request, **kwargs)
    _Session.send = _checked_send
import runpy
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


#: How the guarded pip learns the hosts it may download from (space-separated).
ALLOWED_HOSTS_ENV = "HAROMBE_ALLOWED_HOSTS"


def check_index_hosts(env: Mapping[str, str], allowed_hosts: Collection[str]) -> None:
    """Every http(s) source in ``env`` (index, extra indexes, find-links) is on an allowed
    host; local sources are not downloads. Raises :class:`PackageFetchError` naming the host."""
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        for value in env.get(name, "").split():
            if not value.lower().startswith(("http://", "https://")):
                continue
            try:
                host = (urlsplit(value).hostname or "").lower()
            except ValueError:
                host = ""
            if host not in allowed_hosts:
                raise host_refused(host, "pypi", what=f"the package index {host} (pip's {name})")


def host_refused(host: str, registry: str, *, what: str) -> PackageFetchError:
    """The error of a download from a host ``network.allowed_registries`` does not list."""
    shown = host or "its host"
    return PackageFetchError(
        f"{what} is not an allowed download host: security.sandbox.network."
        f"allowed_registries.{registry} lists the hosts installs may download from, and "
        f"{shown} is not one of them; add {shown} to allowed_registries.{registry} if it is "
        "a registry you trust, or point this machine's configuration at an allowed one"
    )

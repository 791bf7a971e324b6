"""PyPI downloads on the host in which no package code can run.

pip's resolver acts on whatever a wheel's metadata says: a ``Requires-Dist`` of the form
``name @ https://…/x.tar.gz`` or ``name @ git+…`` makes it fetch and *build* that source tree
on the host while resolving — ``--only-binary=:all:`` does not apply to direct references. So
pip never resolves here. harombe resolves itself, one level at a time:

1. pip downloads exact registry requirements with ``--no-deps --only-binary=:all:`` for the
   sandbox's interpreter and platform — a plain name can only ever select a wheel, and pip
   reads no dependency metadata at all;
2. harombe reads each wheel's ``METADATA`` as data (zip member, size-capped, :mod:`.wheels`)
   and refuses the whole install if any ``Requires-Dist`` is a direct URL, VCS or path
   reference — whether or not its marker or extra applies — naming the distribution and the
   requirement;
3. the ``Requires-Dist`` lines that apply to the sandbox (markers evaluated for its Python and
   platform, extras as requested) become the next level's requirements.

pip runs under :class:`~.fetch_runner.FetchArea` (unprivileged, private
home) inside a guard that refuses, in-process, to start any program or import any build tool,
so even a pip that wanted to build could not. The final install inside the sandbox uses pip's
real resolver, offline, over the wheels fetched here.

pip downloads from this machine's pip configuration (index URLs, proxies, certificates), unless
``index_urls`` are given (``security.sandbox.network.allowed_registries.pypi``): then from
those alone, the first as the index and the others as extra indexes.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from harombe.errors import PackageFetchError, PackageNotFoundError
from harombe.security.runtime.install_progress import SILENT, Reporter
from harombe.security.runtime.packages.fetch_runner import (
    FILE_MAX_BYTES,
    FetchArea,
    Identity,
    base_env,
    tail,
)
from harombe.security.runtime.packages.pip_guard import ALLOWED_HOSTS_ENV, HOST_MARK, host_refused
from harombe.security.runtime.packages.pip_guard import GUARD_MARK as GUARD_MARK
from harombe.security.runtime.packages.pip_guard import PIP_GUARD as PIP_GUARD
from harombe.security.runtime.packages.pip_guard import check_index_hosts as check_index_hosts
from harombe.security.runtime.packages.pip_progress import on_pip_line, ticking
from harombe.security.runtime.packages.pip_progress import pip_download_line as pip_download_line
from harombe.security.runtime.packages.wheels import Target as Target  # resolve()'s argument
from harombe.security.runtime.packages.wheels import (
    Want,
    Wheel,
    collect_wheels,
    numpy_1_builds,
    stale,
    wanted,
)

log = structlog.get_logger(__name__)

MAX_ROUNDS = 40
MAX_DISTRIBUTIONS = 400
#: All wheels of one install together (they are copied into the sandbox through memory).
DOWNLOAD_MAX_BYTES = 6 << 30
#: pip settings from this machine's configuration that are passed on: where to download from
#: and how to connect. Anything else (no-binary, build options, targets) is dropped, so the
#: configuration cannot turn the download into a build.
PIP_SETTINGS = frozenset(
    {
        "index-url", "extra-index-url", "no-index", "find-links", "trusted-host", "cert",
        "client-cert", "proxy", "timeout", "default-timeout", "retries", "constraint", "pre",
        "prefer-binary", "keyring-provider", "use-feature", "resume-retries",
    }
)  # fmt: skip


#: Where pip downloads from; configured index URLs replace all of these.
PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_FIND_LINKS")


def _pip_config() -> dict[str, str]:
    """This machine's pip settings (files and environment) as ``PIP_*`` variables.

    Read with pip's own loader in harombe's process, so the download user need not be able to
    read root's ``~/.config/pip/pip.conf``; only :data:`PIP_SETTINGS` are kept."""
    try:
        from pip._internal.configuration import Configuration

        config = Configuration(isolated=False)
        config.load()
        items = list(config.items())
    except Exception as exc:  # noqa: BLE001 - pip's loader is no public API: say so, don't guess
        raise PackageFetchError(
            f"could not read this machine's pip configuration ({exc}); check `pip config list`"
        ) from None
    ranked: dict[str, tuple[int, str]] = {}
    for key, value in items:
        section, _, name = key.partition(".")
        rank = {"global": 0, "download": 1, ":env:": 2}.get(section)
        if rank is None or name not in PIP_SETTINGS:
            continue
        if rank >= ranked.get(name, (-1, ""))[0]:
            ranked[name] = (rank, str(value))
    return {"PIP_" + k.upper().replace("-", "_"): v for k, (_, v) in ranked.items()}


_CONFIG_LOCK = asyncio.Lock()


async def pip_env(
    home: Path, index_urls: Sequence[str] = (), *, allowed_hosts: Collection[str] = ()
) -> dict[str, str]:
    """The environment for the guarded pip: machine settings, no config files, no cache.

    ``index_urls`` (http(s) URLs, checked by the config) replace the machine's sources: the
    first is ``PIP_INDEX_URL``, the rest ``PIP_EXTRA_INDEX_URL`` (pip splits it on spaces).
    ``allowed_hosts`` (``network.allowed_registries`` host names): every index in use must be
    on one of them, else :class:`PackageFetchError` naming the host; the guard then refuses
    any request to another host (:data:`~.pip_guard.HOST_MARK`)."""
    async with _CONFIG_LOCK:  # the first call imports pip's loader (~0.2 s), once
        settings = await asyncio.to_thread(_pip_config)
    env = base_env(home)
    env.update(settings)
    if index_urls:
        for name in PIP_SOURCES:
            env.pop(name, None)
        env["PIP_INDEX_URL"] = index_urls[0]
        if len(index_urls) > 1:
            env["PIP_EXTRA_INDEX_URL"] = " ".join(index_urls[1:])
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONNOUSERSITE="1",
    )
    if allowed_hosts:
        check_index_hosts(env, allowed_hosts)
        env[ALLOWED_HOSTS_ENV] = " ".join(sorted(allowed_hosts))
    return env


@dataclass(frozen=True)
class PipRuntime:
    """An interpreter the download user can run, and a directory holding only pip."""

    python: str
    pip_path: Path


#: The interpreter and pip directory found for each download identity (probed once per process).
_RUNNABLE: dict[Identity, tuple[str, Path]] = {}


def _readable_pip_copy(source: Path) -> Path:
    """A copy of the pip package in a fresh directory only root can write and anyone can read."""
    parent = Path(tempfile.mkdtemp(prefix="harombe-pip-"))  # unguessable, ours, 0700
    atexit.register(shutil.rmtree, parent, True)
    target = parent / "pip"
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for path in (parent, *target.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644, follow_symlinks=False)
    return target


def _interpreters() -> list[str]:
    found = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]
    found.append(shutil.which("python3") or "")
    return list(dict.fromkeys(p for p in found if p))


async def pip_runtime(area: FetchArea) -> PipRuntime:
    """Link harombe's own pip into a pip-only directory of ``area`` and find an interpreter
    the download user can start (harombe's may live in root's private home)."""
    spec = importlib.util.find_spec("pip")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise PackageFetchError("pip is not installed for harombe's Python; `pip install pip`")
    pip_path = area.root / "pip-only"
    pip_path.mkdir(mode=0o755)
    known = _RUNNABLE.get(area.identity)
    if known is not None:
        (pip_path / "pip").symlink_to(known[1], target_is_directory=True)
        return PipRuntime(known[0], pip_path)
    probe = area.new_dir("probe")
    check = f"import sys; sys.path.insert(0, {str(pip_path)!r}); import pip"
    # harombe's own pip first; when the download user cannot reach it (an environment under a
    # private directory), a read-only copy that root owns, made once per process.
    for source in (Path(locations[0]), None):
        if source is None:
            source = await asyncio.to_thread(_readable_pip_copy, Path(locations[0]))
        (pip_path / "pip").unlink(missing_ok=True)
        (pip_path / "pip").symlink_to(source, target_is_directory=True)
        for python in _interpreters():
            argv = [python, "-I", "-S", "-c", check]
            code, _ = await area.run(argv, cwd=probe, env=base_env(probe))
            if code == 0:
                _RUNNABLE[area.identity] = (python, source)
                return PipRuntime(python, pip_path)
    raise PackageFetchError(
        f"no Python interpreter that {area.identity.label} can run could import harombe's pip "
        f"({locations[0]}); install python3 system-wide (e.g. `apt-get install python3`) and "
        "keep harombe's environment readable by that user"
    )


def pip_argv(
    runtime: PipRuntime, wants: Sequence[Want], dest: Path, target: Target, platforms: Sequence[str]
) -> list[str]:
    """The guarded ``pip download --no-deps`` of exactly ``wants`` for ``target``."""
    argv = [
        runtime.python, "-I", "-S", "-c", PIP_GUARD, str(runtime.pip_path),
        "download", "--no-deps", "--only-binary=:all:",
        "--progress-bar", "off", "--dest", str(dest),
        "--implementation", "cp", "--python-version", target.python_version.replace(".", ""),
    ]  # fmt: skip
    for tag in platforms:
        argv += ["--platform", tag]
    return [*argv, "--", *(w.pip_text for w in wants)]


@dataclass(frozen=True)
class Download:
    """What each level of a resolution downloads with: pip, the sandbox and the sources."""

    area: FetchArea
    runtime: PipRuntime
    target: Target
    platforms: Sequence[str]
    index_urls: Sequence[str] = ()
    allowed_hosts: Collection[str] = ()
    report: Reporter = SILENT
    fetched_bytes: list[int] = field(default_factory=lambda: [0])  # by the levels before


async def resolve(
    area: FetchArea,
    root_text: str,
    target: Target,
    platforms: Sequence[str],
    constraints: Sequence[str] = (),
    *,
    index_urls: Sequence[str] = (),
    allowed_hosts: Collection[str] = (),
    report: Reporter = SILENT,
) -> list[Wheel]:
    """Wheels for ``root_text`` and everything it needs in ``target``; see the module docstring.

    ``constraints`` are extra version limits (``numpy<2``); ``index_urls`` the configured
    indexes (empty: this machine's pip configuration); ``allowed_hosts`` the hosts files may
    come from (empty: any the index links to); ``report`` is told each level and download.
    Raises :class:`PackageSpecError` for a URL/VCS/path reference anywhere in the tree, and
    :class:`PackageFetchError` when a needed distribution has no wheel for the sandbox.

    A wheel whose compiled extensions were built against NumPy 1.x (they fail to import with
    NumPy 2) limits ``numpy`` to ``<2`` as soon as it is downloaded, unless the constraints
    name NumPy: the set is resolved once, never built and then resolved again."""
    root = Requirement(root_text)
    limits: dict[str, SpecifierSet] = {}
    for line in constraints:
        limit = Requirement(line)
        limits[canonicalize_name(limit.name)] = limit.specifier
    numpy_fixed = "numpy" in limits
    env_markers = target.marker_env()
    download = Download(
        area, await pip_runtime(area), target, platforms, index_urls, allowed_hosts, report
    )
    picks: dict[str, Wheel] = {}
    for _ in range(MAX_ROUNDS):
        wants = wanted(root, picks, env_markers, limits)
        if len(wants) > MAX_DISTRIBUTIONS:
            raise PackageFetchError(
                f"{root_text} needs more than {MAX_DISTRIBUTIONS} distributions; install a "
                "smaller package"
            )
        todo = stale(wants, picks)
        if not todo:
            return [picks[name] for name in wants]
        level = await _fetch_level(download, todo, picks, root.name)
        picks.update(level)
        numpy_fixed = numpy_fixed or await _limit_numpy(download, level, limits)
        total_bytes = sum(w.path.stat().st_size for w in picks.values())
        download.fetched_bytes[0] = total_bytes
        if total_bytes > DOWNLOAD_MAX_BYTES:
            raise PackageFetchError(
                f"the wheels of {root_text} exceed {DOWNLOAD_MAX_BYTES >> 20} MB together; "
                "install a smaller package"
            )
        log.debug("package.level_fetched", spec=root_text, wheels=[w.pip_text for w in todo])
    raise PackageFetchError(
        f"the dependencies of {root_text} did not settle within {MAX_ROUNDS} rounds; pin "
        "the versions of its dependencies"
    )


async def _limit_numpy(
    download: Download, level: Mapping[str, Wheel], limits: dict[str, SpecifierSet]
) -> bool:
    """Limit ``numpy`` to ``<2`` when a wheel of ``level`` needs NumPy 1.x; whether it did.
    Limited now, NumPy is picked within it (stale() fetches again a NumPy 2 already picked)
    rather than a set built that cannot import."""
    old = await asyncio.to_thread(numpy_1_builds, list(level.values()))
    if old:
        limits["numpy"] = SpecifierSet("<2")
        await download.report(
            "resolving",
            f"limiting numpy to <2: {', '.join(old)} were built against NumPy 1.x",
            package="numpy",
        )
    return bool(old)


async def _fetch_level(
    download: Download, todo: Sequence[Want], picks: Mapping[str, Wheel], root: str
) -> dict[str, Wheel]:
    """One guarded ``pip download`` of ``todo``: the new pick for each of them."""
    work = download.area.new_dir("pip")
    dest = work / "wheels"  # made by pip, as the download user
    names = ", ".join(w.pip_text for w in todo[:8]) + (", ..." if len(todo) > 8 else "")
    plural = "s" if len(todo) != 1 else ""
    await download.report(
        "resolving", f"fetching {len(todo)} distribution{plural}: {names}", package=root
    )

    async def on_line(line: str) -> None:
        await on_pip_line(download, line)

    env = await pip_env(work / "home", download.index_urls, allowed_hosts=download.allowed_hosts)
    async with ticking(download, work):
        code, output = await download.area.run(
            pip_argv(download.runtime, todo, dest, download.target, download.platforms),
            cwd=work,
            env=env,
            on_line=on_line,
        )
    if code != 0:
        raise _pip_failure(todo, download.target, output)
    fetched = await asyncio.to_thread(collect_wheels, dest, root)
    new: dict[str, Wheel] = {}
    for want in todo:
        got = fetched.get(want.name)
        if got is None:
            raise PackageFetchError(
                f"pip downloaded no wheel for {want.pip_text} (needed by {want.needed_by}):"
                f"\n{tail(output)}"
            )
        old = picks.get(want.name)
        if old is not None and old.version == got.version:
            raise PackageFetchError(f"could not settle a version of {want.pip_text}")
        new[want.name] = got
    return new


#: What pip prints when it never got an answer from the index (connection, proxy, TLS, DNS):
#: its "No matching distribution" then says nothing about the package.
UNREACHABLE_MARKS = ("NewConnectionError", "Max retries exceeded", "ProxyError", "SSLError",
                     "ConnectTimeoutError", "Temporary failure in name resolution")  # fmt: skip


def _pip_failure(todo: Sequence[Want], target: Target, output: str) -> PackageFetchError:
    asked = ", ".join(f"{w.pip_text} (needed by {w.needed_by})" for w in todo)
    refused = re.search(re.escape(HOST_MARK) + r": (\S*)", output)
    if refused:
        host = refused.group(1)
        return host_refused(host, "pypi", what=f"a file of {asked} would come from {host}, which")
    if "File too large" in output or "EFBIG" in output:
        return PackageFetchError(
            f"a file of {asked} is larger than the download cap "
            f"({FILE_MAX_BYTES >> 20} MB per file); install a smaller package"
        )
    if GUARD_MARK in output:
        return PackageFetchError(
            f"pip tried to run a program, import a build tool or read a host file while "
            f"downloading {asked}; refused, nothing ran:\n{tail(output)}"
        )
    if any(mark in output for mark in UNREACHABLE_MARKS):
        return PackageFetchError(
            f"the package index could not be reached while downloading {asked}; check "
            f"network.allowed_registries and this machine's pip configuration:\n{tail(output)}"
        )
    if "No matching distribution" in output or "from versions: none" in output:
        return PackageNotFoundError(
            f"no wheel of {asked} for the sandbox (CPython {target.python_version}, "
            f"{target.machine}, glibc {target.glibc}) is on the package index (or the "
            "versions asked for conflict); harombe installs wheels only and never builds "
            "source distributions, so choose a version that publishes a wheel for this "
            f"platform:\n{tail(output)}"
        )
    return PackageFetchError(f"downloading {asked} failed:\n{tail(output)}")

"""Package installation: the host-side download of a spec the policy accepted.

Which specs are acceptable is :mod:`harombe.security.policy.package_specs` (re-exported here):
only plain registry specs pass, and URLs, VCS references, local paths, archives, npm aliases
and option-looking strings are refused before anything runs.

Downloads happen on the host with the machine's own pip / npm configuration (index URLs,
proxies, CA bundles) — harombe never names a registry host — and are then copied into the
sandbox, which stays offline. Nothing of a package runs on the host: pip is never allowed to
resolve (harombe walks the tree itself and refuses URL/VCS/path dependencies anywhere in it,
:mod:`.pypi`), npm installs a lockfile harombe has checked holds
registry releases only (:mod:`.npm`), and both run unprivileged in a
private directory (:mod:`.fetch_runner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import tarfile
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path

import structlog

from harombe.errors import PackageFetchError
from harombe.security.policy.package_specs import REGISTRIES, PackageSpec, Registry, parse_spec
from harombe.security.runtime.install_progress import SILENT, Reporter
from harombe.security.runtime.packages import npm as npm_fetch
from harombe.security.runtime.packages import pypi as pypi_fetch
from harombe.security.runtime.packages.fetch_runner import FetchArea

log = structlog.get_logger(__name__)
__all__ = [
    "FETCH_TIMEOUT_S", "REGISTRIES", "TAR_MAX_BYTES", "TAR_MAX_MEMBERS", "PackageSpec", "Registry",
    "fetch_npm", "fetch_pypi", "fetching", "manylinux_platforms", "parse_spec",
]  # fmt: skip

#: The whole download (every pip / npm run of one install) must finish within this.
FETCH_TIMEOUT_S = 600


def manylinux_platforms(machine: str, glibc: str) -> list[str]:
    """pip ``--platform`` tags a sandbox with this CPU and glibc version can load."""
    try:
        major, minor = (int(x) for x in glibc.split(".")[:2])
    except ValueError:
        major, minor = 2, 17
    if major != 2:
        minor = 17
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for m, name in legacy.items() if m <= minor]
    return tags


#: What one install may copy into a sandbox: members and bytes (before compression).
TAR_MAX_MEMBERS = 200_000
TAR_MAX_BYTES = 6 << 30


def _tar(paths: Sequence[Path], owner_uid: int) -> bytes:
    """``paths`` (files, or directories taken whole) as a tar.gz, each under its base name.

    The trees were written by the download user: only its own regular files and symlinks and
    directories are taken (links stored as links, never followed); a hard link, device, FIFO or
    a file of anyone else's (a hard link to a host file, say) is refused, and so is a tree past
    :data:`TAR_MAX_MEMBERS` or :data:`TAR_MAX_BYTES`."""
    seen = {"members": 0, "bytes": 0}

    def admit(info: tarfile.TarInfo) -> tarfile.TarInfo:
        seen["members"] += 1
        seen["bytes"] += info.size
        if seen["members"] > TAR_MAX_MEMBERS or seen["bytes"] > TAR_MAX_BYTES:
            raise PackageFetchError(
                f"the download holds more than {TAR_MAX_MEMBERS} files or "
                f"{TAR_MAX_BYTES >> 20} MB; install a smaller package"
            )
        if not (info.isreg() or info.isdir() or info.issym()) or (
            not info.isdir() and info.uid != owner_uid
        ):
            raise PackageFetchError(
                f"the download holds {info.name!r}, which is not a file the download tool "
                "wrote (a hard link, device or someone else's file); refused"
            )
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path in paths:
            tar.add(path, arcname=path.name, filter=admit)
    return buf.getvalue()


def _owner(area: FetchArea) -> int:
    """The uid that owns what the download tools of ``area`` write."""
    return area.identity.uid if area.identity.uid is not None else os.geteuid()


@contextlib.asynccontextmanager
async def fetching(label: str, prefix: str) -> AsyncIterator[FetchArea]:
    """A private download area for ``label``, removed afterwards; the work in the block gets
    ``FETCH_TIMEOUT_S`` (the tar of what it fetched included)."""
    area = await asyncio.to_thread(FetchArea, prefix)
    try:
        async with asyncio.timeout(FETCH_TIMEOUT_S):
            yield area
    except TimeoutError:
        raise PackageFetchError(
            f"downloading {label} took longer than {FETCH_TIMEOUT_S}s; check the host's "
            "network and package index configuration"
        ) from None
    finally:
        await asyncio.to_thread(area.close)


async def fetch_pypi(
    spec: PackageSpec,
    *,
    python: str,
    machine: str,
    glibc: str,
    constraints: Sequence[str] = (),
    index_urls: Sequence[str] = (),
    allowed_hosts: Collection[str] = (),
    report: Reporter = SILENT,
) -> bytes:
    """Wheels for ``spec`` and its dependencies, for the sandbox's interpreter, as a tar.gz.

    ``constraints`` are extra version limits (``numpy<2``) applied while resolving. Resolution
    is harombe's own, level by level, so no package code can run on the host
    (:mod:`.pypi`); a URL, VCS or path dependency anywhere in the tree
    raises :class:`PackageSpecError`, a dependency without a wheel :class:`PackageFetchError`."""
    target = pypi_fetch.Target(python=python, machine=machine, glibc=glibc)
    async with fetching(spec.text, "harombe-wheels-") as area:
        wheels = await pypi_fetch.resolve(
            area, spec.text, target, manylinux_platforms(machine, glibc), constraints,
            index_urls=index_urls, allowed_hosts=allowed_hosts, report=report,
        )  # fmt: skip
        log.debug("package.fetched", registry="pypi", spec=spec.text, files=len(wheels))
        return await asyncio.to_thread(_tar, [w.path for w in wheels], _owner(area))


async def fetch_npm(
    spec: PackageSpec, *, registry: str | None = None, allowed_hosts: Collection[str] = ()
) -> tuple[bytes, str]:
    """``node_modules`` for ``spec`` (registry releases only, install scripts not run) as a
    tar.gz, and npm's output; ``registry`` overrides npm's configured one; ``allowed_hosts``
    (when given) are the only hosts npm may have fetched from. See :mod:`.npm`."""
    npm = shutil.which("npm")
    if npm is None:
        raise PackageFetchError(
            "npm is not installed on the host; harombe downloads npm packages with the host's "
            "npm (install it, e.g. `apt-get install npm`)"
        )
    async with fetching(spec.text, "harombe-npm-") as area:
        modules, output = await npm_fetch.fetch_tree(
            area, npm, spec.text, registry=registry, allowed_hosts=allowed_hosts
        )
        archive = await asyncio.to_thread(_tar, sorted(modules.iterdir()), _owner(area))
        log.debug("package.fetched", registry="npm", spec=spec.text)
        return archive, output

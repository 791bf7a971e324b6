"""Dependency environments: PyPI requirement sets resolved on the host, unpacked once into a
read-only tree, and shared by every sandbox that asks for the same set.

A sandbox sees the cache's ``envs`` directory read-only at :data:`ENV_MOUNT` (gVisor's gofer
serves it; nothing in a sandbox can write there). Installing a cached set into a sandbox is
then one small file, ``harombe-env-<key>.pth`` in its user site, naming the set's ``site``
directory: no download, no copy, no pip. Layout of the cache directory::

    envs/<key>/              one environment, never changed once published
        site/                purelib and platlib of every wheel (bytecode compiled on the host
                             when its Python is the sandbox's minor version)
        bin/                 console scripts (``#!/usr/bin/python3``)
        manifest.json        requirements asked, wheels (file, sha256), target, size
    requests/<hash>.json     a requirement set as asked -> the environment it resolved to
    used/<key>               touched on every use: the least recently used go first
    holds/<key>.<pid>.<s>-<n>  an environment a process's sandboxes use (never evicted)
    locks/<hash>.lock        one builder per requirement set, across processes
    tmp/                     staging: an environment appears in envs/ by one rename

The key hashes the resolved wheels (names, SHA-256) and the target (Python minor, CPU, glibc).
Wheels are unpacked after their ``RECORD`` holds (:mod:`.environment_unpack`); nothing of a
package runs on the host. A request is answered from ``requests/`` for ``resolve_ttl_s``.
The cache stays within ``max_mb`` (:mod:`.environment_evict`): a build makes room or is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from harombe.errors import ConfigError, PackageFetchError
from harombe.security.runtime import packages
from harombe.security.runtime.environment_evict import evict, make_room, publishing
from harombe.security.runtime.environment_holds import Holds
from harombe.security.runtime.environment_unpack import (
    compile_tree,
    declared_bytes,
    make_read_only,
    needs_import_check,
    remove_tree,
    sha256_of,
    top_level_modules,
    tree_bytes,
    unpack_wheel,
)
from harombe.security.runtime.install_progress import ProgressCallback, Reporter
from harombe.security.runtime.packages import pypi as pypi_fetch
from harombe.security.runtime.packages.wheels import Target, Wheel
from harombe.security.runtime.sandbox import ENV_MOUNT

log = structlog.get_logger(__name__)

#: The file in a sandbox's user site that puts one environment on ``sys.path``.
PTH_PREFIX = "harombe-env-"
__all__ = ["Environment", "EnvironmentStore", "Progress", "default_directory"]
LOCK_POLL_S = 0.05
MAX_MODULES = 50
#: A request found in the cache is answered from memory for this long before disk is read
#: again (the TTL, a rebuild elsewhere, an eviction).
RECHECK_S = 10.0

#: ``on_progress`` of builds: see :mod:`.install_progress` (events are their message, a str).
Progress = ProgressCallback


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/harombe/environments``, else ``~/.cache/harombe/environments``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harombe" / "environments"


@dataclass(frozen=True)
class Environment:
    """One published environment: what a sandbox needs to use it."""

    key: str
    requirements: tuple[str, ...]
    wheels: tuple[str, ...]  # "name-version" of each distribution, as pip prints them
    size_bytes: int
    reused: bool  # found in the cache (no download, no unpack)
    modules: tuple[str, ...] = ()  # top-level modules of the requested distributions

    @property
    def site(self) -> str:
        """The environment's site directory as sandboxes see it."""
        return f"{ENV_MOUNT}/{self.key}/site"

    @property
    def pth_name(self) -> str:
        return f"{PTH_PREFIX}{self.key}.pth"


def request_hash(requirements: Sequence[str], target: Target, constraints: Sequence[str],
                 index_urls: Sequence[str]) -> str:  # fmt: skip
    """What identifies a request: the set as asked (order and duplicates do not matter)."""
    body = json.dumps(
        [sorted(set(requirements)), sorted(set(constraints)), list(index_urls),
         target.python_version, target.machine, target.glibc],
    )  # fmt: skip
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def environment_key(wheels: Sequence[tuple[str, str]], target: Target) -> str:
    """The key of resolved ``(wheel file name, sha256)`` pairs for ``target``."""
    body = json.dumps([sorted(wheels), target.python_version, target.machine, target.glibc])
    return hashlib.sha256(body.encode()).hexdigest()[:32]


class EnvironmentStore:
    """The host-side cache of environments in ``directory`` (see the module docstring).

    Safe under concurrent use from threads, tasks and processes: builders of one request hold
    its lock file; publishing is one ``rename``; readers only ever see whole environments."""

    def __init__(
        self,
        directory: Path,
        *,
        max_mb: int,
        resolve_ttl_s: float,
        index_urls: Sequence[str] = (),
        allowed_hosts: Collection[str] = (),
    ) -> None:
        self.directory = directory
        self.envs = directory / "envs"
        self.max_bytes = max_mb << 20
        self.resolve_ttl_s = resolve_ttl_s
        self.index_urls = tuple(index_urls)
        self.allowed_hosts = frozenset(allowed_hosts)
        self.holds = Holds(directory / "holds", lambda: self.in_use())
        #: Keys linked into live sandboxes of this process (the manager sets it).
        self.in_use: Callable[[], Collection[str]] = frozenset
        self._recent: dict[str, tuple[Environment, float]] = {}  # request -> env, looked up at

    def open(self) -> None:
        """Create the layout; raises :class:`ConfigError` naming the directory if it cannot."""
        try:
            for name, mode in (
                ("envs", 0o755),
                ("requests", 0o700),
                ("used", 0o700),
                ("locks", 0o700),
                ("tmp", 0o700),
                ("holds", 0o700),
            ):
                (self.directory / name).mkdir(parents=True, exist_ok=True)
                os.chmod(self.directory / name, mode)
            os.chmod(self.directory, 0o755)
        except OSError as exc:
            raise ConfigError(
                f"the install cache directory {self.directory} cannot be used ({exc.strerror}); "
                "set security.sandbox.install_cache.directory to a writable local directory, "
                "or enabled: false"
            ) from None

    # -- the request path -------------------------------------------------------------------

    async def ensure(
        self,
        requirements: Sequence[str],
        *,
        target: Target,
        constraints: Sequence[str] = (),
        refresh: bool = False,
        on_progress: Progress | Reporter | None = None,
    ) -> Environment:
        """The environment of ``requirements`` for ``target``: from the cache when a request
        for the same set was resolved within ``resolve_ttl_s`` (``refresh`` resolves again),
        else resolved, downloaded and unpacked now; held briefly for the sandbox it is for
        (``holds``). ``on_progress`` is told each step (:mod:`.install_progress`).
        Raises :class:`PackageFetchError` (or :class:`~harombe.errors.PackageSpecError`)
        naming the requirement that failed, or the cache's size when it cannot make room."""
        say = (
            on_progress
            if isinstance(on_progress, Reporter)
            else Reporter(on_progress, requirements=list(requirements))
        )
        wanted = request_hash(requirements, target, constraints, self.index_urls)
        if not refresh:
            recent = self._recent.get(wanted)
            if (
                recent is not None
                and time.monotonic() - recent[1] < min(RECHECK_S, self.resolve_ttl_s)
                and await asyncio.to_thread(self.holds.hold_briefly, recent[0].key, self.envs)
            ):
                return recent[0]  # looked up on disk a moment ago: not resolved again
            known = await asyncio.to_thread(self._remembered, wanted)
            if known is not None:
                self._recent[wanted] = (known, time.monotonic())
                return known
        async with self._locked(wanted):
            if not refresh:
                known = await asyncio.to_thread(self._remembered, wanted)
                if known is not None:
                    return known
            env = await self._resolve_and_build(requirements, target, constraints, say)
            await asyncio.to_thread(self._remember, wanted, env.key)
        return env

    def _remembered(self, wanted: str) -> Environment | None:
        try:
            memo = json.loads((self.directory / "requests" / f"{wanted}.json").read_text())
            if time.time() - float(memo["resolved_at"]) > self.resolve_ttl_s:
                return None
            self.touch(str(memo["key"]))
            self.holds.hold_briefly(str(memo["key"]))  # before the load: an eviction now skips it
            return self.load(str(memo["key"]), reused=True)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _remember(self, wanted: str, key: str) -> None:
        path = self.directory / "requests" / f"{wanted}.json"
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_text(json.dumps({"key": key, "resolved_at": time.time()}))
        os.replace(staged, path)

    @contextlib.asynccontextmanager
    async def _locked(self, wanted: str) -> Any:
        """One builder per request across tasks and processes: an ``flock`` polled without
        blocking (a waiter holds no thread, so waiters cannot starve the builder's threads)."""
        fd = os.open(self.directory / "locks" / f"{wanted}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_POLL_S)
            yield
        finally:
            os.close(fd)  # releases the lock

    async def _resolve_and_build(
        self, requirements: Sequence[str], target: Target, constraints: Sequence[str],
        say: Reporter,
    ) -> Environment:  # fmt: skip
        async with contextlib.AsyncExitStack() as areas:
            wheels = await self._resolve(areas, requirements, target, constraints, say)
            total = sum(w.path.stat().st_size for w in wheels)
            await say(
                "resolving",
                f"resolved {len(wheels)} distributions: " + ", ".join(w.label for w in wheels),
                bytes=total,
            )
            hashed = await asyncio.to_thread(lambda: [(w, sha256_of(w.path)) for w in wheels])
            key = environment_key([(w.path.name, h) for w, h in hashed], target)
            self.holds.hold_briefly(key)
            env = await asyncio.to_thread(self.load, key, reused=True)
            if env is not None:  # another request resolved to the same set
                self.touch(key)
                return env
            await say("unpacking", f"unpacking {len(wheels)} wheels")
            step = say.threadsafe()
            return await asyncio.to_thread(
                self._build, key, hashed, tuple(requirements), target, step=step
            )

    async def _resolve(
        self, areas: contextlib.AsyncExitStack, requirements: Sequence[str], target: Target,
        constraints: Sequence[str], say: Reporter,
    ) -> list[Wheel]:  # fmt: skip
        """Each requirement in turn (a download area of its own, kept open in ``areas``),
        pinned to what the ones before it picked: one consistent set, or the failure of the
        requirement that does not fit."""
        platforms = packages.manylinux_platforms(target.machine, target.glibc)
        picks: dict[str, Wheel] = {}
        for requirement in requirements:
            await say("resolving", f"resolving {requirement}", package=requirement)
            area = await areas.enter_async_context(packages.fetching(requirement, "harombe-env-"))
            pins = [f"{w.name}=={w.version}" for w in picks.values()]
            got = await pypi_fetch.resolve(
                area, requirement, target, platforms, [*constraints, *pins],
                index_urls=self.index_urls, allowed_hosts=self.allowed_hosts, report=say,
            )  # fmt: skip
            picks.update((w.name, w) for w in got)
        return list(picks.values())

    # -- building ---------------------------------------------------------------------------

    def _build(
        self,
        key: str,
        hashed: Sequence[tuple[Wheel, str]],
        requirements: tuple[str, ...],
        target: Target,
        *,
        step: Callable[..., None] | None = None,
    ) -> Environment:
        """Unpack ``hashed`` into a staging tree, make room for it (or refuse) and publish it
        as ``key``; ``step(stage, text)`` is told each step. Blocking: run it in a thread."""
        tell = step or (lambda *_args: None)
        total = sum(declared_bytes(wheel.path) for wheel, _ in hashed)
        if total > self.max_bytes:
            raise PackageFetchError(
                f"{', '.join(requirements)} unpacks to {total >> 20} MB, more than the whole "
                f"install cache ({self.max_bytes >> 20} MB); raise "
                "security.sandbox.install_cache.max_mb, or install less"
            )
        stage = self.directory / "tmp" / f"{key}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            stage.mkdir(mode=0o755)
            for wheel, _ in sorted(hashed, key=lambda pair: pair[0].name):
                tell("unpacking", f"unpacking {wheel.label}", wheel.name)
                unpack_wheel(wheel.path, stage, label=wheel.label)
            if sys.version_info[:2] == tuple(int(x) for x in target.python_version.split(".")):
                tell("compiling", "compiling bytecode")
                compile_tree(stage / "site", shown_as=f"{ENV_MOUNT}/{key}/site")
            manifest = {
                "key": key,
                "requirements": list(requirements),
                "wheels": [
                    {"file": w.path.name, "sha256": h, "name": w.name, "version": str(w.version)}
                    for w, h in hashed
                ],
                "target": [target.python_version, target.machine, target.glibc],
                "size_bytes": (size := tree_bytes(stage)),
                "import_check": needs_import_check(stage, [w.name for w, _ in hashed]),
                "modules": top_level_modules(stage / "site", requirements),
            }
            (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))
            make_read_only(stage)
            self.holds.hold_briefly(key)  # no eviction elsewhere takes it as it appears
            self.touch(key)
            with publishing(self.directory):  # one builder at a time makes room, fills it
                self._make_room(key, size, requirements)
                try:
                    os.rename(stage, self.envs / key)
                except OSError:  # published meanwhile by another process: theirs is the same
                    if not (self.envs / key / "manifest.json").is_file():
                        raise
        finally:
            if stage.exists():
                remove_tree(stage)
        self.touch(key)
        env = self.load(key, reused=False)
        if env is None:
            raise PackageFetchError(f"environment {key} vanished as it was published; try again")
        log.info("environment.built", key=key, wheels=list(env.wheels), size_bytes=env.size_bytes)
        return env

    # -- reading, use and eviction ----------------------------------------------------------

    def load(self, key: str, *, reused: bool) -> Environment | None:
        """The published environment ``key``, or None if absent or its manifest does not hold
        the key it is filed under (a half-copied or altered cache entry is not used)."""
        if len(key) != 32 or not all(c in "0123456789abcdef" for c in key):
            return None
        try:
            manifest = json.loads((self.envs / key / "manifest.json").read_text())
            wheels = manifest["wheels"]
            python, machine, glibc = manifest["target"]
            target = Target(python=python, machine=machine, glibc=glibc)
            if environment_key([(w["file"], w["sha256"]) for w in wheels], target) != key:
                log.warning("environment.refused", key=key, reason="manifest does not match")
                return None
            modules = manifest.get("modules")  # an entry built before they were recorded:
            if not isinstance(modules, list):  # read them from its dist-info now
                modules = top_level_modules(self.envs / key / "site", manifest["requirements"])
            return Environment(
                key=key,
                requirements=tuple(manifest["requirements"]),
                wheels=tuple(f"{w['name']}-{w['version']}" for w in wheels),
                size_bytes=int(manifest["size_bytes"]),
                reused=reused,
                modules=tuple(str(m) for m in modules)[:MAX_MODULES],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def import_checked(self, key: str) -> bool:
        """No import check is needed for ``key``, or a sandbox has imported every top-level
        module of the requirements without an error."""
        try:
            manifest = json.loads((self.envs / key / "manifest.json").read_text())
            if not manifest.get("import_check", True):
                return True
        except (OSError, ValueError):
            return False
        return (self.directory / "used" / f"{key}.imports-ok").exists()

    def mark_import_checked(self, key: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / "used" / f"{key}.imports-ok").touch()

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / "used" / key).touch()

    def hold(self, key: str) -> None:
        """Keep ``key`` from eviction, by any process, until :meth:`release`."""
        self.holds.hold(key)

    def release(self, key: str) -> None:
        self.holds.release(key)

    def evict(self, *, now: float | None = None) -> list[str]:
        """See :func:`.environment_evict.evict`: never what a process holds or uses."""
        self.holds.write()
        return evict(self, self.holds.mine(), now=now)[0]

    def _make_room(self, key: str, size_bytes: int, requirements: Sequence[str]) -> None:
        self.holds.write()
        if not (self.envs / key).is_dir():  # else published meanwhile: nothing is added
            make_room(self, self.holds.mine(), size_bytes, requirements)

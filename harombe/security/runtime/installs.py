"""Package installs: downloaded on the host, copied in, installed offline inside the sandbox.

The sandbox never gets network for an install. The host downloads with this machine's own pip
or npm configuration, unprivileged, and nothing of a package runs there: PyPI trees are walked
by harombe one level at a time, wheels only, for the sandbox's Python, CPU and glibc, refusing
URL/VCS/path dependencies anywhere in the tree; npm trees are resolved to a lockfile that must
hold registry releases only before anything is fetched, and installed with scripts off (see
:mod:`harombe.security.runtime.packages`). The files are unpacked inside the sandbox and installed
there, offline.

With the install cache on (the default), a PyPI install goes through
:mod:`harombe.security.runtime.environments` instead: the set is resolved and unpacked on the
host once, every sandbox sees the cache read-only, and the install itself is one ``.pth`` file in
the sandbox's user site. The sandbox's pip is used when the cache is off.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import tarfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import structlog

from harombe.config import INTERPRETERS, REGISTRY_LANGUAGES, NetworkConfig
from harombe.config_environments import InstallCacheConfig
from harombe.errors import PackageFetchError, UsageError
from harombe.security.runtime import packages
from harombe.security.runtime.environments import Environment, EnvironmentStore, default_directory
from harombe.security.runtime.files import Files
from harombe.security.runtime.install_progress import ProgressCallback, Reporter
from harombe.security.runtime.packages.wheels import Target
from harombe.security.runtime.runs import Runs
from harombe.security.runtime.sandbox import HOME, ExecutionResult, Sandbox

log = structlog.get_logger(__name__)

INSTALL_TIMEOUT_S = 600.0
NUMPY_1 = ("numpy<2",)
#: Imports the top-level modules of distribution sys.argv[1], in the sandbox.
IMPORT_CHECK = """
import importlib, importlib.metadata as md, sys
sys.path[:0] = sys.argv[2:]  # where the package is, first (run with -I: no user site code)
dist = md.distribution(sys.argv[1])
tops = (dist.read_text("top_level.txt") or "").split()
if not tops:
    tops = sorted({f.parts[0].split(".")[0] for f in dist.files or []
                   if f.parts and not f.parts[0].endswith((".dist-info", ".data"))})
for top in tops:
    importlib.import_module(top)
"""


def _numpy_abi_break(stderr: str) -> bool:
    return "numpy.dtype size changed" in stderr or "compiled using NumPy 1.x" in stderr


class Installs:
    """Installs registry packages into sandboxes, through ``runs`` and ``files``."""

    def __init__(
        self,
        runs: Runs,
        files: Files,
        *,
        network: NetworkConfig,
        cache: InstallCacheConfig | None = None,
    ) -> None:
        self._runs = runs
        self._files = files
        # Where packages come from: configured registries, else this machine's pip/npm config.
        self._index_urls = network.registry_urls("pypi")
        self._pypi_hosts = network.registry_hosts("pypi")
        self._npm_registry = next(iter(network.registry_urls("npm")), None)
        self._npm_hosts = network.registry_hosts("npm")
        self.store: EnvironmentStore | None = None
        if cache is not None and cache.enabled:
            where = Path(cache.directory).expanduser() if cache.directory else default_directory()
            self.store = EnvironmentStore(
                where, max_mb=cache.max_mb, resolve_ttl_s=cache.resolve_ttl_s,
                index_urls=self._index_urls, allowed_hosts=self._pypi_hosts,
            )  # fmt: skip
            self.store.open()
            self.store.in_use = self.environments_in_use  # not evicted while sandboxes use them
        self._linked: weakref.WeakValueDictionary[str, Sandbox] = weakref.WeakValueDictionary()

    def environments_in_use(self) -> set[str]:
        """Keys of the environments linked into sandboxes still alive in this process."""
        boxes = list(self._linked.values())
        return {key for box in boxes if box.channel.lost is None for key in box.linked}

    @property
    def environments_dir(self) -> str | None:
        """The host directory every sandbox sees at ``ENV_MOUNT`` (None: no cache)."""
        return str(self.store.envs) if self.store is not None else None

    async def install(
        self,
        box: Sandbox,
        spec: packages.PackageSpec,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> ExecutionResult:
        """Install ``spec`` into ``box``, which stays offline throughout; a failed install is
        in the result. ``on_progress`` is told each step (:mod:`.install_progress`); the build's
        own output goes to the debug log, never to this process's stderr. Raises
        :class:`~harombe.errors.SandboxLostError` if the sandbox dies."""
        need = INTERPRETERS[REGISTRY_LANGUAGES[spec.registry]]
        if not box.has(need):
            raise UsageError(f"{spec.registry} packages need {need}, which image {box.image} lacks")
        say = Reporter(on_progress, spec=spec.text, sandbox_id=box.sandbox_id)
        async with box.lock:
            if spec.registry == "npm":
                started = time.perf_counter()
                await say("resolving", f"resolving {spec.text} with npm", package=spec.text)
                archive, npm_output = await packages.fetch_npm(
                    spec, registry=self._npm_registry, allowed_hosts=self._npm_hosts
                )
                await say(
                    "installing",
                    f"copying node_modules ({len(archive)} bytes) into the sandbox",
                    package=spec.text,
                    bytes=len(archive),
                )
                await self._files.untar(box, archive, root=f"{HOME}/node_modules")
                await say("done", f"installed {spec.text}", package=spec.text)
                return self._install_result(box, npm_output, time.perf_counter() - started)
            if self.store is not None:
                return await self._install_cached(box, spec, say)
            result = await self._install_pypi(box, spec, say)
            if result.success:
                await say("checking", f"importing {spec.name} once", package=spec.text)
            if result.success and _numpy_abi_break(
                (await self._import_check(box, spec, paths=[self.user_site(box)])).stderr
            ):
                # Built against NumPy 1.x, resolved with NumPy 2: install it again with numpy<2.
                result = await self._install_pypi(box, spec, say, constraints=NUMPY_1)
                result.warnings.append(
                    f"{spec.text} was built against NumPy 1.x and fails to import with NumPy "
                    "2, so it was installed with numpy<2"
                )
            if result.success:
                await say("done", f"installed {spec.text}", package=spec.text)
            return result

    async def _install_cached(
        self, box: Sandbox, spec: packages.PackageSpec, say: Reporter
    ) -> ExecutionResult:
        """``spec`` through the install cache: its environment, built now or found, linked into
        the sandbox's user site. The first sandbox to use an environment checks it imports
        (a set whose wheels need NumPy 1.x was already resolved with ``numpy<2``; the check
        catches what that reading of the wheels cannot see)."""
        assert self.store is not None
        started = time.perf_counter()
        env = await self.store.ensure([spec.text], target=self.target(box), on_progress=say)
        await say(
            "linking",
            f"linking {len(env.wheels)} distributions into the sandbox",
            package=spec.text,
            bytes=env.size_bytes,
        )
        result = await self.link(box, env)
        warnings = []
        if result.success and not self.store.import_checked(env.key):
            await say(
                "checking",
                f"importing {spec.name} once (NumPy and another compiled extension)",
                package=spec.text,
            )
            # Isolated (-I): what the sandbox's code planted in its user site cannot make the
            # shared verdict pass; only a clean exit with nothing on stderr marks it.
            check = await self._import_check(box, spec, paths=[env.site])
            stderr = check.stderr
            if stderr:
                log.info("install.import_check_said", spec=spec.text, stderr=stderr[-2000:])
            if _numpy_abi_break(stderr):
                # Built against NumPy 1.x, resolved with NumPy 2: the set again with numpy<2.
                await self.unlink(box, env)
                env = await self.store.ensure(
                    [spec.text], target=self.target(box), constraints=NUMPY_1, on_progress=say
                )
                result = await self.link(box, env)
                warnings.append(
                    f"{spec.text} was built against NumPy 1.x and fails to import with NumPy "
                    "2, so it was installed with numpy<2"
                )
            elif check.exit_code == 0 and check.status == "ok" and not stderr:
                self.store.mark_import_checked(env.key)
        if result.success:
            how = "from the install cache" if env.reused else "downloaded, now cached"
            result.stdout = f"Successfully installed {' '.join(env.wheels)} ({how})\n"
            await say("done", f"installed {' '.join(env.wheels)} ({how})", package=spec.text)
        result.execution_time = round(time.perf_counter() - started, 6)
        result.warnings.extend(warnings)
        return result

    def target(self, box: Sandbox) -> Target:
        """The interpreter and platform wheels are chosen for: the sandbox's own."""
        libc = box.info.get("libc") or ["glibc", "2.17"]
        python, machine = str(box.info.get("python", "3")), str(box.info.get("machine"))
        return Target(python=python, machine=machine, glibc=str(libc[1] or "2.17"))

    async def link(self, box: Sandbox, env: Environment) -> ExecutionResult:
        """Put ``env`` on the sandbox's ``sys.path``: a ``.pth`` file in its user site, which
        fresh interpreters read at start and the session interpreter before each call. Written
        by the supervisor's unpack (no process is started); the caller holds the lock.
        :class:`PackageFetchError` if ``env`` was evicted before it was held for the sandbox."""
        assert self.store is not None
        box.linked.add(env.key)  # not evicted while the sandbox lives
        self._linked[box.sandbox_id] = box
        if not await asyncio.to_thread(self.store.holds.hold_linked, env.key, self.store.envs):
            box.linked.discard(env.key)
            raise PackageFetchError(
                f"the environment of {', '.join(env.requirements)} was evicted from the "
                "install cache before it could be linked; install again (or raise "
                "security.sandbox.install_cache.max_mb)"
            )
        started = time.perf_counter()
        line = f"{env.site}\n".encode()
        member = tarfile.TarInfo(env.pth_name)
        member.size, member.mode = len(line), 0o644
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.addfile(member, io.BytesIO(line))
        await self._files.untar(box, archive.getvalue(), root=self.user_site(box))
        return self._install_result(box, "", time.perf_counter() - started, language="shell")

    async def unlink(self, box: Sandbox, env: Environment) -> None:
        await self._runs.run(box, ["rm", "-f", "--", f"{self.user_site(box)}/{env.pth_name}"],
                             b"", language="shell", timeout_s=60)  # fmt: skip

    @staticmethod
    def user_site(box: Sandbox) -> str:
        minor = ".".join(str(box.info.get("python", "3")).split(".")[:2])
        return f"{HOME}/.local/lib/python{minor}/site-packages"

    async def _install_pypi(
        self,
        box: Sandbox,
        spec: packages.PackageSpec,
        say: Reporter,
        *,
        constraints: Sequence[str] = (),
    ) -> ExecutionResult:
        target = self.target(box)
        await say("resolving", f"resolving {spec.text}", package=spec.text)
        archive = await packages.fetch_pypi(
            spec, python=target.python, machine=target.machine, glibc=target.glibc,
            constraints=constraints, index_urls=self._index_urls,
            allowed_hosts=self._pypi_hosts, report=say,
        )  # fmt: skip
        await say(
            "installing",
            f"installing {spec.text} with the sandbox's pip",
            package=spec.text,
            bytes=len(archive),
        )
        # A fresh, unguessable directory: code in the sandbox cannot have planted it (the
        # untar refuses a symlink anywhere on the way, too).
        wheels = f"/tmp/harombe-wheels-{secrets.token_hex(8)}"
        await self._files.untar(box, archive, root=wheels)
        argv = [
            "python3", "-m", "pip", "install", "--user", "--no-index", "--find-links", wheels,
            "--no-warn-script-location", "--no-cache-dir",
            *(["--upgrade", *constraints] if constraints else []),
            "--", spec.text,
        ]  # fmt: skip
        result = await self._runs.run(
            box,
            argv,
            b"",
            language="shell",
            timeout_s=INSTALL_TIMEOUT_S,
            extra_env={"PIP_BREAK_SYSTEM_PACKAGES": "1"},
        )
        await self._runs.run(box, ["rm", "-rf", wheels], b"", language="shell", timeout_s=30)
        return result

    async def _import_check(
        self, box: Sandbox, spec: packages.PackageSpec, *, paths: Sequence[str]
    ) -> ExecutionResult:
        """Import the installed distribution's top-level modules from ``paths``, isolated
        (``-I``): what code in the sandbox planted (``usercustomize``, ``.pth`` lines) does
        not run, so it cannot make the check pass or fail."""
        return await self._runs.run(
            box, ["python3", "-I", "-c", IMPORT_CHECK, spec.name, *paths], b"",
            language="shell", timeout_s=INSTALL_TIMEOUT_S,
        )  # fmt: skip

    def _install_result(
        self, box: Sandbox, output: str, elapsed_s: float, *, language: str = "javascript"
    ) -> ExecutionResult:
        return ExecutionResult(
            success=True,
            sandbox_id=box.sandbox_id,
            stdout=output,
            stderr="",
            exit_code=0,
            execution_time=round(elapsed_s, 6),
            error=None,
            status="ok",
            language=language,
            runtime=box.runtime,
        )

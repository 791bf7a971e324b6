"""The machinery behind ``@sandbox``: a private event loop in a daemon thread.

Sandboxes talk to harombe over streams bound to one event loop, and plain synchronous code has
none. So every ``@sandbox`` call, sync or async, runs on one private loop in a daemon thread
(``harombe-sandbox-loop``), started on the first call. The loop owns one
:class:`~harombe.security.docker_manager.DockerManager` and one
:class:`~harombe.security.sandbox_manager.SandboxManager` per distinct ``(memory_mb, cpus)``
and install cache on or off, each with its own warm pool (the manager's limits are its own),
started on first use. On top of each manager's pool the runner keeps :data:`READY_SIZE`
*prepared* sandboxes per dependency set: claimed from the pool, with cloudpickle written and
imported (see :mod:`harombe.decorator_wire`), having run nothing else; a call takes one
(refilled in the background) and it is removed after that one call. Sandboxes with network
are made per call.

Nothing is made ahead of need until a second call asks for the same kind of sandbox: the
first call boots its own sandbox, and the managers' pools are lazy (see
:class:`~harombe.security.runtime.pool.WarmPool`), so a script that makes one call starts
one sandbox and has no refill to wait for at exit. A process cannot know whether more calls
will come; the second one says so, and from the third on calls find prepared sandboxes.

A synchronous caller blocks on a future of that loop, so calling a decorated function from
inside a running event loop (Jupyter, an ``async def``) does not deadlock; an asynchronous
caller awaits the same future from its own loop.

At interpreter exit every manager is stopped, so no container outlives the process. This runs
among ``threading``'s exit hooks, registered after the thread pool of the Docker backend was
imported: they run in reverse order, so the Docker calls that remove the containers are made
before that pool refuses new work.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import structlog

from harombe.config import HarombeConfig, load_config
from harombe.decorator_wire import LIBRARY_PATH, WARMUP_CODE, library_zip
from harombe.errors import (
    DependencyInstallError,
    HarombeError,
    InfrastructureError,
    PackageFetchError,
    PackageSpecError,
    SandboxStartupError,
    UsageError,
)
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.docker import DockerManager
from harombe.security.runtime.manager import SandboxManager
from harombe.security.runtime.tasks import settle

log = structlog.get_logger(__name__)

T = TypeVar("T")
THREAD_NAME = "harombe-sandbox-loop"
#: How long the exit hook waits for the managers to remove their containers.
SHUTDOWN_TIMEOUT_S = 60.0
#: Prepared sandboxes kept ready per manager.
READY_SIZE = 2
#: Longest a prepared sandbox's warm-up (its imports) may take, seconds.
WARMUP_TIMEOUT_S = 60.0
ManagerKey = tuple[int, float, bool]  # memory_mb, cpus, install cache on
ReadyKey = tuple[SandboxManager, tuple[str, ...]]  # a manager, a dependency set


class Runner:
    """One private loop and the managers on it; see the module docstring."""

    def __init__(
        self,
        config: HarombeConfig | None = None,
        *,
        docker_factory: Callable[[], DockerBackend] = DockerManager,
    ) -> None:
        """``config`` as :class:`SandboxManager` takes it; ``docker_factory`` makes the Docker
        backend, on the private loop (tests pass :class:`~harombe.testing.FakeDocker`)."""
        self.config = config
        self.docker_factory = docker_factory
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._docker: DockerBackend | None = None
        self._managers: dict[ManagerKey, asyncio.Task[SandboxManager]] = {}
        self._background: set[asyncio.Task[None]] = set()
        # By manager and dependency set (an environment, from its own pool): id, when prepared.
        self._ready: dict[ReadyKey, list[tuple[str, float]]] = {}
        self._claims: dict[ReadyKey, int] = {}  # calls so far: the second starts the refills
        self._fills: dict[ReadyKey, asyncio.Task[None]] = {}
        self._docker_lock = asyncio.Lock()
        self._closed = False

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def loop(self) -> asyncio.AbstractEventLoop:
        """The private loop, started (with its exit hook) on first use."""
        with self._lock:
            if self._closed:
                raise UsageError("the @sandbox runner was shut down; configure() makes a new one")
            if self._loop is None:
                if sys.is_finalizing():
                    raise UsageError(
                        "a @sandbox function was first called while the interpreter is exiting "
                        "(from an exit hook); call it before exit instead"
                    )
                try:  # the exit hook first: threading refuses it once the interpreter exits
                    _register_exit(self.shutdown)
                except RuntimeError as err:
                    raise UsageError(
                        f"a @sandbox function was first called while the interpreter is "
                        f"exiting ({err}); call it before exit instead"
                    ) from None
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_run_forever, args=(loop,), name=THREAD_NAME, daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                log.info("sandbox_decorator.loop_started")
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the private loop."""
        try:
            loop = self.loop()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and block until it is done (for sync callers)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError(
                "a synchronous @sandbox function was called on harombe's own sandbox loop "
                "(from an approver or a callback), where it would wait for itself; call it "
                "from another thread, or use sandbox_async and await it"
            )
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt: the call is cancelled, its sandbox removed
            raise

    async def manager(
        self, memory_mb: int, cpus: float, *, install_cache: bool = True
    ) -> SandboxManager:
        """The started manager for these limits (on the private loop), made once; with
        ``install_cache=False``, one whose installs bypass the host's install cache."""
        self._check_open()
        key = (memory_mb, float(cpus), install_cache)
        task = self._managers.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._start_manager(memory_mb, cpus, install_cache))
            self._managers[key] = task
        return await asyncio.shield(task)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(
                "the @sandbox runner was shut down (configure() or shutdown()) during this "
                "call; call the function again"
            )

    async def _start_manager(
        self, memory_mb: int, cpus: float, install_cache: bool
    ) -> SandboxManager:
        try:
            async with self._docker_lock:
                if self._docker is None or not self._docker.started:
                    docker = self.docker_factory()
                    await docker.start()
                    self._docker = docker
            config = self.config
            if not install_cache:
                config = (config or load_config()).model_copy(deep=True)
                config.security.sandbox.install_cache.enabled = False
            manager = SandboxManager(
                self._docker,
                max_memory_mb=memory_mb,
                max_cpu_cores=cpus,
                config=config,
                lazy_pool=True,
            )
            await manager.start()
        except InfrastructureError as err:
            raise SandboxStartupError(
                f"cannot start sandboxes for @sandbox functions: {err}"
            ) from err
        log.info("sandbox_decorator.manager_started", memory_mb=memory_mb, cpus=cpus)
        return manager

    async def claim(
        self,
        manager: SandboxManager,
        allowed_domains: Sequence[str] = (),
        dependencies: Sequence[str] = (),
    ) -> str:
        """A prepared sandbox for one call: a ready one, else one prepared now (with network:
        always prepared now, with ``allowed_domains``). With ``dependencies``, a sandbox of
        that dependency environment (claimed from its pool; built on first use)."""
        self._check_open()
        deps = tuple(dependencies)
        if allowed_domains:
            return await self._prepared(manager, allowed_domains, deps)
        key = (manager, deps)
        ready = self._ready.setdefault(key, [])
        self._claims[key] = claims = self._claims.get(key, 0) + 1
        max_age_s = manager.sandbox_config.pool.max_age_s
        try:
            while ready:
                sandbox_id, made = ready.pop(0)
                if sandbox_id in manager.sandboxes and time.monotonic() - made < max_age_s:
                    return sandbox_id
                self.discard(manager, {sandbox_id})
            return await self._prepared(manager, (), deps)
        finally:
            if claims > 1:  # a one-call process prepares nothing it will not use
                self._refill(key)

    async def _prepared(
        self, manager: SandboxManager, allowed_domains: Sequence[str], deps: tuple[str, ...]
    ) -> str:
        # The library is made (once per process) while the sandbox boots; a failure of its
        # own is raised below, never left unretrieved when the boot fails first.
        library = asyncio.ensure_future(asyncio.to_thread(library_zip))
        library.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            box = await manager.create_sandbox(
                "python", network_enabled=bool(allowed_domains),
                allowed_domains=list(allowed_domains), environment=list(deps) if deps else None,
            )  # fmt: skip
        except (PackageSpecError, PackageFetchError) as err:
            raise DependencyInstallError(
                f"the dependencies {', '.join(deps)} did not install: {err}"
            ) from err
        except InfrastructureError as err:
            raise SandboxStartupError(f"no sandbox for a @sandbox function: {err}") from err
        try:
            await manager.write_file(box.sandbox_id, LIBRARY_PATH, await library)
            done = await manager.execute(box.sandbox_id, WARMUP_CODE, timeout_s=WARMUP_TIMEOUT_S)
        except BaseException:
            self.discard(manager, {box.sandbox_id})
            raise
        if not done.success or done.sandbox_id != box.sandbox_id:
            self.discard(manager, {box.sandbox_id, done.sandbox_id})
            raise SandboxStartupError(
                f"a sandbox for a @sandbox function could not import cloudpickle "
                f"({done.status}): {(done.error or done.stderr)[-500:]}"
            )
        return box.sandbox_id

    def _refill(self, key: ReadyKey) -> None:
        task = self._fills.get(key)
        if (task is None or task.done()) and not self._closed:
            self._fills[key] = asyncio.ensure_future(self._fill(key))

    async def _fill(self, key: ReadyKey) -> None:
        manager, deps = key
        ready = self._ready.setdefault(key, [])
        try:
            while len(ready) < READY_SIZE:
                sandbox_id = await self._prepared(manager, (), deps)
                ready.append((sandbox_id, time.monotonic()))
        except HarombeError as err:  # the next call prepares its own and reports why
            log.warning("sandbox_decorator.refill_failed", error=str(err))

    async def settled(self) -> None:
        """Wait until every manager's ready sandboxes and warm pool are refilled and removals
        are done (benchmarks and tests)."""
        await asyncio.gather(*self._background, *self._fills.values(), return_exceptions=True)
        for task in list(self._managers.values()):
            if task.done() and not task.cancelled() and task.exception() is None:
                await task.result().wait_pool_settled()

    def discard(self, manager: SandboxManager, sandbox_ids: set[str]) -> None:
        """Remove a call's sandboxes in the background (the call's answer does not wait)."""
        task = asyncio.ensure_future(self._destroy(manager, sandbox_ids))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _destroy(manager: SandboxManager, sandbox_ids: set[str]) -> None:
        live = [sandbox_id for sandbox_id in sandbox_ids if sandbox_id in manager.sandboxes]
        await asyncio.gather(*(settle(manager.destroy_sandbox(sid)) for sid in live))

    async def _stop_all(self) -> None:
        for fill in self._fills.values():
            fill.cancel()
        await asyncio.gather(*self._fills.values(), *self._background, return_exceptions=True)
        self._ready.clear()
        tasks = list(self._managers.values())
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        started = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
        # Side by side: each manager's removals are Docker's work, not this loop's.
        stops = await asyncio.gather(
            *(settle(manager.stop()) for manager in started), return_exceptions=True
        )
        for failed in (stop for stop in stops if isinstance(stop, Exception)):
            log.warning("sandbox_decorator.stop_failed", error=str(failed))
        self._managers.clear()
        if self._docker is not None and self._docker.started:
            await settle(self._docker.stop())

    def shutdown(self) -> None:
        """Stop every manager (removing its containers) and the loop; idempotent."""
        with self._lock:
            loop, thread, self._closed = self._loop, self._thread, True
            self._loop = None
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop_all(), loop).result(SHUTDOWN_TIMEOUT_S)
        except (HarombeError, TimeoutError, concurrent.futures.CancelledError) as err:
            log.warning("sandbox_decorator.shutdown_failed", error=str(err))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
        log.info("sandbox_decorator.stopped")


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def _register_exit(hook: Any) -> None:
    """Run ``hook`` at interpreter exit, before the thread pools stop taking work."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # not CPython's threading: the ordinary exit hooks
        atexit.register(hook)
    else:
        register(hook)

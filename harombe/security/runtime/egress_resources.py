"""What all egress proxies of this process share: the resolver threads and the connection
budget derived from the file-descriptor limit.

Standard library only, like the proxy itself. A lookup runs on :data:`RESOLVER_THREADS`
threads of their own (never the default executor: a hanging resolver must not stall harombe's
other blocking work). Every proxied connection takes up to two file descriptors, so the
process-wide :class:`ConnectionBudget` is half of what :func:`raise_fd_limit` leaves after
:data:`FD_RESERVE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

log = structlog.get_logger(__name__)

#: Threads that resolve names for every proxy of this process: a pool of their own, so slow
#: lookups never hold the default executor the rest of harombe uses.
RESOLVER_THREADS = 64
#: File descriptors kept back from proxied connections for everything else harombe does.
FD_RESERVE = 512
#: A soft ``RLIMIT_NOFILE`` below this after raising it is logged as too low.
MIN_FD_LIMIT = 4096

#: ``resolver(host, port)`` → the addresses of ``host``; raises OSError (or ValueError) when
#: the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]

_resolver_pool: ThreadPoolExecutor | None = None


def _getaddrinfo(host: str, port: int) -> list[str]:
    """The blocking lookup (a seam for tests that stand in for a slow resolver)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def system_resolver(host: str, port: int) -> list[str]:
    """Addresses of ``host`` from this machine's resolver, on the resolver threads."""
    global _resolver_pool
    if _resolver_pool is None:
        _resolver_pool = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="harombe-dns")
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_resolver_pool, _getaddrinfo, host, port)


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the resulting soft limit.

    Logs ``egress.fd_limit_low`` (with the fix) when it stays under :data:`MIN_FD_LIMIT`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("egress.fd_limit_raised", soft=target, was=soft)
            soft = target
    if soft != resource.RLIM_INFINITY and soft < MIN_FD_LIMIT:
        log.warning(
            "egress.fd_limit_low", soft=soft, hard=hard, minimum=MIN_FD_LIMIT,
            fix="raise the open-files limit (ulimit -n, LimitNOFILE=) for the harombe process",
        )  # fmt: skip
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


class ConnectionBudget:
    """How many proxied connections all proxies of this process may hold together; each takes
    up to two file descriptors (client and origin). Not thread-safe: one event loop uses it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self.in_use = 0

    @classmethod
    def from_fd_limit(cls, fd_limit: int) -> ConnectionBudget:
        """The budget for a process whose soft fd limit is ``fd_limit``."""
        return cls((fd_limit - FD_RESERVE) // 2)

    def acquire(self) -> bool:
        """Take one slot; False (and nothing taken) when the budget is spent."""
        if self.in_use >= self.capacity:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        """Give back a slot :meth:`acquire` took."""
        self.in_use -= 1

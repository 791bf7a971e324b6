"""Runs the host's pip / npm for package downloads: unprivileged, in a private directory.

Contract of :class:`FetchArea`:

* Every program runs as an unprivileged user (``nobody`` when harombe runs as root; otherwise
  harombe's own user), with no supplementary groups, umask 077, stdin closed, its own process
  group (killed as a whole on timeout or cancellation), and an environment built from
  scratch: ``PATH``, locale, proxy and CA-bundle variables and whatever the caller adds.
  ``HOME`` and ``TMPDIR`` point into the area, so nothing of the user's home (caches,
  credentials) is read or written.
* The area's top directory belongs to harombe's user (mode 0711). A run gets a work directory
  of its own that is handed to the download user for the run and taken back (owner root, mode
  0700) as soon as the program exits, so what harombe then reads cannot be changed under it;
  whatever is left of the run's process group is killed then too. Ownership is only ever
  changed through descriptors opened without following links: a symlink the download user
  planted in its own directory (``home`` -> ``/etc``) is refused, never chowned through.
* Every file a run writes is capped at :data:`FILE_MAX_BYTES` (``RLIMIT_FSIZE``), so one
  hostile download cannot fill the host's disk with a single file.
* Everything is deleted when the area closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import resource
import shutil
import signal
import stat
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog

from harombe.errors import PackageFetchError

log = structlog.get_logger(__name__)

#: Who runs the download tools when harombe itself runs as root.
DOWNLOAD_USER = "nobody"
NOBODY_ID = 65534
RUN_TIMEOUT_S = 600.0
OUTPUT_TAIL_LINES = 12
#: Largest file a download tool may write (the biggest wheels on public indexes are ~1 GB).
FILE_MAX_BYTES = 2 << 30
#: Environment passed through to pip / npm: locale, proxies and CA bundles — never PYTHON*,
#: NODE_OPTIONS or anything else that could load code into the download tool.
PASSTHROUGH_ENV = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)  # fmt: skip


@dataclass(frozen=True)
class Identity:
    """The user a download runs as; ``uid is None`` means harombe's own (non-root) user."""

    uid: int | None
    gid: int | None

    @property
    def label(self) -> str:
        return "the current user" if self.uid is None else f"uid {self.uid}"


def download_identity() -> Identity:
    """``nobody`` when running as root (uid 65534 if there is no such entry), else ourselves."""
    if os.geteuid() != 0:
        return Identity(None, None)
    try:
        entry = pwd.getpwnam(DOWNLOAD_USER)
    except KeyError:
        return Identity(NOBODY_ID, NOBODY_ID)
    return Identity(entry.pw_uid, entry.pw_gid)


def base_env(home: Path) -> dict[str, str]:
    """A fresh environment for a download tool whose home is ``home``."""
    env = {k: v for k in PASSTHROUGH_ENV if (v := os.environ.get(k)) is not None}
    env.setdefault("PATH", os.defpath)
    env.update(HOME=str(home), TMPDIR=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    return env


class FetchArea:
    """A private directory tree for one package download (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.identity = download_identity()
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        # 0711: the download user may pass through to its own work directory, nothing more.
        os.chmod(self.root, 0o711)
        self._count = 0

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def new_dir(self, name: str) -> Path:
        """A work directory owned by harombe (0700), to lend to runs with :meth:`run`."""
        self._count += 1
        path = self.root / f"{self._count:03d}-{name}"
        path.mkdir(mode=0o700)
        (path / "home").mkdir(mode=0o700)
        return path

    def _lend(self, path: Path, give: Sequence[str]) -> None:
        """Hand ``path``, its ``home`` and the regular files named in ``give`` to the download
        user, through descriptors opened without following links (see the module docstring)."""
        if self.identity.uid is None:
            return
        for rel, want_dir in ((".", True), ("home", True), *((g, False) for g in give)):
            replaced = PackageFetchError(
                f"{path / rel} was replaced by something else during a download; refused (a "
                "download tool may only write its own files)"
            )
            try:
                fd = os.open(path / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:  # a symlink (ELOOP), or gone
                raise replaced from None
            try:
                mode = os.fstat(fd).st_mode
                if not (stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)):
                    raise replaced
                os.fchown(fd, self.identity.uid, self.identity.gid or NOBODY_ID)
            finally:
                os.close(fd)

    def _reclaim(self, path: Path, pid: int | None = None) -> None:
        if pid is not None:  # nothing of the run survives it to change what harombe reads
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if self.identity.uid is None:
            return
        os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(path, 0o700, follow_symlinks=False)

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        timeout_s: float = RUN_TIMEOUT_S,
        give: Sequence[str] = (),
        on_line: Callable[[str], Awaitable[None]] | None = None,
    ) -> tuple[int, str]:
        """Run ``argv`` in ``cwd`` as the download user; its exit code and combined output.
        ``give`` names files harombe wrote in ``cwd`` that the tool may change; ``on_line``
        is given each line of output as it is printed (the whole output is returned too)."""
        self._lend(cwd, give)
        ident, cap = self.identity, FILE_MAX_BYTES
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(cwd),
                env=dict(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
                umask=0o077,
                user=ident.uid,
                group=ident.gid,
                extra_groups=[] if ident.uid is not None else None,
                # One system call in the child before exec: no locks, safe beside threads.
                preexec_fn=partial(resource.setrlimit, resource.RLIMIT_FSIZE, (cap, cap)),
            )
        except PermissionError as exc:  # the download user may not execute this program
            self._reclaim(cwd)
            return 126, f"{exc} (as {ident.label})"
        except FileNotFoundError:
            self._reclaim(cwd)
            raise PackageFetchError(
                f"{argv[0]} is not installed on the host; harombe downloads packages with the "
                f"host's {Path(argv[0]).name} (install it, e.g. `apt-get install npm`)"
            ) from None
        try:
            out = await asyncio.wait_for(_collect(proc, on_line), timeout_s)
        except TimeoutError:
            await _stop(proc)
            self._reclaim(cwd, proc.pid)
            raise PackageFetchError(
                f"{Path(argv[0]).name} did not finish within {timeout_s:.0f}s; check the "
                "host's network and package index configuration"
            ) from None
        except asyncio.CancelledError:
            await _stop(proc)
            self._reclaim(cwd, proc.pid)
            raise
        self._reclaim(cwd, proc.pid)
        text = out.decode("utf-8", "replace")
        log.debug("package.tool_ran", tool=Path(argv[0]).name, exit_code=proc.returncode,
                  user=ident.label)  # fmt: skip
        return proc.returncode if proc.returncode is not None else -1, text


#: Longest line handed to ``on_line``; the rest of a longer one is dropped (not the output).
LINE_MAX_BYTES = 16384


async def _collect(
    proc: asyncio.subprocess.Process, on_line: Callable[[str], Awaitable[None]] | None
) -> bytes:
    """The process's whole output, read as it comes (``on_line`` gets each line), once it
    has exited."""
    assert proc.stdout is not None
    chunks: list[bytes] = []
    pending = b""
    while data := await proc.stdout.read(65536):
        chunks.append(data)
        if on_line is None:
            continue
        *lines, pending = (pending + data).split(b"\n")
        pending = pending[:LINE_MAX_BYTES]
        for line in lines:
            await on_line(line[:LINE_MAX_BYTES].decode("utf-8", "replace"))
    if on_line is not None and pending:
        await on_line(pending.decode("utf-8", "replace"))
    await proc.wait()
    return b"".join(chunks)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Kill the tool and everything in its process group. The group id cannot have been
    reused: either the tool has not been reaped yet, or members of its group still hold its
    output pipe open (which is why the call had not returned)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.shield(proc.wait())


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    """The last ``lines`` lines of a tool's output, for error messages."""
    return "\n".join(text.strip().splitlines()[-lines:])


def memfd_with(content: bytes, name: str) -> int:
    """An anonymous in-memory file holding ``content``, to hand a tool as ``/proc/self/fd/N``.

    Used for configuration the download user may not read from disk (root's ``~/.npmrc``):
    the content reaches the tool without ever being written to a file."""
    fd = os.memfd_create(name)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd

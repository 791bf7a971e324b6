"""Processes for the in-sandbox supervisor: the user's ids, child set-up, memory probes.

The third part of the supervisor's source (see ``__init__.py``). User code runs as
``$HAROMBE_RUN_AS`` (uid:gid) with no capabilities: :func:`child_setup` makes a freshly forked
child that, and :class:`AsUser` gives file operations the user's effective ids. The memory
probes measure what user code holds, for the runs' memory limit.
"""

import os
import resource
import signal
import sys


def run_as():
    """(uid, gid) for user code, or None when we are not root and so cannot switch."""
    spec = os.environ.get("HAROMBE_RUN_AS", "")
    if not spec or os.getuid() != 0:
        return None
    uid, _, gid = spec.partition(":")
    return int(uid), int(gid or uid)


RUN_AS = run_as()
#: gVisor keeps a process dumpable across setuid; Linux does not (see Worker).
GVISOR = os.environ.get("HAROMBE_RUNTIME", "runsc").startswith("runsc")


class AsUser:
    """File operations with the user's effective ids: files they create belong to the user,
    and the kernel's permission checks are the user's, not root's."""

    def __enter__(self):
        if RUN_AS:
            os.setegid(RUN_AS[1])
            os.seteuid(RUN_AS[0])

    def __exit__(self, *exc):
        if RUN_AS:
            os.seteuid(0)
            os.setegid(0)


def drop_privileges():
    """In a child about to exec user code: become the user for good, capabilities gone."""
    if RUN_AS:
        uid, gid = RUN_AS
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def set_dumpable(value):
    """PR_SET_DUMPABLE: 0 makes a process untraceable and its /proc entries root's."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, value, 0, 0, 0)
    except Exception as exc:  # pragma: no cover - logged for the host, never fatal
        sys.stderr.write("harombe-supervisor: prctl failed: %r\n" % (exc,))


def harden():
    """Make this process untraceable (no ptrace, no /proc/1/fd) even by same-uid code."""
    set_dumpable(0)


def rss_bytes_of_others():
    """Resident memory of every process but this one, summed (shared pages count each time)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        try:
            with open("/proc/%s/statm" % name, "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


#: Largest mount a file area may have to be counted as files rather than memory: gVisor shows an
#: unsized tmpfs as petabytes, and bytes there are bounded by nothing but memory.
FILE_MOUNT_MAX_BYTES = 1 << 44
#: Mounts that are shared memory, not a file area: their bytes are memory like any other.
MEMORY_MOUNTS = ("/dev/shm", "/dev", "/run/shm")
FILE_MOUNTS = []  # filled on first use by file_mounts()


def file_mounts():
    """The sized tmpfs mounts user files live in (/workspace, home, /tmp): capped by their own
    size and by the container's backstop, so their bytes are not counted as user memory."""
    if not FILE_MOUNTS:
        found = []
        try:
            with open("/proc/mounts", "rb") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[2] == b"tmpfs" and b"size=" in fields[3]:
                        path = fields[1].decode("utf-8", "replace")
                        if path not in MEMORY_MOUNTS:
                            found.append(path)
        except OSError:
            pass
        FILE_MOUNTS[:] = found or [""]  # [""]: looked, found none
    return [m for m in FILE_MOUNTS if m]


def file_mount_bytes():
    total = 0
    for path in file_mounts():
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        if st.f_blocks * st.f_frsize <= FILE_MOUNT_MAX_BYTES:
            total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


def sandbox_anon_bytes():
    """Every byte user code holds in memory, in the whole sandbox.

    Under gVisor /proc/meminfo describes the sandbox, not the host, and counts a page shared by
    forked processes once. Its ``AnonPages`` is anonymous memory plus every memory-backed file
    (``Shmem``: tmpfs, /dev/shm, memfd_create, shared anonymous mappings). All of that is
    memory, except the files of the sized file areas (/workspace, home, /tmp), which their own
    size caps: those bytes (statvfs) are subtracted, and nothing else is.
    """
    anon = shmem = 0
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            key, _, rest = line.partition(b":")
            if key == b"AnonPages":
                anon = int(rest.split()[0]) * 1024
            elif key == b"Shmem":
                shmem = int(rest.split()[0]) * 1024
    if shmem:  # only then can a file area hold anything worth a statvfs each
        anon -= min(shmem, file_mount_bytes())
    return max(anon, 0)


MEMORY_PROBES = {"meminfo": sandbox_anon_bytes, "rss": rss_bytes_of_others}


def child_setup(nproc, own_session=True):
    """In a freshly forked child that will run user code: own session (or, for a session
    interpreter, own process group in ours), default signals, the OOM killer's first choice,
    the user's ids, and its process limit.

    A session interpreter is stopped between calls while the sweep kills its children. Under
    gVisor a process group with no member whose parent is in another group of the same
    session counts as orphaned whenever a member leaves it, and an orphaned group with a
    stopped member gets SIGHUP and SIGCONT: in a session of its own, the interpreter would be
    killed, or (SIGHUP ignored) continued between calls. In our session, with us as its
    parent in another group, its group is never orphaned."""
    if own_session:
        os.setsid()
    else:
        os.setpgid(0, 0)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                signal.SIGHUP):  # fmt: skip
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:  # make user code the OOM killer's first choice, never the supervisor
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    drop_privileges()
    # gVisor (release 20221219) admits one process past RLIMIT_NPROC: ask for one fewer so
    # user code gets at most max_pids processes and threads in all.
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc - 1, nproc - 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

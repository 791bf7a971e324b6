"""The supervisor that runs as PID 1 inside every sandbox.

Standard library only, Python >= 3.8. The host passes the supervisor's source as
``python3 -I -S -c``, so it lives in the supervisor's memory and nothing in the sandbox can
rewrite it. That source is five files run as one module, in this order: ``supervisor_io.py``
(JSON and epoll without costly imports), ``supervisor_files.py`` (file operations),
``supervisor_runs.py`` (fresh-process runs), ``supervisor_sessions.py`` (session interpreters;
its ``SessionRun`` extends ``supervisor_runs.Supervised``) and this file, whose ``main()`` runs
last; other names defined in one part are used by the others at call time. It talks to the host over the container's
attached stdin/stdout in frames::

    [u32 json_len][u32 blob_len][json object][blob bytes]        (big-endian lengths)

Host → supervisor ops: ``run`` (argv, env, cwd, stdin blob, timeout_s, grace_s,
max_output_bytes, max_memory_mb, stream; ``session`` and ``language`` to run the blob as code in
the session interpreter instead), ``warm`` (start a session interpreter), ``cancel``, ``write``,
``read``, ``list``, ``untar``, ``ping``. Replies: ``hello`` once at start, ``out`` chunks for streaming runs, ``done`` for runs
and ``result`` for everything else, each carrying the request ``id``.

Privilege separation: the supervisor runs as root with only CAP_SETUID, CAP_SETGID and
CAP_KILL; user code runs as ``$HAROMBE_RUN_AS`` (uid:gid, default 1000:1000) with no
capabilities, and file operations run with that effective uid, so what they create belongs to the
user. A different uid cannot signal, ptrace or open the fds of the supervisor, so
``os.kill(1, 9)`` or ``kill -9 -1`` in user code cannot take the channel down (this gVisor release
delivers signals to PID 1 like to any process, so being init protects nothing by itself).
``PR_SET_DUMPABLE=0`` is kept as a second lock. User code runs in its own session (a session
interpreter in its own process group of ours: see :func:`child_setup`); when a run
ends every process in the sandbox is stopped at once and all but the session interpreters
are killed (``sweep`` in ``supervisor_runs.py``), so nothing a call starts outlives the
call, and the interpreters stay stopped until their next run: between calls no user code
runs at all, so every limit binds at all times. A session interpreter runs user code, so it is untrusted too: its frames are
checked and capped, and one that breaks the protocol or keeps a thread past its call is killed
and the call reports ``state_lost`` with a warning (see ``supervisor_sessions.py``).
"""

import os
import resource
import select
import signal
import struct
import sys
import time

HEADER = struct.Struct(">II")
PROTOCOL = 1
CHUNK = 65536
POLL_S = 0.05
DRAIN_S = 5.0
FIRST_MEMORY_CHECK_S = 0.02
HARDEN_IDLE_S = 1.0
REAP_FALLBACK_S = 0.5
TRUNCATED = b"\n[OUTPUT TRUNCATED]\n"


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


def send(msg, blob=b""):
    data = dumps(msg)
    view = memoryview(HEADER.pack(len(data), len(blob)) + data + blob)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([], [1], [])
            continue
        view = view[n:]


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


def which(name, path="/usr/local/bin:/usr/bin:/bin"):
    for directory in path.split(":"):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def hello():
    # platform and shutil would answer the same, but importing them costs tens of
    # milliseconds of every cold start under gVisor.
    libc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc ").split(" ", 1)
    return {
        "op": "hello",
        "protocol": PROTOCOL,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "run_as": list(RUN_AS) if RUN_AS else None,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "machine": os.uname().machine,
        "libc": [libc[0], libc[1] if len(libc) > 1 else ""],
        "interpreters": {n: which(n) for n in ("python3", "node", "bash")},
    }


def main():
    hardened = served = reap = False
    next_reap = 0.0
    sel = Selector()
    os.set_blocking(0, False)
    sel.register(0, EVENT_READ, None)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so exits wake select()
    # User code shares our session (see child_setup): should it orphan our process group,
    # gVisor's SIGHUP must not end the supervisor.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sel.register(wake_r, EVENT_READ, "wake")
    inbox = bytearray()
    run = None
    workers = WORKERS  # language -> Worker (supervisor_sessions.py)
    prewarm = os.environ.get("HAROMBE_PREWARM", "")
    if prewarm in SESSION_LANGUAGES:
        # Started before the hello, so the interpreter boots while the host is still waiting
        # for us and sending its first request: on two cores the boot costs the call nothing.
        try:
            Worker(
                {
                    "language": prewarm,
                    "env": loads(os.environ.get("HAROMBE_USER_ENV", "{}")),
                    "max_pids": int(os.environ.get("HAROMBE_MAX_PIDS", "128")),
                    "cwd": "/workspace",
                },
                sel,
            )
        except Exception as exc:  # the first run will try again and report why
            sys.stderr.write("harombe-supervisor: prewarm failed: %r\n" % (exc,))
    send(hello())
    while True:
        events = sel.select(POLL_S if run else None if hardened else HARDEN_IDLE_S)
        for key, _ in events:
            if key.data == "wake":
                reap = True  # a signal arrived: SIGCHLD, most likely
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            elif key.data is None:
                try:
                    data = os.read(0, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:  # the host hung up: nothing left to serve
                    kill_all_others(spare_sessions=False)
                    return
                inbox += data
            else:
                owner, name = key.data
                owner.on_io(key.fd, name)
        while len(inbox) >= HEADER.size:
            jlen, blen = HEADER.unpack_from(inbox)
            if len(inbox) < HEADER.size + jlen + blen:
                break
            msg = loads(bytes(inbox[HEADER.size : HEADER.size + jlen]))
            blob = bytes(inbox[HEADER.size + jlen : HEADER.size + jlen + blen])
            del inbox[: HEADER.size + jlen + blen]
            run = handle(msg, blob, run, sel, workers)
        # Reap every exited process (we are init: orphans land here too). Only after SIGCHLD
        # woke us, or now and then as a fallback: a wait4 per loop is a syscall per loop.
        now = time.monotonic()
        if now >= next_reap:
            reap, next_reap = True, now + REAP_FALLBACK_S
        while reap:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                reap = False
                break
            if pid == 0:
                reap = False
                break
            worker = next((w for w in workers.values() if w.pid == pid), None)
            if worker is not None:
                worker.died(status)  # and it leaves WORKERS
            elif isinstance(run, Run) and pid == run.pid:
                run.reaped(status, rusage)
        if run is not None:
            run.tick(time.monotonic())
            if run.finished():
                run.report()
                run = None
                served = True
        if not hardened and run is None and not inbox and (served or not events):
            # Deferred off the cold-start path (ctypes costs ~50 ms to import here): done after
            # the first run, or once the sandbox has idled for HARDEN_IDLE_S. Until then user
            # code, a different uid, is kept out of this process by uid checks.
            harden()
            hardened = True


def handle(msg, blob, run, sel, workers):
    op, rid = msg.get("op"), msg.get("id")
    if "worker_source" in msg:  # sent once per sandbox; kept for every later Node start
        JS_WORKER[0] = msg.pop("worker_source")
    if op == "run":
        if run is not None:
            fail(rid, "Busy", "a run is active")
            return run
        try:
            if msg.get("session") and msg.get("language") in SESSION_LANGUAGES:
                worker = workers.get(msg["language"])
                if worker is None:
                    worker = Worker(msg, sel)  # registers itself in WORKERS
                return SessionRun(rid, msg, blob, worker)
            return Run(rid, msg, blob, sel)
        except Refused as exc:
            fail(rid, exc.kind, str(exc))
        return None
    if op == "cancel":
        if run is not None and run.rid == msg.get("target"):
            run.stop("cancelled", time.monotonic())
        send({"op": "result", "id": rid, "ok": True})
        return run
    if op == "warm":  # start the session interpreter ahead of the first run (warm pool)
        try:
            if msg.get("language") in SESSION_LANGUAGES and msg["language"] not in workers:
                Worker(msg, sel)  # registers itself in WORKERS
            send({"op": "result", "id": rid, "ok": True})
        except Exception as exc:
            fail(rid, type(exc).__name__, str(exc))
        return run
    if op == "ping":
        send({"op": "result", "id": rid, "ok": True})
        return run
    fn = FILE_OPS.get(op)
    if fn is None:
        fail(rid, "UnknownOp", repr(op))
        return run
    try:
        with AsUser():
            reply, data = fn(msg, blob)
        reply.update({"op": "result", "id": rid, "ok": True})
        send(reply, data)
    except Refused as exc:
        fail(rid, exc.kind, str(exc))
    except OSError as exc:
        fail(rid, type(exc).__name__, "%s: %s" % (msg.get("path"), exc.strerror))
    except ValueError as exc:
        fail(rid, type(exc).__name__, str(exc))
    return run


def fail(rid, kind, message):
    """The ``result`` reply of a request that failed."""
    send({"op": "result", "id": rid, "ok": False, "error": kind, "message": message})


if __name__ == "__main__":
    main()

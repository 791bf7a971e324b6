"""The supervisor that runs as PID 1 inside every sandbox.

Standard library only, Python >= 3.8. The host passes this file's source as ``python3 -I -S -c``,
so it lives in the supervisor's memory and nothing in the sandbox can rewrite it. It talks to the
host over the container's attached stdin/stdout in frames::

    [u32 json_len][u32 blob_len][json object][blob bytes]        (big-endian lengths)

Host → supervisor ops: ``run`` (argv, env, cwd, stdin blob, timeout_s, grace_s,
max_output_bytes, max_memory_mb, stream), ``cancel``, ``write``, ``read``, ``list``, ``untar``,
``ping``. Replies: ``hello`` once at start, ``out`` chunks for streaming runs, ``done`` for runs
and ``result`` for everything else, each carrying the request ``id``.

Privilege separation: the supervisor runs as root with only CAP_SETUID, CAP_SETGID and
CAP_KILL; user code runs as ``$HAROMBE_RUN_AS`` (uid:gid, default 1000:1000) with no
capabilities, and file operations run with that effective uid, so what they create belongs to the
user. A different uid cannot signal, ptrace or open the fds of the supervisor, so
``os.kill(1, 9)`` or ``kill -9 -1`` in user code cannot take the channel down (this gVisor release
delivers signals to PID 1 like to any process, so being init protects nothing by itself).
``PR_SET_DUMPABLE=0`` is kept as a second lock. User code runs in its own session; when a run
ends every other process in the sandbox is killed, so nothing a call starts outlives the call.
"""

import json
import os
import resource
import select
import selectors
import signal
import stat
import struct
import sys
import time

HEADER = struct.Struct(">II")
PROTOCOL = 1
CHUNK = 65536
POLL_S = 0.05
DRAIN_S = 5.0
FIRST_MEMORY_CHECK_S = 0.02
TRUNCATED = b"\n[OUTPUT TRUNCATED]\n"


class Refused(Exception):
    """A file operation that is refused; ``kind`` becomes the host-side error."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def run_as():
    """(uid, gid) for user code, or None when we are not root and so cannot switch."""
    spec = os.environ.get("HAROMBE_RUN_AS", "")
    if not spec or os.getuid() != 0:
        return None
    uid, _, gid = spec.partition(":")
    return int(uid), int(gid or uid)


RUN_AS = run_as()


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
    data = json.dumps(msg, separators=(",", ":")).encode()
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


def sandbox_anon_bytes():
    """Anonymous memory of the whole sandbox, tmpfs files excluded.

    Under gVisor /proc/meminfo describes the sandbox, not the host, and counts a page shared by
    forked processes once, which is what a memory limit should count.
    """
    fields = {}
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            key, _, rest = line.partition(b":")
            if key in (b"AnonPages", b"Shmem"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields.get(b"AnonPages", 0) - fields.get(b"Shmem", 0)


MEMORY_PROBES = {"meminfo": sandbox_anon_bytes, "rss": rss_bytes_of_others}


#: Session interpreters (see supervisor_sessions.py): spared by the sweeps that end a call.
PROTECTED = set()


def kill_all_others(sig=signal.SIGKILL, spare_sessions=True):
    """Signal every process in the sandbox except PID 1 (ourselves) and, unless told
    otherwise, the session interpreters. Returns whether any process was signalled."""
    if not (spare_sessions and PROTECTED):
        try:
            os.kill(-1, sig)
            return True
        except ProcessLookupError:
            return False
    found = False
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1" and int(name) not in PROTECTED:
            try:
                os.kill(int(name), sig)
                found = True
            except (ProcessLookupError, PermissionError):
                pass
    return found


def child_setup(nproc):
    """In a freshly forked child that will run user code: own session, default signals, the
    OOM killer's first choice, the user's ids, and its process limit."""
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
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


class Output:
    """The captured stdout/stderr of one run: capped in bytes, streamed if asked."""

    def __init__(self, rid, cap, stream):
        self.rid = rid
        self.cap = cap
        self.stream = stream
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.total = {"stdout": 0, "stderr": 0}

    def feed(self, name, data):
        self.total[name] += len(data)
        buf = self.out[name]
        room = self.cap - len(buf)
        if room > 0:  # beyond the cap the bytes are read and dropped: memory stays bounded
            kept = data[:room]
            buf += kept
            if self.stream:
                send({"op": "out", "id": self.rid, "stream": name}, bytes(kept))

    def fields(self):
        out, err = bytes(self.out["stdout"]), bytes(self.out["stderr"])
        return {
            "stdout_len": len(out),
            "stderr_len": len(err),
            "stdout_total": self.total["stdout"],
            "stderr_total": self.total["stderr"],
        }, out + err


class Run:
    """One supervised child process and everything it started."""

    def __init__(self, rid, msg, stdin_data, sel):
        self.rid = rid
        self.sel = sel
        self.output = Output(rid, int(msg["max_output_bytes"]), bool(msg.get("stream")))
        self.max_rss = int(msg["max_memory_mb"]) * 1048576
        self.memory_probe = MEMORY_PROBES[msg.get("memory_probe", "rss")]
        self.grace_s = float(msg.get("grace_s", 2.0))
        self.started = time.monotonic()
        self.deadline = self.started + float(msg["timeout_s"])
        self.kill_at = None
        self.status = None  # set when we decide to stop it: timeout, oom, cancelled
        self.exit_code = None
        self.term_signal = None
        self.cpu_s = 0.0
        self.peak_rss = 0
        # /proc/meminfo costs most of a millisecond here; short runs never need it.
        self.next_mem_check = self.started + FIRST_MEMORY_CHECK_S
        self.open_streams = set()
        self.stdin_view = memoryview(stdin_data)
        self.stdin_fd = None
        self.drain_deadline = None
        self.pid = self._spawn(msg)

    def _spawn(self, msg):
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        exec_r, exec_w = os.pipe()
        argv = [str(a) for a in msg["argv"]]
        env = {str(k): str(v) for k, v in msg.get("env", {}).items()}
        cwd = msg.get("cwd", "/workspace")
        nproc = int(msg.get("max_pids", 128))
        pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                child_setup(nproc)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            except BaseException as exc:  # report why exec failed, then die
                try:
                    os.write(exec_w, ("%s: %s" % (type(exc).__name__, exc)).encode())
                finally:
                    os._exit(127)
        for fd in (in_r, out_w, err_w, exec_w):
            os.close(fd)
        failure = b""
        while True:
            chunk = os.read(exec_r, 4096)
            if not chunk:
                break
            failure += chunk
        os.close(exec_r)
        if failure:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            os.waitpid(pid, 0)
            raise Refused("ExecFailed", "could not start %s: %s" % (argv[0], failure.decode()))
        for fd, name in ((out_r, "stdout"), (err_r, "stderr")):
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, (self, name))
            self.open_streams.add(fd)
        os.set_blocking(in_w, False)
        self.stdin_fd = in_w
        if self.stdin_view:
            self.sel.register(in_w, selectors.EVENT_WRITE, (self, "stdin"))
        else:
            self._close_stdin()
        return pid

    def _close_stdin(self):
        if self.stdin_fd is not None:
            try:
                self.sel.unregister(self.stdin_fd)
            except (KeyError, ValueError):
                pass
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def on_io(self, fd, name):
        if name == "stdin":
            try:
                n = os.write(fd, self.stdin_view[:CHUNK])
                self.stdin_view = self.stdin_view[n:]
            except BlockingIOError:
                return
            except OSError:  # the child closed its stdin or exited
                self.stdin_view = memoryview(b"")
            if not self.stdin_view:
                self._close_stdin()
            return
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(fd)
            os.close(fd)
            self.open_streams.discard(fd)
            return
        self.output.feed(name, data)

    def stop(self, status, now):
        """Begin stopping: SIGTERM the session now, SIGKILL everything after the grace."""
        if self.status is None:
            self.status = status
        if self.kill_at is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            self.kill_at = now + self.grace_s

    def tick(self, now):
        if self.exit_code is not None and self.open_streams:
            # Processes forked while the sweep ran escape it and keep the pipes open: sweep
            # again until they are gone; give up on the pipes after a while rather than hang.
            kill_all_others()
            if self.drain_deadline is None:
                self.drain_deadline = now + DRAIN_S
            elif now >= self.drain_deadline:
                for fd in list(self.open_streams):
                    self.sel.unregister(fd)
                    os.close(fd)
                self.open_streams.clear()
        if self.exit_code is None:
            if self.status is None and now >= self.deadline:
                self.stop("timeout", now)
            if self.kill_at is not None and now >= self.kill_at:
                kill_all_others()
            if now >= self.next_mem_check:
                self.next_mem_check = now + POLL_S
                rss = self.memory_probe()
                self.peak_rss = max(self.peak_rss, rss)
                if rss > self.max_rss and self.status is None:
                    self.status = "oom"
                    kill_all_others()

    def reaped(self, status, rusage):
        self.cpu_s = rusage.ru_utime + rusage.ru_stime
        self.peak_rss = max(self.peak_rss, rusage.ru_maxrss * 1024)
        if os.WIFSIGNALED(status):
            self.term_signal = os.WTERMSIG(status)
            self.exit_code = 128 + self.term_signal
        else:
            self.exit_code = os.WEXITSTATUS(status)
        # Nothing a run starts may outlive it; this also closes every inherited pipe end.
        kill_all_others()
        self._close_stdin()

    def finished(self):
        return self.exit_code is not None and not self.open_streams

    def report(self):
        status = self.status
        if status is None:
            status = "ok" if self.exit_code == 0 else "error"
        fields, blob = self.output.fields()
        msg = {
            "op": "done",
            "id": self.rid,
            "status": status,
            "exit_code": self.exit_code,
            "signal": self.term_signal,
            **fields,
            "duration_s": round(time.monotonic() - self.started, 6),
            "cpu_s": round(self.cpu_s, 6),
            "peak_memory_mb": round(self.peak_rss / 1048576, 2),
        }
        send(msg, blob)


def resolve(root, rel):
    """Absolute path of ``rel`` under ``root`` after following symlinks; refuse escapes."""
    if "\x00" in rel or os.path.isabs(rel):
        raise Refused("WorkspacePathError", "path %r must be relative to %s" % (rel, root))
    full = os.path.realpath(os.path.join(root, rel))
    if full != root and not full.startswith(root + "/"):
        raise Refused(
            "WorkspacePathError",
            "path %r resolves outside %s (through '..' or a symlink); refused" % (rel, root),
        )
    return full


def op_write(msg, blob):
    full = resolve(msg["root"], msg["path"])
    parent = os.path.dirname(full)
    os.makedirs(parent, exist_ok=True)
    if os.path.realpath(parent) != parent:  # a symlink was planted while we created dirs
        raise Refused("WorkspacePathError", "path %r changed while writing" % msg["path"])
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(full, flags, int(msg.get("mode", 0o644)))
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    return {"bytes": len(blob)}, b""


def op_read(msg, _blob):
    full = resolve(msg["root"], msg["path"])
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise Refused("IsADirectoryError", "%r is a directory; use list" % msg["path"])
        limit = int(msg["max_bytes"])
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused("FileTooLargeError", "%r is larger than %d bytes" % (msg["path"], limit))
    return {"bytes": len(data)}, data


def op_list(msg, _blob):
    full = resolve(msg["root"], msg["path"])
    entries = []
    with os.scandir(full) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "file"
            )
            entries.append({"name": entry.name, "type": kind, "size": st.st_size})
    entries.sort(key=lambda e: e["name"])
    return {"entries": entries}, b""


def op_untar(msg, blob):
    """Unpack a tar (made by the host) below ``root``; every member must stay inside it."""
    import io

    root = msg["root"]
    os.makedirs(root, exist_ok=True)
    import tarfile  # only package installs need it; importing it costs start-up time

    try:
        return _untar(tarfile.open(fileobj=io.BytesIO(blob), mode="r:*"), root)
    except tarfile.TarError as exc:
        raise Refused("TarError", str(exc)) from None


def _untar(tar, root):
    with tar:
        members = tar.getmembers()
        for m in members:
            target = os.path.normpath(os.path.join(root, m.name))
            bad = not (target == root or target.startswith(root + "/"))
            if m.issym():
                dest = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname))
                bad = bad or os.path.isabs(m.linkname) or not dest.startswith(root + "/")
            if bad or m.islnk() or m.isdev() or m.isfifo():
                raise Refused("WorkspacePathError", "archive member %r is not allowed" % m.name)
            m.mode &= 0o755
        tar.extractall(root, members=members)
    return {"members": len(members)}, b""


FILE_OPS = {"write": op_write, "read": op_read, "list": op_list, "untar": op_untar}


def hello():
    import platform
    import shutil

    libc, libc_version = platform.libc_ver()
    return {
        "op": "hello",
        "protocol": PROTOCOL,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "run_as": list(RUN_AS) if RUN_AS else None,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "libc": [libc, libc_version],
        "interpreters": {n: shutil.which(n) for n in ("python3", "node", "bash")},
    }


def main():
    harden()
    sel = selectors.DefaultSelector()
    os.set_blocking(0, False)
    sel.register(0, selectors.EVENT_READ, None)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so exits wake select()
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    inbox = bytearray()
    run = None
    workers = {}  # language -> Worker (supervisor_sessions.py)
    send(hello())
    while True:
        events = sel.select(POLL_S if run else None)
        for key, _ in events:
            if key.data == "wake":
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
            msg = json.loads(bytes(inbox[HEADER.size : HEADER.size + jlen]))
            blob = bytes(inbox[HEADER.size + jlen : HEADER.size + jlen + blen])
            del inbox[: HEADER.size + jlen + blen]
            run = handle(msg, blob, run, sel, workers)
        # Reap every exited process (we are init: orphans land here too).
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            worker = next((w for w in workers.values() if w.pid == pid), None)
            if worker is not None:
                worker.died(status)
                del workers[worker.language]
            elif run is not None and pid == run.pid:
                run.reaped(status, rusage)
        if run is not None:
            run.tick(time.monotonic())
            if run.finished():
                run.report()
                run = None


def handle(msg, blob, run, sel, workers):
    op, rid = msg.get("op"), msg.get("id")
    if op == "run":
        if run is not None:
            send(
                {
                    "op": "result",
                    "id": rid,
                    "ok": False,
                    "error": "Busy",
                    "message": "a run is active",
                }
            )
            return run
        try:
            if msg.get("session") and msg.get("language") in SESSION_LANGUAGES:
                worker = workers.get(msg["language"])
                if worker is None:
                    worker = workers[msg["language"]] = Worker(msg, sel)
                return SessionRun(rid, msg, blob, worker)
            return Run(rid, msg, blob, sel)
        except Refused as exc:
            send({"op": "result", "id": rid, "ok": False, "error": exc.kind, "message": str(exc)})
        return None
    if op == "cancel":
        if run is not None and run.rid == msg.get("target"):
            run.stop("cancelled", time.monotonic())
        send({"op": "result", "id": rid, "ok": True})
        return run
    if op == "ping":
        send({"op": "result", "id": rid, "ok": True})
        return run
    fn = FILE_OPS.get(op)
    if fn is None:
        send({"op": "result", "id": rid, "ok": False, "error": "UnknownOp", "message": repr(op)})
        return run
    try:
        with AsUser():
            reply, data = fn(msg, blob)
        reply.update({"op": "result", "id": rid, "ok": True})
        send(reply, data)
    except Refused as exc:
        send({"op": "result", "id": rid, "ok": False, "error": exc.kind, "message": str(exc)})
    except OSError as exc:
        send(
            {
                "op": "result",
                "id": rid,
                "ok": False,
                "error": type(exc).__name__,
                "message": "%s: %s" % (msg.get("path"), exc.strerror),
            }
        )
    except ValueError as exc:
        send(
            {
                "op": "result",
                "id": rid,
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
            }
        )
    return run


if __name__ == "__main__":
    main()

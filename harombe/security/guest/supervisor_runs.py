"""Fresh-process runs for the in-sandbox supervisor (standard library only).

Part of the supervisor's source (see ``supervisor_sessions.py``): :class:`Output` captures a
run's stdout and stderr (capped in bytes, streamed if asked) and :class:`Run` supervises one
child process and everything it starts; :func:`sweep` ends everything a run or a call
leaves behind. Helpers such as ``send`` and ``child_setup`` come from ``supervisor.py``.
"""

import os
import signal
import time

#: Session interpreters (see supervisor_sessions.py): spared by the sweeps that end a call.
PROTECTED = set()
#: How long a sweep waits for its stops and kills to take effect before it kills the
#: interpreters too: a stop takes well under a millisecond, but a loaded host can delay it.
SETTLE_S = 2.0
SETTLE_POLL_S = 0.0002


def kill_all_others(spare_sessions=True):
    """End every process in the sandbox except PID 1 (ourselves) and, unless told otherwise,
    the session interpreters, which are left stopped (see :func:`sweep`). Returns whether any
    process was found."""
    if not spare_sessions:
        PROTECTED.clear()
    return sweep()


#: Asks whether a child has stopped or exited, and collects nothing (the main loop reaps).
WAIT_QUERY = os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT
#: /proc states of a process that cannot be inside a fork: stopped (a kill it holds takes it
#: when continued), traced-stopped, or dead.
SETTLED_STATES = (b"T", b"t", b"Z", b"X", b"x")


def settled(pid):
    """Whether nothing of ``pid`` can still be inside a fork: it has stopped (every thread of
    it), or it is dead.

    For our own children (the interpreters, and orphans we inherited) ``waitid`` with WNOWAIT
    asks without collecting anything: it answers once the whole thread group has stopped, or
    once it has exited. Anything else is read from /proc: a zombie is done forking. What
    cannot be read counts as not settled (the sweep's deadline decides), unless it is gone."""
    try:
        return os.waitid(os.P_PID, pid, WAIT_QUERY) is not None
    except OSError:
        pass  # not ours (or already collected): /proc says
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError):
        return True  # gone
    except OSError:
        return False
    try:
        data = os.read(fd, 512)
    except OSError:
        return False
    finally:
        os.close(fd)
    state = data.rfind(b")") + 2  # the state follows the name, which may hold a ")"
    return data[state : state + 1] in SETTLED_STATES


def wait_settled(pids, deadline):
    """Wait until every one of ``pids`` has :func:`settled`; False if the deadline came first."""
    pending = list(pids)
    while True:
        pending = [pid for pid in pending if not settled(pid)]
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(SETTLE_POLL_S)


def signal_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def sweep():
    """Stop everything at once, then kill every process but the session interpreters; repeat
    until a round finds no process it has not already killed. Returns whether any was found.

    ``kill(-1, SIGSTOP)`` reaches every process but ourselves in one step, and a stopped process
    cannot fork, so a chain of processes that fork and exit (each gone before a listing of
    /proc could name it) is caught whole. A signal takes effect only when its target leaves the
    kernel, though: a process inside ``fork`` when the stop or the kill came creates its child
    a moment later, possibly after our listing. So each round first waits until the
    interpreters have stopped and what the last round killed has died (:func:`settled`), and
    only then lists: a child born of a fork in flight is listed, and makes another round. The
    interpreters stay stopped: nothing of theirs runs between calls (a run continues them, see
    ``Worker.thaw``). Zombies stay listed until reaped, so a pid is killed once. What does not
    settle in time fails closed: the interpreters are killed too (their sessions say so).
    """
    killed = set()
    dying = []
    escalated = False
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            os.kill(-1, signal.SIGSTOP)
        except ProcessLookupError:
            break
        calm = wait_settled(list(PROTECTED) + dying, deadline)
        fresh = False
        dying = []
        for name in os.listdir("/proc"):
            if name.isdigit() and name != "1":
                pid = int(name)
                if pid in PROTECTED:
                    continue
                dying.append(pid)
                if pid not in killed:
                    killed.add(pid)
                    fresh = True
                    signal_quietly(pid, signal.SIGKILL)
        if calm and not fresh:
            break
        if not calm or time.monotonic() > deadline:
            if escalated:
                break  # nothing more can be done: what is left is already dying
            escalated = True
            deadline = time.monotonic() + SETTLE_S
            for pid in list(PROTECTED):  # not settling in time: the interpreters go too
                PROTECTED.discard(pid)
                killed.add(pid)
                dying.append(pid)
                signal_quietly(pid, signal.SIGKILL)
                signal_quietly(pid, signal.SIGCONT)
    return bool(killed)


class Output:
    """The captured stdout/stderr of one run: capped in bytes, streamed if asked."""

    def __init__(self, rid, cap, stream, mode=None):
        self.rid = rid
        self.cap = cap
        self.stream = stream
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.total = {"stdout": 0, "stderr": 0}
        RUN_NUMBER[0] += 1
        self.llm = {}  # output mode "llm": head, tail and a saved copy (supervisor_output.py)
        if mode and mode.get("mode") == "llm":
            head, tail = int(mode["head_bytes"]), int(mode["tail_bytes"])
            self.llm = {n: LlmStream(n, RUN_NUMBER[0], head, tail) for n in OUTPUT_STREAMS}

    def feed(self, name, data):
        if self.llm:
            self.llm[name].feed(data)
            sent = self.total[name]  # streamed so far: up to the cap, as in the full mode
            self.total[name] += len(data)
            if self.stream and sent < self.cap:
                send({"op": "out", "id": self.rid, "stream": name}, bytes(data[: self.cap - sent]))
            return
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
        cut = {}
        if self.llm:
            out, cut["stdout_llm"] = self.llm["stdout"].finish()
            err, cut["stderr_llm"] = self.llm["stderr"].finish()
        fields = {
            "stdout_len": len(out),
            "stderr_len": len(err),
            "stdout_total": self.total["stdout"],
            "stderr_total": self.total["stderr"],
        }
        fields.update((k, v) for k, v in cut.items() if v is not None)
        return fields, out + err


class Supervised:
    """What every run has: its output, its limits and clock, and exactly one ``done`` report."""

    def __init__(self, rid, msg):
        self.rid = rid
        self.output = Output(
            rid, int(msg["max_output_bytes"]), bool(msg.get("stream")), msg.get("output")
        )
        self.max_rss = int(msg["max_memory_mb"]) * 1048576
        self.memory_probe = MEMORY_PROBES[msg.get("memory_probe", "rss")]
        self.grace_s = float(msg.get("grace_s", 2.0))
        self.started = time.monotonic()
        self.deadline = self.started + float(msg["timeout_s"])
        # /proc/meminfo costs most of a millisecond here; short runs never need it.
        self.next_mem_check = self.started + FIRST_MEMORY_CHECK_S
        self.kill_at = None
        self.status = None  # set when we decide to stop it: timeout, oom, cancelled
        self.exit_code = None
        self.term_signal = None
        self.cpu_s = 0.0
        self.peak_rss = 0
        # What the call leaves behind (supervisor_artifacts.py): the workspace before it, and
        # the images a session worker sends with its reply.
        self.call_begun = begin_call()
        self.images, self.image_notes = [], []

    def check_limits(self, now):
        """The timeout, the kill after the grace, and the memory limit."""
        if self.status is None and now >= self.deadline:
            self.stop("timeout", now)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_now()
        if now >= self.next_mem_check:
            self.next_mem_check = now + POLL_S
            drain_watch()  # supervisor_watch.py: keeps inotify's queue short
            rss = self.memory_probe()
            self.peak_rss = max(self.peak_rss, rss)
            if rss > self.max_rss and self.status is None:
                self.status = "oom"
                self.out_of_memory(now)

    def kill_now(self):
        kill_all_others()

    def out_of_memory(self, now):
        kill_all_others()

    def send_done(self, **extra):
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
        msg.update(extra)
        blob += end_call(self, msg)
        send(msg, blob)


class Run(Supervised):
    """One supervised child process and everything it started."""

    def __init__(self, rid, msg, stdin_data, sel):
        super().__init__(rid, msg)
        self.sel = sel
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
            self.sel.register(fd, EVENT_READ, (self, name))
            self.open_streams.add(fd)
        os.set_blocking(in_w, False)
        self.stdin_fd = in_w
        if self.stdin_view:
            self.sel.register(in_w, EVENT_WRITE, (self, "stdin"))
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
            self.check_limits(now)

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
        self.send_done()

"""Stateful sessions for the in-sandbox supervisor: one long-lived interpreter per language.

Standard library only. This file is the fourth part of the supervisor's source (see
``supervisor.py``). ``Supervised`` comes from ``supervisor_runs.py``; names such as ``send``,
``child_setup``, ``kill_all_others`` and ``HEADER`` come from the other parts and are looked
up when called.

A :class:`Worker` is an interpreter that keeps its globals between runs: Python is a fork of
the supervisor running ``pyworker.py`` (its source is ``PY_WORKER_SOURCE``, which the host puts
in front of the supervisor's); JavaScript is ``node`` running the worker script the host sends. The worker talks over two pipes (fd 3 requests, fd 4 replies) in the
supervisor's frame format; its stdout and stderr are pipes the supervisor reads, as for any run.

A :class:`SessionRun` is one call on a worker. A timeout or cancel first interrupts the code
(SIGINT: ``KeyboardInterrupt`` in Python, ``breakOnSigint`` in Node), keeping the state; if the
interpreter does not come back within the grace period it is killed and the result says
``state_lost``. Running out of memory always kills it. Everything else the call started is
killed when the call ends, as for fresh runs.
"""

import os
import select
import signal
import struct
import sys

SESSION_LANGUAGES = ("python", "javascript")
#: Languages whose interpreter died between runs (``kill -9 -1`` from a shell call, say): the
#: next run on a new interpreter reports ``state_lost`` so the loss is never silent.
LOST_BETWEEN_RUNS = set()
#: The JavaScript worker's source: the host sends it once per sandbox, for every later start.
JS_WORKER = [""]


class Worker:
    """A live interpreter for one language, its pipes, and the run it is serving (if any)."""

    def __init__(self, msg, sel):
        self.language = msg["language"]
        self.sel = sel
        self.run = None
        self.replies = bytearray()
        self.pending = b""
        self.exit_status = None
        fds = {}
        for name in ("req", "rep", "out", "err"):
            fds[name] = os.pipe()
        env = {str(k): str(v) for k, v in msg.get("env", {}).items()}
        cwd = msg.get("cwd", "/workspace")
        nproc = int(msg.get("max_pids", 128))
        targets = ((fds["out"][1], 1), (fds["err"][1], 2), (fds["req"][0], 3), (fds["rep"][1], 4))
        # Forked, not spawned: under gVisor a fork of this process is cheaper than starting a
        # new Python (measured: ~60 ms against ~100 ms on a cold sandbox), and calls on a
        # forked interpreter measured faster too.
        pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                child_setup(nproc)
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                for fd, n in targets:
                    os.dup2(fd, n)
                os.closerange(5, 65536)
                os.chdir(cwd)
                # The user's own process: /proc/self must be theirs to read. Linux clears
                # the dumpable flag on setuid, and hardening clears it here; gVisor keeps it
                # otherwise, and setting it would cost a cold start a ctypes import.
                if "ctypes" in sys.modules or not GVISOR:
                    set_dumpable(1)
                if self.language == "python":
                    os.environ.clear()
                    os.environ.update(env)
                    scope = {"__name__": "harombe_worker"}
                    exec(compile(PY_WORKER_SOURCE, "<harombe-worker>", "exec"), scope)
                    scope["serve_python"]()
                argv = ["node", "-e", JS_WORKER[0]]
                os.execvpe(argv[0], argv, env)
            except BaseException as exc:
                try:
                    os.write(2, ("harombe worker: %r\n" % (exc,)).encode())
                finally:
                    os._exit(127)
        self.pid = pid
        PROTECTED.add(pid)
        os.close(fds["req"][0])
        os.close(fds["rep"][1])
        os.close(fds["out"][1])
        os.close(fds["err"][1])
        self.req_fd = fds["req"][1]
        self.fds = {fds["rep"][0]: "ctl", fds["out"][0]: "stdout", fds["err"][0]: "stderr"}
        for fd, name in self.fds.items():
            os.set_blocking(fd, False)
            sel.register(fd, EVENT_READ, (self, name))
        os.set_blocking(self.req_fd, False)

    @property
    def alive(self):
        return self.exit_status is None

    def submit(self, request, code):
        data = dumps(request)
        self.pending = struct.pack(">II", len(data), len(code)) + data + code
        self.flush_request()

    def flush_request(self):
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.req_fd, self.pending) :]
        except BlockingIOError:
            pass
        except OSError:  # the worker is gone; its death is reported through SIGCHLD
            self.pending = b""
        wanted = EVENT_WRITE if self.pending else 0
        try:
            if wanted:
                self.sel.register(self.req_fd, wanted, (self, "req"))
            else:
                self.sel.unregister(self.req_fd)
        except (KeyError, ValueError):
            pass

    def on_io(self, fd, name):
        if name == "req":
            self.flush_request()
            return
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            os.close(fd)
            del self.fds[fd]
            return
        if name == "ctl":
            self.replies += data
            while len(self.replies) >= HEADER.size:
                jlen, blen = HEADER.unpack_from(self.replies)
                end = HEADER.size + jlen + blen
                if len(self.replies) < end:
                    break
                reply = loads(bytes(self.replies[HEADER.size : HEADER.size + jlen]))
                tail = bytes(self.replies[HEADER.size + jlen : end])
                del self.replies[:end]
                if self.run is not None:
                    self.run.replied(reply, tail)
        elif self.run is not None:
            self.run.output.feed(name, data)
        # Output between runs (a background thread printing) has no run to go to: dropped.

    def drain(self):
        """Read whatever the worker already wrote to stdout/stderr (non-blocking)."""
        streams = [fd for fd, name in self.fds.items() if name != "ctl"]
        try:  # one syscall to learn which pipes hold anything, instead of a read on each
            streams = select.select(streams, [], [], 0)[0] if streams else []
        except (OSError, ValueError):
            pass
        for fd in streams:
            name = self.fds.get(fd)
            while fd in self.fds:
                try:
                    data = os.read(fd, CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    self.on_io(fd, name)  # closes it
                    break
                if self.run is not None:
                    self.run.output.feed(name, data)

    def died(self, status):
        self.exit_status = status
        PROTECTED.discard(self.pid)
        self.drain()
        for fd in list(self.fds):
            self.sel.unregister(fd)
            os.close(fd)
        self.fds.clear()
        try:
            self.sel.unregister(self.req_fd)
        except (KeyError, ValueError):
            pass
        os.close(self.req_fd)
        if self.run is not None:
            self.run.worker_died(status)
        else:
            LOST_BETWEEN_RUNS.add(self.language)

    def spill(self):
        """Ask a Python worker to send the output it holds in memory down the pipe (SIGUSR1),
        so it survives a kill. Node writes through and must not get SIGUSR1: to Node it
        means "open the debugger"."""
        if self.language == "python":
            try:
                os.kill(self.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SessionRun(Supervised):
    """One call on a :class:`Worker`; same timers, limits and report as a fresh ``Run``."""

    def __init__(self, rid, msg, code, worker):
        super().__init__(rid, msg)
        self.worker = worker
        self.result = None
        self.stdout_tail = b""
        self.state_lost = worker.language in LOST_BETWEEN_RUNS
        LOST_BETWEEN_RUNS.discard(worker.language)
        worker.run = self
        worker.submit({"cell": rid, "stream": bool(msg.get("stream"))}, code)

    def replied(self, reply, stdout_tail=b""):
        """The worker finished the code; ``stdout_tail`` is output it kept in memory."""
        self.stdout_tail = stdout_tail
        if self.exit_code is None:
            self.exit_code = int(reply.get("exit_code", 1))
            self.result = reply.get("result")
            self.cpu_s = float(reply.get("cpu_s", 0.0))
            self.peak_rss = max(self.peak_rss, int(reply.get("maxrss_kb", 0)) * 1024)

    def worker_died(self, status):
        self.state_lost = True
        if self.exit_code is None:
            if os.WIFSIGNALED(status):
                self.term_signal = os.WTERMSIG(status)
                self.exit_code = 128 + self.term_signal
            else:
                self.exit_code = os.WEXITSTATUS(status)

    def stop(self, status, now):
        """Interrupt the code (state kept); kill the interpreter if it does not come back."""
        if self.status is None:
            self.status = status
        if self.kill_at is None:
            kill_all_others()
            try:
                self.worker.spill()
                os.kill(self.worker.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            self.kill_at = now + self.grace_s

    def tick(self, now):
        if self.exit_code is not None:
            return
        self.check_limits(now)

    def kill_now(self):
        self.worker.kill()

    def out_of_memory(self, now):
        kill_all_others()
        self.worker.spill()  # held output goes out now; the kill comes next tick
        self.kill_at = now

    def finished(self):
        if self.exit_code is None:
            return False
        # Nothing a call starts outlives it; then collect what the worker already printed.
        if self.worker.alive:
            kill_all_others()
            self.worker.drain()
        if self.stdout_tail:  # written after anything that went through the pipe
            self.output.feed("stdout", self.stdout_tail)
            self.stdout_tail = b""
        return True

    def report(self):
        self.worker.run = None
        self.send_done(result=self.result, state_lost=self.state_lost, session=True)

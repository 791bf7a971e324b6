"""Session interpreters for the in-sandbox supervisor: one long-lived interpreter per language.

Standard library only; a part of the supervisor's source (see ``__init__.py``). A
:class:`Worker` is an interpreter that keeps its globals between runs: Python is a fork of the
supervisor running ``pyworker.py`` (its source is ``PY_WORKER_SOURCE``, which the host puts in
front of the supervisor's); JavaScript is ``node`` running the worker script the host sends.
The worker talks over two pipes (fd 3 requests, fd 4 replies) in the protocol's frames
(``wire.py``); its stdout and stderr are pipes the supervisor reads, as for any run. The calls
on a worker are ``SessionRun`` (``supervisor_sessions.py``).

The worker runs user code, which can write on its reply pipe, so the worker is untrusted: a
frame over the caps, not a JSON object, not a reply to the current call, or a second reply
kills it (:class:`Violation`); so does a thread beyond its own after a call (read from /proc),
pending work it reports, or memory over the limit still held when the call ends. Each of these
ends the session with ``state_lost`` and a warning saying why, never silently, and is followed
by one more sweep (what the worker's threads forked while they were being waited for goes
too). The workers end what is theirs to end: Python resets signal handlers the code installed
and itimers, and leaves SIGCHLD ignored between calls, so the children the sweep kills leave
no zombies holding the process limit; Node reports every timer left in its timer lists
(ref()'d or not, however made) and work still running on libuv's thread pool. A forged reply
ends the call early, but the code that forged it is stopped with the worker: it can only go on
inside a later call of the same session, under that call's limits, and its own reply then
arrives out of turn, which that call reports as a lost session.
"""

import os
import select
import signal
import sys
import time

SESSION_LANGUAGES = ("python", "javascript")
#: Live interpreters by language. The main loop reaps through it; a worker that is retired
#: (killed on purpose) leaves it at once, so its death is not reported a second time.
WORKERS = {}
#: Languages whose interpreter died between runs (``kill -9 -1`` from a shell call, say), with
#: why: the next run on a new interpreter reports ``state_lost`` so the loss is never silent.
LOST_BETWEEN_RUNS = {}
#: The JavaScript worker's source: the host sends it once per sandbox, for every later start.
JS_WORKER = [""]
#: What a worker may send. It runs user code, so every frame is untrusted: a reply is a few
#: numbers and the repr of a value, and the Python worker's held stdout (< 64 KiB in practice).
MAX_REPLY_JSON_BYTES = 1 << 17
MAX_REPLY_TAIL_BYTES = 1 << 20
RESULT_LIMIT = 10000  # characters of a result's repr, as the workers cut it
MAX_LEFTOVERS = 16
#: How long a thread that was joined may take to vanish from /proc before it counts as left
#: running (only paid when a thread is seen after a call).
THREAD_EXIT_GRACE_S = 0.05
THREAD_EXIT_POLL_S = 0.002
REPLY_KEYS = frozenset(("cell", "exit_code", "result", "cpu_s", "maxrss_kb", "leftover",
                        "artifacts", "artifact_notes"))  # fmt: skip


class Violation(Exception):
    """A worker sent something no honest worker sends: user code is writing on its channel."""


def check_reply(reply, rid):
    """Raise :class:`Violation` unless ``reply`` is a well-formed reply to request ``rid``."""
    if type(reply) is not dict:
        raise Violation("a reply that is not an object")
    unknown = [k for k in reply if k not in REPLY_KEYS]
    if unknown:
        raise Violation("unknown reply fields %r" % (unknown[:3],))
    if reply.get("cell") != rid or type(reply.get("cell")) is not int:
        raise Violation("a reply to another call")
    code = reply.get("exit_code")
    if type(code) is not int or not -(1 << 31) <= code < 1 << 31:
        raise Violation("an exit code that is not a 32-bit integer")
    result = reply.get("result")
    if result is not None and (type(result) is not str or len(result) > RESULT_LIMIT):
        raise Violation("a result that is not a string of at most %d characters" % RESULT_LIMIT)
    cpu = reply.get("cpu_s", 0)
    if type(cpu) not in (int, float) or not 0 <= cpu < 1e9:
        raise Violation("a CPU time out of range")
    rss = reply.get("maxrss_kb", 0)
    if type(rss) is not int or not 0 <= rss < 1 << 40:
        raise Violation("a peak memory out of range")
    left = reply.get("leftover", [])
    if (
        type(left) is not list
        or len(left) > MAX_LEFTOVERS
        or any(type(x) is not str or len(x) > 64 for x in left)
    ):
        raise Violation("a malformed list of leftovers")


class Worker:
    """A live interpreter for one language, its pipes, and the run it is serving (if any).

    The worker runs user code, so it is treated as untrusted: its frames are checked and
    capped (:func:`check_reply`), it is stopped between calls (``sweep`` leaves it stopped,
    :meth:`thaw` continues it for the next run), and after each call it must be back to its
    own threads (:meth:`leftovers`) or it is killed and the call says ``state_lost``.
    """

    def __init__(self, msg, sel):
        self.language = msg["language"]
        self.sel = sel
        self.run = None
        self.replies = FrameDecoder(
            max_json_bytes=MAX_REPLY_JSON_BYTES,
            max_blob_bytes=MAX_REPLY_TAIL_BYTES + MAX_ARTIFACT_BYTES,  # held stdout, images
        )
        self.pending = b""
        self.exit_status = None
        self.retired = False
        # Node reports when its own threads are up (a ``ready`` frame); Python has one thread.
        self.baseline = None
        fds = {}
        for name in ("req", "rep", "out", "err"):
            fds[name] = os.pipe()
        pid = fork_interpreter(self.language, msg, fds)
        self.pid = pid
        if self.language == "python":
            self.baseline = {str(pid)}
        PROTECTED.add(pid)
        WORKERS[self.language] = self
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
        return self.exit_status is None and not self.retired

    def thaw(self):
        """Continue the interpreter (sweeps leave it stopped between calls)."""
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def submit(self, request, code):
        self.pending = encode(request, code)
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
        if self.retired:
            return
        if name == "req":
            self.flush_request()
            return
        if fd not in self.fds:
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
            try:
                self.take_frames(data)
            except Violation as exc:
                self.retire("the session interpreter was restarted: something in it wrote "
                            "on its reply channel (%s)" % exc)  # fmt: skip
        elif self.run is not None:
            self.run.output.feed(name, data)
        # Output between runs (possible only while a fresh run has continued the worker)
        # has no run to go to: dropped.

    def take_frames(self, data):
        """Parse the worker's frames; raise :class:`Violation` on anything out of bounds."""
        self.replies.add(data)
        while True:
            try:
                frame = self.replies.next_frame()
            except ProtocolError as exc:
                raise Violation(str(exc)) from None
            if frame is None:
                return
            reply, tail = frame
            if self.baseline is None:  # Node's first frame, sent before any user code ran
                threads = reply.get("threads")
                if (
                    threads is None
                    or reply.get("ready") is not True
                    or type(threads) is not list
                    or len(threads) > 256
                    or not all(type(t) is str and t.isdigit() for t in threads)
                ):
                    raise Violation("no ready frame")
                self.baseline = set(threads)
                continue
            run = self.run
            if run is None or run.exit_code is not None:
                raise Violation("a reply with no call waiting for one")
            check_reply(reply, run.rid)
            run.replied(reply, tail)

    def threads(self):
        try:
            return os.listdir("/proc/%d/task" % self.pid)
        except OSError:
            return []

    def extra_threads(self):
        return len(set(self.threads()) - (self.baseline or set()))

    def leftovers(self, reported):
        """Why the interpreter cannot be kept after a call, or None: threads beyond its own
        (read from /proc, which user code cannot fake) or work the worker says is pending."""
        extra = self.extra_threads()
        deadline = time.monotonic() + THREAD_EXIT_GRACE_S
        while extra and time.monotonic() < deadline:
            # A thread that was joined may still be on its way out (its last steps in libc):
            # let the worker run a moment, stop it again and look again. The stop is a sweep:
            # whatever its threads forked meanwhile must not outlive the call either.
            self.thaw()
            time.sleep(THREAD_EXIT_POLL_S)
            kill_all_others()
            if self.exit_status is not None or not os.path.exists("/proc/%d" % self.pid):
                return None  # it died: its death is reported through SIGCHLD
            extra = self.extra_threads()
        if extra:
            return "%d background thread%s still running when the call ended" % (
                extra, " was" if extra == 1 else "s were")  # fmt: skip
        if reported:
            return "work was still pending when the call ended (%s)" % ", ".join(reported)
        return None

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

    def close_pipes(self):
        PROTECTED.discard(self.pid)
        if WORKERS.get(self.language) is self:
            del WORKERS[self.language]
        for fd in list(self.fds):
            self.sel.unregister(fd)
            os.close(fd)
        self.fds.clear()
        try:
            self.sel.unregister(self.req_fd)
        except (KeyError, ValueError):
            pass
        os.close(self.req_fd)

    def died(self, status):
        self.exit_status = status
        self.drain()
        self.close_pipes()
        if self.run is not None:
            self.run.worker_died(status)
        else:
            how = ("signal %d" % os.WTERMSIG(status) if os.WIFSIGNALED(status)
                   else "exit code %d" % os.WEXITSTATUS(status))  # fmt: skip
            LOST_BETWEEN_RUNS[self.language] = (
                "the session interpreter ended between calls (%s); its state is gone and this "
                "call ran on a new one" % how
            )

    def retire(self, reason):
        """Kill the interpreter on purpose and say why: to the run it serves, or to the next."""
        if self.retired or self.exit_status is not None:
            return
        self.retired = True
        self.kill()
        self.thaw()  # a stopped process takes its SIGKILL only once continued on some kernels
        self.close_pipes()
        if self.run is not None:
            self.run.worker_lost(reason)
        else:
            LOST_BETWEEN_RUNS[self.language] = reason

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


def fork_interpreter(language, msg, fds):
    """Fork the session interpreter for ``language`` on the pipes ``fds`` (name -> (read end,
    write end)) and return its pid; the child becomes the user and never returns.

    Forked, not spawned: under gVisor a fork of this process is cheaper than starting a new
    Python (measured: ~60 ms against ~100 ms on a cold sandbox), and calls on a forked
    interpreter measured faster too."""
    env = {str(k): str(v) for k, v in msg.get("env", {}).items()}
    cwd = msg.get("cwd", "/workspace")
    nproc = int(msg.get("max_pids", 128))
    targets = ((fds["out"][1], 1), (fds["err"][1], 2), (fds["req"][0], 3), (fds["rep"][1], 4))
    pid = os.fork()
    if pid != 0:
        return pid
    try:
        child_setup(nproc, own_session=False)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        for fd, n in targets:
            os.dup2(fd, n)
        os.closerange(5, 65536)
        os.chdir(cwd)
        # The user's own process: /proc/self must be theirs to read. Linux clears the dumpable
        # flag on setuid, and hardening clears it here; gVisor keeps it otherwise, and setting
        # it would cost a cold start a ctypes import.
        if "ctypes" in sys.modules or not GVISOR:
            set_dumpable(1)
        if language == "python":
            os.environ.clear()
            os.environ.update(env)
            scope = {"__name__": "harombe_worker"}
            exec(compile(PY_WORKER_SOURCE, "<harombe-worker>", "exec"), scope)
            scope["serve_python"]()
        # --expose-internals: the worker reads Node's timer lists to see every timer a call
        # leaves (see jsworker.js).
        argv = ["node", "--expose-internals", "-e", JS_WORKER[0]]
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        try:
            os.write(2, ("harombe worker: %r\n" % (exc,)).encode())
        finally:
            os._exit(127)

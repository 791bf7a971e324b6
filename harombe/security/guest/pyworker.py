"""harombe's Python session worker: one interpreter whose globals persist between runs.

Standard library only. The supervisor forks, makes the child the sandbox user (no
capabilities left) and runs this source in it (``PY_WORKER_SOURCE``: ``wire.py``,
``profile_hook.py``, ``profile_layer.py``, then this file), then calls :func:`serve_python`:
requests on fd 3 (the blob is the code), replies on fd 4, the code's output on fds 1 and 2.
With ``$HAROMBE_PROFILE`` set, the profile's runtime layer is applied before the first request
is read; if it cannot be, every call fails with the reason and runs nothing. After each call on
a profiled session the layer's check runs: a call that changed the layer is reported as
leftover work, so the supervisor restarts the interpreter (``state_lost``) rather than run the
next call unguarded. A request with no code runs nothing and takes no cell number (the host's
check that the layer is on).

What a call sets up that could act later is undone when it ends: itimers are disarmed, signal
handlers it installed are reset (a POSIX timer it armed then signals a default action, which
the supervisor reports as a lost session), ``sys.stdout``/``stderr``/``stdin`` are the worker's
again, and its children are collected (the interpreter is stopped between calls).
"""

# Only modules that are cheap to import: every import here is paid by the first call on a
# cold sandbox. ``_ast`` is the C half of ``ast``; traceback printing is imported when an
# exception needs it.
import _ast
import builtins
import gc
import io
import os
import resource
import signal
import stat
import sys
import time

RESULT_LIMIT = 10000  # characters of the final expression's repr sent back
TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)

# Requests come from the supervisor, which is trusted: no caps.
_requests = FrameDecoder(max_json_bytes=None, max_blob_bytes=None)


def read_frame(fd):
    """The next frame from a blocking fd, or None at end of file.

    Reads in large chunks: a request usually arrives in one read (syscalls are dear here)."""
    while True:
        frame = _requests.next_frame()
        if frame is not None:
            return frame
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        _requests.add(chunk)


def write_frame(fd, msg, blob=b""):
    """Write one frame to a blocking fd."""
    view = memoryview(encode(msg, blob))
    while view:
        view = view[os.write(fd, view) :]


SPILL_BYTES = 1 << 16
SPILL_AFTER_S = 0.05


class _Collector(io.RawIOBase):
    """A raw binary stream that keeps what is written and sends it with the reply. It spills
    to fd 1 when asked to flush, past SPILL_BYTES, when its oldest byte is SPILL_AFTER_S old,
    and on SIGUSR1 (the supervisor's warning before it kills the interpreter), so output
    survives a run that must be killed."""

    def __init__(self):
        super().__init__()
        self.data = bytearray()
        self.since = 0.0

    def writable(self):
        return True

    def write(self, b):
        now = time.monotonic()
        if not self.data:
            self.since = now
        self.data += b
        if len(self.data) >= SPILL_BYTES or now - self.since >= SPILL_AFTER_S:
            self.spill()
        return len(b)

    def flush(self):
        self.spill()

    def spill(self, *_):
        if self.data:
            view = memoryview(bytes(self.data))
            self.data.clear()
            while view:
                view = view[os.write(1, view) :]


def _spill_before_processes(spill):
    import _posixsubprocess  # what subprocess uses; patched before subprocess imports it

    def spilling(fn):
        def call(*args, **kwargs):
            spill()
            return fn(*args, **kwargs)

        return call

    _posixsubprocess.fork_exec = spilling(_posixsubprocess.fork_exec)
    for name in ("system", "posix_spawn", "posix_spawnp", "execv", "execve"):
        if hasattr(os, name):
            setattr(os, name, spilling(getattr(os, name)))
    os.register_at_fork(before=spill)


def _reap():
    """Collect exited children, so zombies never count against the process limit (an exit
    status the code did not wait for in its own call is not kept for a later one)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _report(write, fallback):
    """Print the user's error to their ``sys.stderr``, or to the worker's own when the code
    replaced it with something that cannot take it: the worker must outlive any such stream."""
    try:
        write(sys.stderr)
    except Exception:
        try:
            write(fallback)
        except Exception:
            pass


def _leave(code=None):
    raise SystemExit(code)


def _environment_path(pth):
    """The environment directory a harombe-env .pth names, or None: read without blocking or
    following a link (a FIFO, a device or a link planted under that name is skipped), and only
    an exact ``/opt/harombe/envs/<key>/site``."""
    try:
        fd = os.open(pth, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        line = os.read(fd, 4096).split(b"\n", 1)[0].decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    parts = line.split("/")
    if (
        len(parts) == 6
        and parts[:4] == ["", "opt", "harombe", "envs"]
        and parts[5] == "site"
        and len(parts[4]) == 32
        and all(c in "0123456789abcdef" for c in parts[4])
    ):
        return line
    return None


class _Interpreter:
    """Where user code runs: one namespace kept between calls, and the streams, signal
    handlers and timers each call starts from and is brought back to."""

    def __init__(self):
        # Where code_install_package puts Python packages (pip --user); on the path even before
        # it exists, so packages installed after this interpreter started are found.
        self.user_site_seen = None  # the user site's mtime when last looked at
        self.user_site = "%s/.local/lib/python%d.%d/site-packages" % (
            os.environ.get("HOME", "/home/sandbox"),
            sys.version_info[0],
            sys.version_info[1],
        )
        # Then the system's site directories, as ``site`` adds them to a fresh ``python3 -``
        # (the worker runs without ``site``): Debian's packages (numpy, say) import here too.
        version = "%d.%d" % sys.version_info[:2]
        system_sites = ["/usr/local/lib/python%s/dist-packages" % version,
                        "/usr/lib/python3/dist-packages",
                        "/usr/lib/python%s/dist-packages" % version]  # fmt: skip
        sys.path[:] = [""] + [p for p in sys.path if p] + [self.user_site] + system_sites
        builtins.exit = builtins.quit = _leave  # what site would add; -S leaves them out
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.stdin = sys.stdin = io.TextIOWrapper(
            io.FileIO(0, "r", closefd=False), encoding="utf-8"
        )
        self._open_output()
        # As for ``python3 -`` (fresh runs), so code behaves the same in both modes.
        self.namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "<stdin>"}
        self.cell = 0
        self.refusal = None  # why the profile's layer failed: no code runs here then
        # Taken now, before any user code runs: code that replaces them in ``signal`` does not
        # change what the worker does between calls.
        self.setitimer = signal.setitimer
        # The handlers the worker runs with: a handler the code installs is reset when its call
        # ends, so a timer it armed (a POSIX timer through ctypes, say) cannot run code of its
        # during a later call. Python's own table, read without a syscall.
        getsignal = self.getsignal = signal.getsignal
        self.own_handlers = [(s, getsignal(s)) for s in sorted(signal.valid_signals())
                             if getsignal(s) is not None]  # fmt: skip

    def _user_site_changed(self):
        user_site = self.user_site
        if sys.path_importer_cache.get(user_site, False) is None and os.path.isdir(user_site):
            # An import that failed before the first package install cached "nothing here"
            # for the user site; the install made it a directory, so look again.
            del sys.path_importer_cache[user_site]
        # The install cache's environments: each a harombe-env-<key>.pth naming a read-only
        # directory, as site would add it for a fresh interpreter (this one runs without site).
        try:
            names = sorted(n for n in os.listdir(user_site)
                           if n.startswith("harombe-env-") and n.endswith(".pth"))  # fmt: skip
        except OSError:
            names = []
        for name in names:
            path = _environment_path(os.path.join(user_site, name))
            if path is not None and path not in sys.path:
                at = sys.path.index(user_site) + 1 if user_site in sys.path else len(sys.path)
                sys.path.insert(at, path)

    def _open_output(self):
        # Two faces of stdout. Streaming: line-buffered to fd 1, so the host sees each line as
        # it is printed. Otherwise: collected in memory and sent with the reply, which saves
        # the syscalls of a pipe round (dear under gVisor); past SPILL_BYTES it goes to fd 1 as
        # well, so memory stays bounded and the supervisor's byte cap applies as for any output.
        sink = self.sink = _Collector()
        signal.signal(signal.SIGUSR1, sink.spill)
        # A child process writes straight to fd 1; what the interpreter printed before starting
        # it must get there first, as with an unbuffered stdout.
        _spill_before_processes(sink.spill)
        self.collected = io.TextIOWrapper(sink, encoding="utf-8", errors="backslashreplace",
                                          write_through=True)  # fmt: skip
        self.streamed = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
            line_buffering=True,
        )  # fmt: skip
        self.stderr = sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
            line_buffering=True,
        )  # fmt: skip

    def call(self, request, blob):
        """Run one request's code (``blob``); the reply and the stdout held in memory."""
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this call's children report as usual
        try:
            seen = os.stat(self.user_site).st_mtime_ns
        except OSError:
            seen = None
        if seen != self.user_site_seen:  # a package was installed since the last call
            self.user_site_seen = seen
            self._user_site_changed()
        # Set for every call: streams a call replaced (or closed) are not the next call's.
        sys.stdout = self.streamed if request.get("stream") else self.collected
        sys.stderr, sys.stdin = self.stderr, self.stdin
        if blob:
            self.cell += 1
        code = blob.decode("utf-8", "surrogateescape")
        times = os.times()  # one syscall for this process and its children
        cpu0 = times[0] + times[1] + times[2] + times[3]
        exit_code, result = self._execute("<cell %d>" % self.cell, code)
        collect_open_figures()  # figures left open are images of this call, then closed
        try:
            self.streamed.flush()
            self.stderr.flush()
        except Exception:
            pass
        times = os.times()
        cpu_s = times[0] + times[1] + times[2] + times[3] - cpu0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tail = bytes(self.sink.data)
        self.sink.data.clear()
        self._undo_call()
        if not isinstance(exit_code, int) or not -(1 << 31) <= exit_code < 1 << 31:
            exit_code = 1  # sys.exit(10**100): still a failure, in a shape the protocol takes
        reply = {"cell": request.get("cell"), "exit_code": exit_code, "result": result,
                 "cpu_s": round(cpu_s, 6), "maxrss_kb": usage.ru_maxrss}  # fmt: skip
        tail += IMAGES.reply_fields(reply)  # the images follow the held stdout
        # Children are collected before the reply, and those the supervisor kills after it
        # are collected by the kernel (SIGCHLD ignored until the next call): a stopped
        # interpreter's zombies would hold the sandbox's process budget between calls.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        _reap()
        return reply, tail

    def _execute(self, name, code):
        """Run ``code`` as cell ``name``: (exit code, repr of its final expression or None)."""
        namespace, stderr = self.namespace, self.stderr
        exit_code, result = 0, None
        if self.refusal is not None:
            _report(lambda f: print("ProfileLayerError: " + self.refusal, file=f), stderr)
            return 1, None
        try:
            tree = compile(code, name, "exec", _ast.PyCF_ONLY_AST)
            last = None
            if tree.body and isinstance(tree.body[-1], _ast.Expr):
                last = _ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, name, "eval"), namespace)
                if value is not None:
                    namespace["_"] = value
                    result = repr(value)[:RESULT_LIMIT]
                    image_of_value(value)  # a PIL image: sent as PNG too (pyworker_artifacts.py)
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                exit_code = int(exc.code or 0)
            else:
                _report(lambda f, e=exc: print(e.code, file=f), stderr)
                exit_code = 1
        except BaseException as exc:  # the user's exception, printed as Python would
            import linecache
            import traceback

            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            tb = exc.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next  # drop the worker's own frames
            _report(lambda f, e=exc, t=tb: traceback.print_exception(type(e), e, t, file=f), stderr)
            exit_code = 1
        return exit_code, result

    def _undo_call(self):
        """A timer the code armed would interrupt a later call, and a handler it installed
        would run then: their effects end with this call."""
        for timer in TIMERS:
            self.setitimer(timer, 0)
        getsignal = self.getsignal
        for signum, handler in self.own_handlers:
            if getsignal(signum) is not handler:
                signal.signal(signum, handler)


def serve_python():
    """The worker's loop: run each request's code in one namespace; never returns."""
    install_display_hooks()
    interpreter = _Interpreter()
    spec = os.environ.pop(PROFILE_ENV, None)
    layer_check = None
    if spec is not None:
        try:
            layer_check = apply_profile(spec, interpreter.namespace)
        except Exception as exc:  # reported by every call, which then runs nothing
            interpreter.refusal = str(exc) or type(exc).__name__
    # Everything alive now is the interpreter's own: keep the collector off those pages so
    # processes that user code forks share them instead of copying them.
    gc.freeze()
    while True:
        frame = read_frame(3)
        if frame is None:
            os._exit(0)
        reply, tail = interpreter.call(frame[0], frame[1])
        if layer_check is not None:
            # A call that changed the profile's layer must not leave the next one unguarded:
            # reported as pending work, it makes the supervisor restart this interpreter.
            changed = layer_check(interpreter.namespace)
            if changed is not None:
                reply["leftover"] = [changed]
        write_frame(4, reply, tail)

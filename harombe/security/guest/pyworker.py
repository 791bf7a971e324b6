"""harombe's Python session worker: one interpreter whose globals persist between runs.

Standard library only. The supervisor forks, makes the child the sandbox user (no
capabilities left) and runs this source in it (``PY_WORKER_SOURCE``: ``supervisor_io.py``
then this file), then calls :func:`serve_python`: requests on fd 3 (the blob is the code),
replies on fd 4, the code's output on fds 1 and 2.

What a call sets up that could act later is undone when it ends: itimers are disarmed, signal
handlers it installed are reset (a POSIX timer it armed then signals a default action, which
the supervisor reports as a lost session), ``sys.stdout``/``stderr``/``stdin`` are the worker's
again, and its children are collected (the interpreter is stopped between calls).
"""

import io
import os
import signal
import struct
import sys
import time

RESULT_LIMIT = 10000  # characters of the final expression's repr sent back


_inbox = bytearray()


def read_frame(fd):
    """One ``[u32][u32][json][blob]`` frame from a blocking fd, or None at end of file.

    Reads in large chunks: a request usually arrives in one read (syscalls are dear here)."""
    while True:
        if len(_inbox) >= 8:
            jlen, blen = struct.unpack_from(">II", _inbox)
            end = 8 + jlen + blen
            if len(_inbox) >= end:
                msg, blob = loads(bytes(_inbox[8 : 8 + jlen])), bytes(_inbox[8 + jlen : end])
                del _inbox[:end]
                return msg, blob
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        _inbox.extend(chunk)


def write_frame(fd, msg, blob=b""):
    data = dumps(msg)
    view = memoryview(struct.pack(">II", len(data), len(blob)) + data + blob)
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


def serve_python():
    """The worker's loop: run each request's code in one namespace; never returns."""
    # Only modules that are cheap to import: every import here is paid by the first call on
    # a cold sandbox. ``_ast`` is the C half of ``ast``; traceback printing is imported when
    # an exception needs it.
    import _ast
    import builtins
    import gc
    import io
    import resource

    # Where code_install_package puts Python packages (pip --user); on the path even before it
    # exists, so packages installed after this interpreter started are found.
    user_site = "%s/.local/lib/python%d.%d/site-packages" % (
        os.environ.get("HOME", "/home/sandbox"),
        sys.version_info[0],
        sys.version_info[1],
    )
    sys.path[:] = [""] + [p for p in sys.path if p] + [user_site]

    def leave(code=None):
        raise SystemExit(code)

    builtins.exit = builtins.quit = leave  # what site would add; -S leaves them out
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stdin = sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    # Two faces of stdout. Streaming: line-buffered to fd 1, so the host sees each line as it
    # is printed. Otherwise: collected in memory and sent with the reply, which saves the
    # syscalls of a pipe round (dear under gVisor); past SPILL_BYTES it goes to fd 1 as well,
    # so memory stays bounded and the supervisor's byte cap applies as for any output.
    sink = _Collector()
    signal.signal(signal.SIGUSR1, sink.spill)
    # A child process writes straight to fd 1; what the interpreter printed before starting
    # it must get there first, as with an unbuffered stdout.
    _spill_before_processes(sink.spill)
    collected = io.TextIOWrapper(sink, encoding="utf-8", errors="backslashreplace",
                                 write_through=True)  # fmt: skip
    streamed = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )  # fmt: skip
    stderr = sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )  # fmt: skip
    # As for ``python3 -`` (fresh runs), so code behaves the same in both modes.
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "<stdin>"}
    cell = 0
    setitimer = signal.setitimer
    _TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    # The handlers the worker runs with: a handler the code installs is reset when its call
    # ends, so a timer it armed (a POSIX timer through ctypes, say) cannot run code of its
    # during a later call. Python's own table, read without a syscall.
    getsignal = signal.getsignal
    own_handlers = [(s, getsignal(s)) for s in sorted(signal.valid_signals())
                    if getsignal(s) is not None]  # fmt: skip
    # Everything alive now is the interpreter's own: keep the collector off those pages so
    # processes that user code forks share them instead of copying them.
    gc.freeze()
    while True:
        frame = read_frame(3)
        if frame is None:
            os._exit(0)
        request, blob = frame
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this call's children report as usual
        if sys.path_importer_cache.get(user_site, False) is None and os.path.isdir(user_site):
            # An import that failed before the first package install cached "nothing here"
            # for the user site; the install made it a directory, so look again.
            del sys.path_importer_cache[user_site]
        # Set for every call: streams a call replaced (or closed) are not the next call's.
        sys.stdout = streamed if request.get("stream") else collected
        sys.stderr, sys.stdin = stderr, stdin
        cell += 1
        name = "<cell %d>" % cell
        code = blob.decode("utf-8", "surrogateescape")
        times = os.times()  # one syscall for this process and its children
        cpu0 = times[0] + times[1] + times[2] + times[3]
        exit_code, result = 0, None
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
        try:
            streamed.flush()
            stderr.flush()
        except Exception:
            pass
        times = os.times()
        cpu_s = times[0] + times[1] + times[2] + times[3] - cpu0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tail = bytes(sink.data)
        sink.data.clear()
        # A timer the code armed would interrupt a later call: its effects end with this one.
        for timer in _TIMERS:
            setitimer(timer, 0)
        for signum, handler in own_handlers:
            if getsignal(signum) is not handler:
                signal.signal(signum, handler)
        if not isinstance(exit_code, int) or not -(1 << 31) <= exit_code < 1 << 31:
            exit_code = 1  # sys.exit(10**100): still a failure, in a shape the protocol takes
        reply = {"cell": request.get("cell"), "exit_code": exit_code, "result": result,
                 "cpu_s": round(cpu_s, 6), "maxrss_kb": usage.ru_maxrss}  # fmt: skip
        # Children are collected before the reply, and those the supervisor kills after it
        # are collected by the kernel (SIGCHLD ignored until the next call): a stopped
        # interpreter's zombies would hold the sandbox's process budget between calls.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        _reap()
        write_frame(4, reply, tail)

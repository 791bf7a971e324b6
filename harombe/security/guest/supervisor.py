"""The supervisor that runs as PID 1 inside every sandbox: its main loop and request dispatch.

Standard library only, Python >= 3.8. The host passes the supervisor's source as
``python3 -I -S -c``, so it lives in the supervisor's memory and nothing in the sandbox can
rewrite it. That source is the files of ``SUPERVISOR_PARTS`` (see ``__init__.py``) run as one
module, this one last: its ``main()`` runs once every part is defined, and names defined in
one part are used by the others at call time. It talks to the host over the container's
attached stdin/stdout in frames (``wire.py``)::

    [u32 json_len][u32 blob_len][json object][blob bytes]        (big-endian lengths)

Host → supervisor ops: ``run`` (argv, env, cwd, stdin blob, timeout_s, grace_s,
max_output_bytes, max_memory_mb, stream; ``session`` and ``language`` to run the blob as code
in the session interpreter instead), ``warm`` (start a session interpreter), ``cancel``,
``write``, ``read``, ``list``, ``untar``, ``ping``. Replies: ``hello`` once at start, ``out``
chunks for streaming runs, ``done`` for runs and ``result`` for everything else, each carrying
the request ``id``.

Privilege separation: the supervisor runs as root with only CAP_SETUID, CAP_SETGID and
CAP_KILL; user code runs as ``$HAROMBE_RUN_AS`` (uid:gid, default 1000:1000) with no
capabilities, and file operations run with that effective uid, so what they create belongs to
the user. A different uid cannot signal, ptrace or open the fds of the supervisor, so
``os.kill(1, 9)`` or ``kill -9 -1`` in user code cannot take the channel down (this gVisor
release delivers signals to PID 1 like to any process, so being init protects nothing by
itself). ``PR_SET_DUMPABLE=0`` is kept as a second lock. User code runs in its own session (a
session interpreter in its own process group of ours: see ``child_setup`` in
``supervisor_procs.py``); when a run ends every process in the sandbox is stopped at once and
all but the session interpreters are killed (``sweep`` in ``supervisor_runs.py``), so nothing
a call starts outlives the call, and the interpreters stay stopped until their next run:
between calls no user code runs at all, so every limit binds at all times. A session
interpreter runs user code, so it is untrusted too: its frames are checked and capped, and one
that breaks the protocol or keeps a thread past its call is killed and the call reports
``state_lost`` with a warning (see ``supervisor_workers.py``).
"""

import os
import signal
import sys
import time

PROTOCOL = 1
CHUNK = 65536
POLL_S = 0.05
DRAIN_S = 5.0
FIRST_MEMORY_CHECK_S = 0.02
HARDEN_IDLE_S = 1.0
REAP_FALLBACK_S = 0.5


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
    """Greet the host, then serve it until it hangs up."""
    sel = Selector()
    os.set_blocking(0, False)
    sel.register(0, EVENT_READ, None)
    wake_r = wakeup_pipe(sel)
    prewarm(sel)
    send(hello())
    serve(sel, wake_r)


def wakeup_pipe(sel):
    """The read end of a pipe that signals (SIGCHLD above all) write to, so they wake select."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so exits wake select()
    # User code shares our session (see child_setup): should it orphan our process group,
    # gVisor's SIGHUP must not end the supervisor.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sel.register(wake_r, EVENT_READ, "wake")
    return wake_r


def prewarm(sel):
    """Start the session interpreter ``$HAROMBE_PREWARM`` names, if any.

    Started before the hello, so the interpreter boots while the host is still waiting for us
    and sending its first request: on two cores the boot costs the call nothing."""
    language = os.environ.get("HAROMBE_PREWARM", "")
    if language not in SESSION_LANGUAGES:
        return
    try:
        Worker(
            {
                "language": language,
                "env": loads(os.environ.get("HAROMBE_USER_ENV", "{}")),
                "max_pids": int(os.environ.get("HAROMBE_MAX_PIDS", "128")),
                "cwd": "/workspace",
            },
            sel,
        )
    except Exception as exc:  # the first run will try again and report why
        sys.stderr.write("harombe-supervisor: prewarm failed: %r\n" % (exc,))


def serve(sel, wake_r):
    """The main loop: requests from the host, output of runs, exits of children, limits."""
    hardened = served = False
    next_reap = 0.0
    requests = FrameDecoder(max_json_bytes=None, max_blob_bytes=None)  # the host is trusted
    run = None
    workers = WORKERS  # language -> Worker (supervisor_workers.py)
    while True:
        events = sel.select(POLL_S if run else None if hardened else HARDEN_IDLE_S)
        reap = take_events(events, wake_r, requests)
        if reap is None:  # the host hung up: nothing left to serve
            kill_all_others(spare_sessions=False)
            return
        frame = requests.next_frame()
        while frame is not None:
            run = handle(frame[0], frame[1], run, sel, workers)
            frame = requests.next_frame()
        # Reap only after SIGCHLD woke us, or now and then as a fallback: a wait4 per loop is
        # a syscall per loop.
        now = time.monotonic()
        if now >= next_reap:
            reap, next_reap = True, now + REAP_FALLBACK_S
        if reap:
            reap_children(run, workers)
        if run is not None:
            run.tick(time.monotonic())
            if run.finished():
                run.report()
                run = None
                served = True
        if not hardened and run is None and not requests.buffered and (served or not events):
            # Deferred off the cold-start path (ctypes costs ~50 ms to import here): done after
            # the first run, or once the sandbox has idled for HARDEN_IDLE_S. Until then user
            # code, a different uid, is kept out of this process by uid checks.
            harden()
            hardened = True


def take_events(events, wake_r, requests):
    """Act on what ``select`` returned: the host's bytes go to ``requests``, a worker's pipes to
    the worker. Whether a signal arrived (children to reap); None when the host hung up."""
    reap = False
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
            if not data:
                return None
            requests.add(data)
        else:
            owner, name = key.data
            owner.on_io(key.fd, name)
    return reap


def reap_children(run, workers):
    """Collect every exited process (we are init: orphans land here too) and tell its owner."""
    while True:
        try:
            pid, status, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        worker = next((w for w in workers.values() if w.pid == pid), None)
        if worker is not None:
            worker.died(status)  # and it leaves WORKERS
        elif isinstance(run, Run) and pid == run.pid:
            run.reaped(status, rusage)


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

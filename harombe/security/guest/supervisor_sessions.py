"""Calls on session interpreters for the in-sandbox supervisor.

Standard library only; a part of the supervisor's source (see ``__init__.py``), after
``supervisor_runs.py`` (``Supervised``) and ``supervisor_workers.py`` (``Worker``).

A :class:`SessionRun` is one call on a worker. A timeout or cancel first interrupts the code
(SIGINT: ``KeyboardInterrupt`` in Python, ``breakOnSigint`` in Node), keeping the state; if the
interpreter does not come back within the grace period it is killed and the result says
``state_lost``. Running out of memory always kills it. Everything else the call started is
killed when the call ends, as for fresh runs, and the worker is stopped until its next call.
"""

import os
import signal


class SessionRun(Supervised):
    """One call on a :class:`Worker`; same timers, limits and report as a fresh ``Run``.

    The call's effects end with it: when the worker replies, a sweep kills every other process
    and stops the worker; a thread or pending work left behind, a frame out of protocol, or
    memory over the limit kills the worker, and the reply says ``state_lost`` with a warning.
    """

    def __init__(self, rid, msg, code, worker):
        super().__init__(rid, msg)
        self.worker = worker
        self.result = None
        self.stdout_tail = b""
        self.leftover = []
        self.warnings = []
        lost = LOST_BETWEEN_RUNS.pop(worker.language, None)
        self.state_lost = lost is not None
        if lost:
            self.warnings.append(lost)
        worker.run = self
        worker.thaw()
        worker.submit({"cell": rid, "stream": bool(msg.get("stream"))}, code)

    def replied(self, reply, stdout_tail=b""):
        """The worker finished the code; ``stdout_tail`` is output it kept in memory, followed
        by the images it sends (split off here; see ``supervisor_artifacts.py``)."""
        stdout_tail, self.images, self.image_notes = take_images(reply, stdout_tail)
        if self.worker.language != "python":
            # Only the Python worker displays images; anything else claiming some is forged.
            if self.images or self.image_notes:
                raise Violation("images from a worker that never sends any")
        self.stdout_tail = stdout_tail
        self.exit_code = reply["exit_code"]
        self.result = reply.get("result")
        self.cpu_s = float(reply.get("cpu_s", 0.0))
        self.peak_rss = max(self.peak_rss, reply.get("maxrss_kb", 0) * 1024)
        self.leftover = reply.get("leftover", [])

    def worker_died(self, status):
        self.state_lost = True
        if self.exit_code is None:
            if os.WIFSIGNALED(status):
                self.term_signal = os.WTERMSIG(status)
                self.exit_code = 128 + self.term_signal
            else:
                self.exit_code = os.WEXITSTATUS(status)
        if not self.warnings:  # a lost session always says why
            if self.status == "oom":
                why = "was killed for holding more memory than the limit"
            elif self.status is not None:
                why = "did not stop within the grace period after the %s and was killed" % (
                    self.status)  # fmt: skip
            elif os.WIFSIGNALED(status):
                why = "ended during the call (signal %d)" % os.WTERMSIG(status)
            else:
                why = "ended during the call (exit code %d)" % os.WEXITSTATUS(status)
            self.warnings.append(
                "the session interpreter %s; its state is gone and the next call runs on a "
                "new one" % why
            )

    def worker_lost(self, reason):
        """The worker was killed on purpose (see ``Worker.retire``)."""
        self.state_lost = True
        self.warnings.append(reason)
        if self.exit_code is None:
            self.exit_code = 128 + signal.SIGKILL
            self.term_signal = signal.SIGKILL

    def stop(self, status, now):
        """Interrupt the code (state kept); kill the interpreter if it does not come back."""
        if self.status is None:
            self.status = status
        if self.kill_at is None:
            kill_all_others()  # leaves the worker stopped: continue it to take the interrupt
            # Signalled while stopped, then continued: under gVisor a signal sent just after
            # SIGCONT can be missed by a sleep the continue restarts (measured: 10 of 40
            # interrupts lost on a loaded host, none this way round).
            try:
                self.worker.spill()
                os.kill(self.worker.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            self.worker.thaw()
            self.kill_at = now + self.grace_s

    def tick(self, now):
        if self.exit_code is not None:
            return
        self.check_limits(now)

    def kill_now(self):
        self.worker.kill()
        self.worker.thaw()

    def out_of_memory(self, now):
        kill_all_others()
        self.worker.spill()  # held output goes out now (sent while stopped: see stop())
        self.worker.thaw()  # and the kill comes next tick
        self.kill_at = now

    def finished(self):
        if self.exit_code is None:
            return False
        worker = self.worker
        # Nothing a call starts outlives it: every other process is killed and the worker
        # stopped (it cannot run on unwatched, even if the reply was forged); then collect
        # what it already printed, and keep it only if it is back to its own threads.
        kill_all_others()
        if worker.alive:
            worker.drain()
            why = worker.leftovers(self.leftover)
            if why is None and self.status is None:
                # Limits bind between calls too: what the call leaves resident counts now.
                used = self.memory_probe()
                self.peak_rss = max(self.peak_rss, used)
                if used > self.max_rss:
                    self.status = "oom"
                    why = "memory over the limit was still held when the call ended"
            if why is not None:
                worker.retire("the session interpreter was restarted: " + why)
                # Looking for leftover threads let the worker run a moment: anything they
                # forked meanwhile is swept now, not left running until the next call.
                kill_all_others()
        if self.stdout_tail:  # written after anything that went through the pipe
            self.output.feed("stdout", self.stdout_tail)
            self.stdout_tail = b""
        return True

    def report(self):
        self.worker.run = None
        extra = {"warnings": self.warnings} if self.warnings else {}
        self.send_done(result=self.result, state_lost=self.state_lost, session=True, **extra)

"""LLM-sized output for the in-sandbox supervisor: head, tail and a saved copy of a long stream.

Standard library only; a part of the supervisor's source (see ``__init__.py``), after
``supervisor_files.py`` (it uses ``Walk``, ``enter_all`` and ``AsUser``) and before
``supervisor_runs.py``, whose ``Output`` keeps one :class:`LlmStream` per stream when a run
asks for ``output: {"mode": "llm", "head_bytes": H, "tail_bytes": T}``.

A stream keeps its first ``H`` bytes (the head) and a bounded window of its last ``T`` bytes
(the tail), and counts its bytes and newlines. While the stream fits in ``H + T`` bytes nothing
else happens and the reply carries it whole. The moment it grows past that, the full text so far
is written to ``/workspace/.harombe/output/call-<n>.<stream>`` and every later byte is appended
as it arrives (a tee), so memory stays at about ``H + 2 T`` bytes whatever the stream's length.
The file is created as the sandbox user, through the workspace walk (no symlink is followed),
and counts against the workspace's size: a write that fails (the disk is full) stops the copy,
and the reply says how much was saved and why, never failing the run. The host cuts the head
and tail on character and line boundaries and writes the marker between them.

Only the files of the last :data:`KEEP_CALLS` calls are kept: making a new one removes older
``call-<n>.stdout`` / ``call-<n>.stderr`` files of that directory.
"""

import os

#: Where the full text of a cut stream is saved: ``OUTPUT_DIR`` under the workspace.
OUTPUT_ROOT = "/workspace"
OUTPUT_DIR = ".harombe/output"
#: The files of this many calls (the newest) are kept in ``OUTPUT_DIR``.
KEEP_CALLS = 5
OUTPUT_STREAMS = ("stdout", "stderr")
OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: The number of the current run in this sandbox (``call-<n>``): one per run, from 1.
RUN_NUMBER = [0]


def output_call_number(name):
    """``n`` of an output file named ``call-<n>.stdout`` / ``.stderr``; None for other names."""
    stem, dot, stream = name.rpartition(".")
    if not dot or stream not in OUTPUT_STREAMS or not stem.startswith("call-"):
        return None
    digits = stem[5:]
    return int(digits) if digits.isdigit() and digits.isascii() else None


def prune_output(dir_fd, current):
    """Remove the output files of all but the newest ``KEEP_CALLS`` calls (``current``
    counts as one); other names in the directory are left alone."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    numbers = {}
    for name in names:
        n = output_call_number(name)
        if n is not None:
            numbers[name] = n
    kept = sorted(set(numbers.values()) | {current})[-KEEP_CALLS:]
    for name, n in numbers.items():
        if n not in kept:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass


def open_output_file(name, number):
    """A new file ``OUTPUT_DIR/call-<number>.<name>``, opened for writing as the sandbox user
    (an older file of that name is replaced); returns ``(fd, path)``."""
    filename = "call-%d.%s" % (number, name)
    with AsUser():
        with Walk(OUTPUT_ROOT, OUTPUT_DIR) as walk:
            enter_all(walk, create=True)
            try:
                prune_output(walk.dir_fd, number)
            except OSError:
                pass  # an unreadable directory: old files stay, the new one may still fit
            try:
                os.unlink(filename, dir_fd=walk.dir_fd)
            except FileNotFoundError:
                pass
            fd = os.open(filename, OUTPUT_FLAGS, 0o644, dir_fd=walk.dir_fd)
    return fd, OUTPUT_DIR + "/" + filename


def write_all(fd, data):
    """Write all of ``data``; returns the bytes written before an error (raised after)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class LlmStream:
    """One stream of an ``llm`` run: head, tail window, counts, and the saved copy."""

    def __init__(self, name, number, head_bytes, tail_bytes):
        self.name = name
        self.number = number
        self.head_bytes = max(0, head_bytes)
        self.tail_bytes = max(0, tail_bytes)
        self.head = bytearray()
        self.tail = bytearray()  # everything after the head until cut, then a window
        self.total = 0
        self.lines = 0
        self.fd = None
        self.path = None
        self.saved = 0
        self.error = None

    @property
    def cut(self):
        return self.total > self.head_bytes + self.tail_bytes

    def feed(self, data):
        self.total += len(data)
        self.lines += data.count(b"\n")
        room = self.head_bytes - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        if self.fd is None and self.path is None and self.error is None and self.cut:
            self.start_copy()  # writes the head and everything after it so far
        elif self.fd is not None:
            self.save(data)
        if len(self.tail) > 2 * self.tail_bytes + 65536:  # trimmed now and then: amortised
            del self.tail[: len(self.tail) - self.tail_bytes]

    def start_copy(self):
        try:
            self.fd, self.path = open_output_file(self.name, self.number)
        except Exception as exc:
            self.error = "%s: %s" % (type(exc).__name__, getattr(exc, "strerror", None) or exc)
            return
        self.save(bytes(self.head))
        self.save(bytes(self.tail))

    def save(self, data):
        if self.fd is None:  # the copy already stopped
            return
        try:
            write_all(self.fd, data)
            self.saved += len(data)
        except OSError as exc:
            # The disk is full (or the file was made unwritable): what is saved stays, the
            # run goes on, and the reply says the copy is incomplete.
            self.saved = os.lseek(self.fd, 0, os.SEEK_CUR)
            self.error = "%s: %s" % (type(exc).__name__, exc.strerror or exc)
            self.close()

    def close(self):
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def finish(self):
        """The bytes the reply carries and, when the stream was cut, its ``<name>_llm`` field."""
        self.close()
        if not self.cut:
            return bytes(self.head + self.tail), None
        tail = bytes(self.tail[len(self.tail) - self.tail_bytes :]) if self.tail_bytes else b""
        info = {
            "head_bytes": len(self.head),
            "lines": self.lines,
            "path": self.path,
            "saved_bytes": self.saved,
            "error": self.error,
        }
        return bytes(self.head) + tail, info

"""The audit hook of a policy profile's runtime layer, in the Python session interpreter.

Standard library only, Python 3.8+; a part of the Python worker's source (see ``__init__.py``),
after ``wire.py`` and before ``profile_layer.py``, which installs it (:func:`audit_hook`).

The hook judges an audited operation by **what it touches**, whoever asks: the user's code, a
library it called (``collections.Counter(map(real_open, ...))`` runs ``open`` from a library
frame), or code compiled at run time under any file name. A frame can be borrowed; a path
cannot. So, for every frame:

- refused: starting a process, ``ctypes``, sockets, new threads and interpreters, tracing,
  ``gc``'s walks of the object graph (``get_referents`` but to pandas' copy check, which only
  tests the result), links, ``chdir``/``chown``, signals to processes
  (:data:`REFUSED_EVENTS`, :data:`REFUSED_PREFIXES`);
- file operations (:data:`PATH_EVENTS`) only under the writable roots (``/workspace``, ``/tmp``,
  ``/dev/null``) and, for reading, under the interpreter's own directories (``sys.path`` as the
  layer leaves it, ``/usr/share/zoneinfo``); the path is resolved as the kernel would (``..``
  and symlinks followed from ``/``), a relative path with ``..`` (it could be meant for a
  ``dir_fd``) and a path that is not exactly ``str``, ``bytes`` or ``int`` are refused, and so
  are the worker's own pipes (fds 3 and 4). A refused path raises ``PermissionError``, as a
  read-only file system would, so a library that copes with one (importlib's cache writes)
  goes on;
- called directly by the user's code (the calling frame's globals are the session
  namespace), every audited operation but :data:`USER_EVENTS` is refused: the real ``exec``,
  ``__import__``, ``sys._getframe``, dunder reads such as ``__code__`` (a guardrail; the
  refusals above do not depend on it).

Its state is its closure and nothing else: no global name is looked up when it runs (a
rebound module global or builtin changes nothing), nothing mutable is kept, and nothing
reachable from Python refers to it (``gc``'s walks are refused). It needs no re-entrancy
flag: its own ``sys._getframe(0)`` raises ``sys._getframe`` with the hook's frame as the
argument, which it recognises by that frame's globals.
"""

# mypy: ignore-errors
# (Runs on the sandbox's Python 3.8+, untyped like the other parts of the worker.)

import _stat
import posix
import sys

#: Audited operations user code may perform directly.
USER_EVENTS = frozenset(("builtins.id", "time.sleep", "object.__setattr__", "object.__delattr__"))
#: Audited operations refused to every frame once the layer is on.
REFUSED_EVENTS = frozenset(
    ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
     "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
     "gc.get_objects", "gc.get_referrers", "sys.settrace",
     "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
     "_thread.start_new_thread", "cpython.PyInterpreterState_New", "os.symlink", "os.link",
     "os.chdir", "os.chown", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
     "sqlite3.enable_load_extension", "sqlite3.load_extension", "webbrowser.open",
     "harombe.layer_probe")
)  # fmt: skip
REFUSED_PREFIXES = ("ctypes.", "socket.", "sys.monitoring.", "_xxsubinterpreters.")
#: ``gc.get_referents`` is refused but to these functions, which only test its result:
#: pandas' check for assignment to a copy (``SettingWithCopyWarning``).
REFERENT_READERS = (("pandas.core.generic", "NDFrame", "_check_setitem_copy"),)
#: The probe the worker raises after each call: the hook refuses it, so it is known to be on.
PROBE_EVENT = "harombe.layer_probe"
#: File operations: event -> ((argument index, writes?), ...); ``None``: ``open``'s flags say.
PATH_EVENTS = {
    "open": None,
    "os.listdir": ((0, False),),
    "os.scandir": ((0, False),),
    "os.listxattr": ((0, False),),
    "os.remove": ((0, True),),
    "os.rmdir": ((0, True),),
    "os.mkdir": ((0, True),),
    "os.rename": ((0, True), (1, True)),
    "os.chmod": ((0, True),),
    "os.utime": ((0, True),),
    "os.truncate": ((0, True),),
    "sqlite3.connect": ((0, True),),
}
WRITABLE_ROOTS = ("/workspace", "/tmp", "/dev/null")
EXTRA_READ_ROOTS = ("/usr/share/zoneinfo", "/dev/urandom")
#: The worker's request and reply pipes.
PROTECTED_FDS = (3, 4)
MAX_SYMLINKS = 40
#: Attribute names that reach frames, code and globals without a dunder.
FRAME_NAMES = frozenset(
    ("f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "gi_code",
     "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code")
)  # fmt: skip


def dunder(name):
    """Whether an attribute name (dotted for attrgetter) reaches dunders or frames."""
    if not isinstance(name, str):
        return False
    return any(part.startswith("__") or part in FRAME_NAMES for part in name.split("."))


def _under(path, roots):
    """Whether ``path`` is one of ``roots`` or inside one (looks up no global name)."""
    for root in roots:  # noqa: SIM110 - any() would be a global name looked up at run time
        if path == root or path.startswith(root + "/"):
            return True
    return False


def _path_judge(read_roots, write_roots):
    """``allowed(path, write)``: whether a file operation on ``path`` stays inside the roots.
    Built from C functions and closure values only (see the module docstring)."""
    lstat, readlink, getcwd, is_link = posix.lstat, posix.readlink, posix.getcwd, _stat.S_ISLNK
    str_, bytes_, int_, type_, len_, os_error = str, bytes, int, type, len, OSError
    encoding, protected, max_links = sys.getfilesystemencoding(), PROTECTED_FDS, MAX_SYMLINKS
    reads, writes, under = tuple(read_roots) + tuple(write_roots), tuple(write_roots), _under

    def resolve(path):
        """``path`` (absolute) with ``.``, ``..`` and symlinks resolved; what does not exist
        is joined as written."""
        todo, real, links = path.split("/")[::-1], "", 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                real = real[: real.rfind("/")]
                continue
            candidate = real + "/" + part
            try:
                mode = lstat(candidate).st_mode
            except os_error:
                mode = 0
            if mode and is_link(mode):
                links += 1
                if links > max_links:
                    return "/"
                target = readlink(candidate)
                todo.extend(target.split("/")[::-1])
                if target.startswith("/"):
                    real = ""
                continue
            real = candidate
        return real or "/"

    def allowed(path, write):
        kind = type_(path)
        if path is None:
            path = getcwd()
        elif kind is int_:
            return path not in protected
        elif kind is bytes_:
            path = path.decode(encoding, "surrogateescape")
        elif kind is not str_:
            return False
        if not path.startswith("/"):
            if ".." in path.split("/"):
                return False
            path = getcwd() + "/" + path
        if len_(path) > 4096:
            return False
        real = resolve(path)
        return under(real, writes) or (not write and under(real, reads))

    return allowed


def referent_readers():
    """The code of the loaded :data:`REFERENT_READERS`, taken before the hook is on."""
    found = []
    for module_name, owner, name in REFERENT_READERS:
        module = sys.modules.get(module_name)
        function = getattr(getattr(module, owner, None), name, None)
        code = getattr(function, "__code__", None)
        if code is not None:
            found.append(code)
    return tuple(found)


def audit_hook(namespace, read_roots, readers=(), write_roots=WRITABLE_ROOTS):
    """The layer's audit hook (see the module docstring); user code is code whose globals are
    ``namespace``; ``readers`` is the code that may call ``gc.get_referents``. Every name it
    uses at run time is bound here."""
    own, getframe = globals(), sys._getframe
    frame_type = type(getframe(0))
    refused, refused_prefixes, user_events = REFUSED_EVENTS, REFUSED_PREFIXES, USER_EVENTS
    path_events, frame_names = PATH_EVENTS, FRAME_NAMES
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    str_, int_, type_, len_ = str, int, type, len
    error, denied = RuntimeError, PermissionError
    allowed = _path_judge(tuple(read_roots) + EXTRA_READ_ROOTS, write_roots)

    def is_dunder(name):
        if type_(name) is not str_:
            return True
        for part in name.split("."):  # noqa: SIM110 - no global name (any) at run time
            if part.startswith("__") or part in frame_names:
                return True
        return False

    def reads_referents(caller):
        code = caller.f_code if caller is not None else None  # audited: allowed, see hook
        for reader in readers:  # noqa: SIM110 - no global name (any) at run time
            if code is reader:
                return True
        return False

    def check_paths(event, args, rule):
        if rule is None:  # open(path, mode, flags)
            flags = args[2] if len_(args) > 2 else 0
            rule = ((0, type_(flags) is not int_ or (flags & write_flags) != 0),)
        for index, write in rule:
            path = args[index] if index < len_(args) else None
            if not allowed(path, write):
                shown = path if type_(path) in (str_, int_) else type_(path).__name__
                raise denied(f"{event} of {shown!r} blocked by sandbox")

    def hook(event, args):
        if (
            event == "sys._getframe"
            and len_(args) == 1
            and type_(args[0]) is frame_type
            and args[0].f_globals is own
        ):
            return  # the hook's own look at the stack
        if event in refused or event.startswith(refused_prefixes):
            raise error(f"{event} blocked by sandbox")
        if event in user_events and not (event[:7] == "object." and is_dunder(args[1])):
            return
        caller = getframe(0).f_back
        if caller is not None and caller.f_globals is namespace:
            raise error(f"{event} blocked by sandbox")
        if event == "gc.get_referents" and not reads_referents(caller):
            raise error(f"{event} blocked by sandbox")
        rule = path_events.get(event, False)
        if rule is not False:
            check_paths(event, args, rule)

    return hook

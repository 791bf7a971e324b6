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
  and symlinks followed from ``/``); refused: a relative path with ``..``, a relative path
  given with a ``dir_fd`` or to ``os.open`` (its event has mode None and does not carry the
  ``dir_fd``: the path may lead anywhere), a path that is not exactly ``str``, ``bytes`` or
  ``int``, and the descriptor numbers 3 and 4 (the worker's pipes; a copy made by ``os.dup``
  is not audited). ``sqlite3.connect`` is judged by the file a ``file:`` URI names
  (``file:/etc/passwd?mode=ro``). A refused path raises ``PermissionError``, as a
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
#: File operations: event -> ((path's index, writes?, its ``dir_fd``'s index or None), ...);
#: ``None``: ``open``'s flags say; ``"uri"``: a database name, maybe a ``file:`` URI.
PATH_EVENTS = {
    "open": None,
    "os.listdir": ((0, False, None),),
    "os.scandir": ((0, False, None),),
    "os.listxattr": ((0, False, None),),
    "os.remove": ((0, True, 1),),
    "os.rmdir": ((0, True, 1),),
    "os.mkdir": ((0, True, 2),),
    "os.rename": ((0, True, 2), (1, True, 3)),
    "os.chmod": ((0, True, 2),),
    "os.utime": ((0, True, 3),),
    "os.truncate": ((0, True, None),),
    "sqlite3.connect": "uri",
}
WRITABLE_ROOTS = ("/workspace", "/tmp", "/dev/null")
EXTRA_READ_ROOTS = ("/usr/share/zoneinfo", "/dev/urandom")
#: The worker's request and reply pipes.
PROTECTED_FDS = (3, 4)
MAX_SYMLINKS = 40
#: What the hook calls, taken when the worker's source runs, before any import: a module that
#: rebinds ``posix.lstat`` or ``sys._getframe`` later changes nothing the hook does.
NATIVE = (posix.lstat, posix.readlink, posix.getcwd, _stat.S_ISLNK, sys._getframe,
          sys.getfilesystemencoding())  # fmt: skip
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
    """``allowed(path, write, anchored)``: whether a file operation on ``path`` stays inside
    the roots; ``anchored``: a relative path is taken from a directory the event does not say
    (a ``dir_fd``), so it is refused. Built from C functions and closure values only (see the
    module docstring)."""
    lstat, readlink, getcwd, is_link = NATIVE[:4]
    str_, bytes_, int_, type_, len_, os_error = str, bytes, int, type, len, OSError
    encoding, protected, max_links = NATIVE[5], PROTECTED_FDS, MAX_SYMLINKS
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

    def allowed(path, write, anchored=False):
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
            if anchored or ".." in path.split("/"):
                return False
            path = getcwd() + "/" + path
        if len_(path) > 4096:
            return False
        real = resolve(path)
        return under(real, writes) or (not write and under(real, reads))

    return allowed


def _database_path():
    """``path(name)``: the file a database name opens. A ``file:`` URI (SQLite reads one as
    a URI with ``uri=True``, which the audit event does not say) gives its path: the query
    and fragment dropped, an authority other than ``localhost`` or a ``%`` escape refused
    (False, which the judge refuses); any other name is itself."""
    str_, bytes_, type_, encoding = str, bytes, type, NATIVE[5]

    def path(name):
        if type_(name) is bytes_:
            name = name.decode(encoding, "surrogateescape")
        if type_(name) is not str_ or name[:5].lower() != "file:":
            return name
        rest = name[5:].partition("?")[0].partition("#")[0]
        if rest[:2] == "//":
            authority, _, rest = rest[2:].partition("/")
            if authority.lower() not in ("", "localhost"):
                return False
            rest = "/" + rest
        if "%" in rest:
            return False
        return rest

    return path


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


def _path_checker(allowed):
    """``check(event, args, rule)``: raises ``PermissionError`` when a file operation's path
    (by its :data:`PATH_EVENTS` rule) is not ``allowed``. Closure values only."""
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    str_, int_, type_, len_, denied = str, int, type, len, PermissionError
    database = _database_path()

    def check_paths(event, args, rule):
        count = len_(args)
        if rule == "uri":  # sqlite3.connect(database): judged by the file a URI names
            name = args[0] if count else None
            if not allowed(database(name), True, False):
                shown = name if type_(name) is str_ else type_(name).__name__
                raise denied(f"{event} of {shown!r} blocked by sandbox")
            return
        if rule is None:  # open(path, mode, flags); os.open's mode is None, its dir_fd unsaid
            flags = args[2] if count > 2 else 0
            write = type_(flags) is not int_ or (flags & write_flags) != 0
            checks = ((args[0] if count else None, write, count > 1 and args[1] is None),)
        else:  # a dir_fd of -1 is the default: the working directory
            checks = [(args[i] if i < count else None, write,
                       fd is not None and fd < count and args[fd] is not None and args[fd] != -1)
                      for i, write, fd in rule]  # fmt: skip
        for path, write, anchored in checks:
            if not allowed(path, write, anchored):
                shown = path if type_(path) in (str_, int_) else type_(path).__name__
                raise denied(f"{event} of {shown!r} blocked by sandbox")

    return check_paths


def audit_hook(namespace, read_roots, readers=(), write_roots=WRITABLE_ROOTS):
    """The layer's audit hook (see the module docstring); user code is code whose globals are
    ``namespace``; ``readers`` is the code that may call ``gc.get_referents``. Every name it
    uses at run time is bound here."""
    own, getframe = globals(), NATIVE[4]
    frame_type = type(getframe(0))
    refused, refused_prefixes, user_events = REFUSED_EVENTS, REFUSED_PREFIXES, USER_EVENTS
    path_events, frame_names = PATH_EVENTS, FRAME_NAMES
    str_, type_, len_, error = str, type, len, RuntimeError
    check_paths = _path_checker(_path_judge(tuple(read_roots) + EXTRA_READ_ROOTS, write_roots))

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

"""The runtime layer of a policy profile, inside the Python session interpreter.

Standard library only, Python 3.8+; a part of the Python worker's source (see ``__init__.py``),
after ``wire.py`` and before ``pyworker.py``. When ``$HAROMBE_PROFILE`` holds a profile's
runtime spec (JSON: ``allowed_imports``, ``preimport``, ``subprocess_memory_mb``,
``blocklist``), the worker calls :func:`apply_profile` once, as the interpreter starts and
before it reads its first request. The host puts that variable in the environment of every run
on a profiled sandbox, so an interpreter the supervisor restarts (after a timeout, say) gets
the layer again before any code of the user runs in it.

In order:

- ``RLIMIT_AS`` (soft and hard) is ``subprocess_memory_mb``, for the interpreter and every
  process it starts;
- the ``preimport`` modules are imported, so a call pays nothing for them;
- user code (frames whose globals are the session's namespace, or whose code was compiled
  from a string) gets builtins of its own: ``open``, ``breakpoint`` and ``input`` removed,
  ``getattr``/``setattr``/``delattr``/``hasattr`` refusing dunder and frame names, and an
  ``__import__`` that lets in only the profile's modules (by top-level name), no relative
  imports and no blocklisted ``module.attr``. Library modules keep the real builtins, so a
  module importing its own dependencies is unaffected;
- ``random._os`` is removed; ``operator.attrgetter``/``methodcaller`` refuse dunder names;
  each blocklisted ``(module, attr)`` is replaced by a stub that refuses to be used, in
  modules loaded now and in those loaded later (checked at every import of user code);
- an audit hook (it cannot be removed, and nothing reachable from Python refers to it) refuses
  to user code every audited operation but ``id()`` and ``time.sleep``, so a real
  ``open``/``__import__``/``exec``/``os.*`` reached through the object graph still fails, and
  refuses to everyone the start of a process and ``ctypes`` loading and calls.

What it cannot hold: code that walks the object graph with dunder attributes the audit does
not see (``__subclasses__``, ``__globals__``) reaches objects the layer does not guard, such as
``os.write`` on an inherited fd, or a ``ctypes`` function already loaded by a library and
called through a library's own Python frame. Those are caught by the static scan (enforce mode)
and contained by the sandbox itself, never by this layer alone.
"""

# mypy: ignore-errors
# (Runs on the sandbox's Python 3.8+, untyped like the other parts of the worker.)

import builtins
import resource
import sys

PROFILE_ENV = "HAROMBE_PROFILE"
BLOCKED_IMPORT = "import of '{}' blocked by sandbox"
BLOCKED_DUNDER = "dunder attribute access blocked by sandbox"
REMOVED_BUILTINS = ("open", "breakpoint", "input")
#: Attribute names that reach frames, code and globals without a dunder.
FRAME_NAMES = frozenset(
    ("f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "gi_code",
     "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code")
)  # fmt: skip
#: Audited operations user code may perform (all others are refused to it).
USER_EVENTS = frozenset(("builtins.id", "time.sleep", "object.__setattr__", "object.__delattr__"))
#: Audited operations refused to every frame once the layer is on: no process is started and
#: no foreign code is loaded or called.
GLOBAL_EVENTS = frozenset(
    ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
     "subprocess.Popen", "pty.spawn", "ctypes.dlopen", "ctypes.call_function")
)  # fmt: skip
#: Code compiled from files the runtime froze, and the worker's own code, is library code.
LIBRARY_PREFIXES = ("<frozen", "<harombe-worker>")


def dunder(name):
    """Whether an attribute name (dotted for attrgetter) reaches dunders or frames."""
    if not isinstance(name, str):
        return False
    return any(part.startswith("__") or part in FRAME_NAMES for part in name.split("."))


class Blocked:
    """Stands in for a blocklisted ``module.attr``: any use of it is refused."""

    __slots__ = ("what",)

    def __init__(self, what):
        self.what = what

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.what} is blocked by sandbox")

    def __getattr__(self, name):
        raise RuntimeError(f"{self.what} is blocked by sandbox")

    def __repr__(self):
        return f"<{self.what}: blocked by sandbox>"


def apply_profile(spec_text, namespace):
    """Apply the runtime spec ``spec_text`` (JSON) to this interpreter; user code is the code
    run in ``namespace``. Raises ``RuntimeError`` naming the step (and module) that failed."""
    try:
        spec = loads(spec_text)  # noqa: F821 - wire.py, the part before this one
        allowed = frozenset(str(m) for m in spec["allowed_imports"])
        blocklist = tuple((str(m), str(a)) for m, a in spec.get("blocklist", ()))
        preimports = [str(m) for m in spec.get("preimport", ())]
        memory_mb = int(spec.get("subprocess_memory_mb") or 0)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it is reported
        raise RuntimeError(f"the profile's runtime spec is malformed: {exc!r}") from None
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"could not set RLIMIT_AS to {memory_mb} MB: {exc}") from None
    # The one import of a non-standard module in guest code: the profile names it (numpy, say),
    # and it runs inside the sandbox, before the user's code.
    load_module = builtins.__import__
    for name in preimports:
        try:
            load_module(name)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, MemoryError: all reported
            raise RuntimeError(
                f"preimport of '{name}' failed: {type(exc).__name__}: {exc}"
            ) from None
    if not spec.get("enforce", True):
        return  # the profile's runtime audit mode is "observe": limits and preimports only
    _guard_modules()
    pending = _Blocklist(blocklist)
    pending.patch()
    namespace["__builtins__"] = _user_builtins(allowed, pending)
    sys.addaudithook(_audit_hook(namespace))


def _guard_modules():
    """``random._os`` goes; ``operator``'s getters refuse dunder names."""
    import operator
    import random

    random.__dict__.pop("_os", None)
    real_attrgetter, real_methodcaller = operator.attrgetter, operator.methodcaller

    def attrgetter(attr, *attrs):
        if any(dunder(a) for a in (attr, *attrs)):
            raise RuntimeError(BLOCKED_DUNDER)
        return real_attrgetter(attr, *attrs)

    def methodcaller(name, *args, **kwargs):
        if dunder(name):
            raise RuntimeError(BLOCKED_DUNDER)
        return real_methodcaller(name, *args, **kwargs)

    operator.attrgetter, operator.methodcaller = attrgetter, methodcaller


class _Blocklist:
    """The profile's ``(module, attr)`` entries: refused as imports, stubbed in modules."""

    def __init__(self, entries):
        self.entries = entries
        self.paths = frozenset(f"{module}.{attr}" for module, attr in entries)
        self.waiting = set(module for module, _ in entries)

    def refuses(self, name, fromlist):
        """The dotted name an import of ``name`` (``from name import fromlist``) would reach
        that the blocklist names, or None."""
        for path in self.paths:
            if name == path or name.startswith(path + "."):
                return path
        for item in fromlist or ():
            if f"{name}.{item}" in self.paths:
                return f"{name}.{item}"
        return None

    def patch(self):
        """Stub the blocklisted attributes of every listed module loaded by now."""
        if not self.waiting:
            return
        modules = sys.modules
        for module_name in [m for m in self.waiting if m in modules]:
            self.waiting.discard(module_name)
            module = modules[module_name]
            for owner, attr in self.entries:
                if owner == module_name:
                    setattr(module, attr, Blocked(f"{owner}.{attr}"))


def _user_builtins(allowed, blocklist):
    """The builtins user code sees: see the module docstring."""
    real_import, real_getattr = builtins.__import__, builtins.getattr
    real_setattr, real_delattr = builtins.setattr, builtins.delattr

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if not isinstance(name, str) or level != 0:
            raise ImportError(BLOCKED_IMPORT.format("." * int(level or 0) + str(name)))
        if name.partition(".")[0] not in allowed:
            raise ImportError(BLOCKED_IMPORT.format(name))
        blocked = blocklist.refuses(name, fromlist)
        if blocked is not None:
            raise ImportError(BLOCKED_IMPORT.format(blocked))
        module = real_import(name, globals, locals, fromlist, level)
        blocklist.patch()
        return module

    def getattr(obj, name, *default):
        if dunder(name):
            raise RuntimeError(BLOCKED_DUNDER)
        return real_getattr(obj, name, *default)

    def hasattr(obj, name):
        if dunder(name):
            raise RuntimeError(BLOCKED_DUNDER)
        try:
            real_getattr(obj, name)
        except AttributeError:
            return False
        return True

    def setattr(obj, name, value):
        if dunder(name):
            raise RuntimeError(BLOCKED_DUNDER)
        real_setattr(obj, name, value)

    def delattr(obj, name):
        if dunder(name):
            raise RuntimeError(BLOCKED_DUNDER)
        real_delattr(obj, name)

    own = dict(builtins.__dict__)
    for name in REMOVED_BUILTINS:
        own.pop(name, None)
    own.update(__import__=guarded_import, getattr=getattr, hasattr=hasattr,
               setattr=setattr, delattr=delattr)  # fmt: skip
    return own


def _audit_hook(namespace):
    """The audit hook: see the module docstring. Its state lives in its closure only."""
    getframe = sys._getframe
    busy = [False]  # sys._getframe is audited too: the hook must not judge its own calls

    def hook(event, args):
        if busy[0]:
            return
        if event in GLOBAL_EVENTS:
            raise RuntimeError(f"{event} blocked by sandbox")
        if event in USER_EVENTS and not (event.startswith("object.") and dunder(args[1])):
            return
        busy[0] = True
        try:
            frame = getframe(1)
            code_name = frame.f_code.co_filename
            user = frame.f_globals is namespace or (
                code_name.startswith("<") and not code_name.startswith(LIBRARY_PREFIXES)
            )
        finally:
            busy[0] = False
        if user:
            raise RuntimeError(f"{event} blocked by sandbox")

    return hook

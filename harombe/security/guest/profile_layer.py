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
- ``sys.path`` loses the working directory, ``/workspace``, ``/tmp`` and the home directory
  but its user site, which goes last (so a workspace ``numpy.py`` is never imported as the
  library, and the user site shadows no system module), and bytecode caches are not written;
- the ``preimport`` modules are imported (and ``preimport_needed``, if installed), so a call
  pays nothing for them; in observe mode ``sys.path`` is then given back and the layer ends;
- ``RLIMIT_NPROC`` is 0, so the kernel refuses this interpreter any new process or thread,
  also through calls no audit event announces (``_posixsubprocess.fork_exec``);
- ``operator.attrgetter``/``methodcaller`` refuse dunder names; module aliases of the allowed
  standard-library modules (``random._os``, ``collections._sys``) are dropped or narrowed to
  the names the module's own code reads (:class:`_Aliases`); each blocklisted
  ``(module, attr)`` is replaced by a stub that refuses to be used, in modules loaded now and
  in those loaded later (checked at every import of user code);
- user code (code whose globals are the session's namespace) gets builtins of its own:
  ``open``, ``breakpoint`` and ``input`` removed, ``getattr``/``setattr``/``delattr``/
  ``hasattr`` refusing dunder and frame names, and an ``__import__`` that lets in only the
  profile's modules (by top-level name), no relative imports and no blocklisted
  ``module.attr``. Library modules keep the real builtins;
- the audit hook of ``profile_hook.py``: it judges what an operation touches, for every frame
  (processes, ``ctypes``, sockets, threads, ``gc``'s walks refused; files only under
  ``/workspace``, ``/tmp`` and, to read, the interpreter's own directories), and refuses user
  code's own direct calls of every audited operation but ``id()`` and ``time.sleep``.

:func:`apply_profile` returns the layer's check, which the worker runs after every call: the
hook still answers, the namespace and its builtins, ``operator``'s getters, ``sys.path``, the
narrowed aliases and the blocklist stubs (by identity) are as the layer left them. A call that
changed any of them ends the session (the next call starts a new interpreter with the layer,
and says ``state_lost``).

What it cannot hold, by itself: code that walks the object graph with dunder attributes the
audit does not see (``__subclasses__``, ``__globals__``) reaches every object of the
interpreter — the real builtins, the worker's own globals — and whatever is not audited:
``os.write`` on an inherited descriptor, metadata (``os.stat``, ``os.readlink``) of any path,
files a C library opens by itself (``dbm``), and the guardrails of this module (the user's
builtins, stubs, aliases) within a call. The audit hook's refusals and ``RLIMIT_NPROC`` hold
against such code; the rest is the static scan's (enforce mode) and the sandbox's to contain.
"""

# mypy: ignore-errors
# (Runs on the sandbox's Python 3.8+, untyped like the other parts of the worker.)

import builtins
import os
import resource
import sys

ModuleType = type(sys)

PROFILE_ENV = "HAROMBE_PROFILE"
BLOCKED_IMPORT = "import of '{}' blocked by sandbox"
BLOCKED_DUNDER = "dunder attribute access blocked by sandbox"
REMOVED_BUILTINS = ("open", "breakpoint", "input")
GUARDED_BUILTINS = ("__import__", "getattr", "hasattr", "setattr", "delattr")
#: Where user-made files live: never on ``sys.path`` of a profiled session.
UNTRUSTED_DIRS = ("/workspace", "/tmp")
#: What the worker is told when a call changed the layer (at most 64 characters).
LAYER_CHANGED = "the profile's runtime layer was changed ({})"
#: What the layer calls, taken when the worker's source runs, before any import (a module that
#: replaces ``sys.addaudithook`` or ``sys.audit`` changes nothing the layer does).
NATIVE_LAYER = (sys.addaudithook, resource.setrlimit, builtins.__import__, os.getcwd, sys.audit)


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
    run in ``namespace``. Returns the layer's check for the worker to run after each call (see
    :func:`_layer_check`), or None in observe mode. Raises ``RuntimeError`` naming the step
    (and module) that failed."""
    add_audit_hook, set_rlimit = NATIVE_LAYER[:2]
    allowed, blocklist, preimports, needed, memory_mb, enforce = _read_spec(spec_text)
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        try:
            set_rlimit(resource.RLIMIT_AS, (limit, limit))
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"could not set RLIMIT_AS to {memory_mb} MB: {exc}") from None
    # The trusted path comes before any import: a workspace ``numpy.py`` is never a preimport.
    user_path, user_bytecode = list(sys.path), sys.dont_write_bytecode
    read_roots = _trusted_path()
    _preimport(preimports, needed)
    if not enforce:  # the runtime audit mode is "observe": limits and preimports only
        sys.path[:], sys.dont_write_bytecode = user_path, user_bytecode
        return None
    # No process and no thread from here on, even through a call the audit does not see
    # (``_posixsubprocess.fork_exec``): the kernel refuses them to this user.
    set_rlimit(resource.RLIMIT_NPROC, (0, 0))
    operators = _guard_modules()
    aliases = _Aliases(allowed)
    aliases.patch()
    pending = _Blocklist(blocklist)
    pending.patch()
    own = namespace["__builtins__"] = _user_builtins(allowed, pending, aliases)
    readers = referent_readers()  # noqa: F821 - profile_hook.py
    add_audit_hook(audit_hook(namespace, read_roots, readers))  # noqa: F821 - profile_hook.py
    return _layer_check(namespace, own, dict(own), operators, (aliases, pending), list(sys.path))


def _read_spec(spec_text):
    """(allowed, blocklist, preimports, needed, memory_mb, enforce) from the spec's JSON."""
    try:
        spec = loads(spec_text)  # noqa: F821 - wire.py, the part before this one
        return (
            frozenset(str(m) for m in spec["allowed_imports"]),
            tuple((str(m), str(a)) for m, a in spec.get("blocklist", ())),
            [str(m) for m in spec.get("preimport", ())],
            [str(m) for m in spec.get("preimport_needed", ())],
            int(spec.get("subprocess_memory_mb") or 0),
            bool(spec.get("enforce", True)),
        )
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it is reported
        raise RuntimeError(f"the profile's runtime spec is malformed: {exc!r}") from None


def _preimport(names, needed=()):
    """Import the profile's ``preimport`` modules (from the trusted path only), then those
    ``needed`` ahead (numpy: its import starts threads, refused later) that are installed."""
    # The one import of a non-standard module in guest code: the profile names it (numpy, say),
    # and it runs inside the sandbox, before the user's code.
    load_module = NATIVE_LAYER[2]
    for name in names:
        try:
            load_module(name)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, MemoryError: all reported
            raise RuntimeError(
                f"preimport of '{name}' failed: {type(exc).__name__}: {exc}"
            ) from None
    for name in needed:
        try:
            load_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # installed, but broken: reported as any preimport
                raise RuntimeError(f"preimport of '{name}' failed: {exc}") from None


def _trusted_path():
    """Drop the working directory and user-writable places from ``sys.path`` (a workspace
    ``statistics.py`` must not be imported as the library; the user site goes last, so it
    shadows no standard or system module), stop writing bytecode caches, and return the
    directories left: the interpreter's own, readable by any code."""
    home = os.environ.get("HOME") or "/home/sandbox"
    untrusted = (*UNTRUSTED_DIRS, home, NATIVE_LAYER[3]())
    own = (sys.prefix, sys.base_prefix)  # the interpreter's own, wherever it is installed
    kept = [p for p in sys.path
            if p.startswith("/") and (_inside(p, own) or not _inside(p, untrusted))]  # fmt: skip
    user_site = [p for p in sys.path if p.startswith(home + "/.local/") and p not in kept]
    sys.path[:] = kept + user_site  # packages the user installed stay importable, last
    sys.dont_write_bytecode = True
    return tuple(p.rstrip("/") for p in kept + user_site)


def _inside(path, dirs):
    path = path.rstrip("/") or "/"
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _guard_modules():
    """``operator``'s getters refuse dunder names; returns the wrappers, for the check."""
    import operator

    real_attrgetter, real_methodcaller = operator.attrgetter, operator.methodcaller

    def attrgetter(attr, *attrs):
        if any(dunder(a) for a in (attr, *attrs)):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        return real_attrgetter(attr, *attrs)

    def methodcaller(name, *args, **kwargs):
        if dunder(name):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        return real_methodcaller(name, *args, **kwargs)

    operator.attrgetter, operator.methodcaller = attrgetter, methodcaller
    return operator, attrgetter, methodcaller


class _Aliases:
    """Module aliases in the standard-library modules the profile allows (``random._os``,
    ``collections._sys``): an attribute naming a module outside the profile is dropped, or,
    when the module's own code reads that name, replaced by a module holding only the names
    that code reads (``collections._sys`` keeps ``intern``, ``_getframe``, ``getsizeof``,
    ``maxsize``). Third-party modules (numpy, pandas) are left as they are: their code cannot
    be read whole cheaply, and a missing name would break them."""

    def __init__(self, allowed):
        self.allowed = allowed
        self.seen = set()
        self.done = []  # (module's dict, attribute, what it holds now or None)
        self.stdlib = os.path.dirname(os.__file__) + "/"

    def patch(self):
        """Narrow the aliases of every allowed module loaded since the last call."""
        for name, module in list(sys.modules.items()):
            if name in self.seen:
                continue
            self.seen.add(name)
            if name.partition(".")[0] in self.allowed:
                try:  # noqa: SIM105 - contextlib is not imported by the worker
                    self._narrow(module)
                except Exception:  # noqa: BLE001 - a module we cannot read stays as is
                    pass

    def _narrow(self, module):
        path = getattr(module, "__file__", None) or ""
        if not path.startswith(self.stdlib) or "-packages/" in path:
            return
        table = module.__dict__
        aliases = [(attr, value) for attr, value in table.items()
                   if type(value) is ModuleType and str(value.__name__).partition(".")[0]
                   not in self.allowed]  # fmt: skip
        if not aliases:
            return
        read = _names_read(module.__spec__.loader.get_code(module.__name__))
        for attr, value in aliases:
            view = None
            if attr in read:
                view = ModuleType(value.__name__)
                for name in read:
                    if name in value.__dict__ and not name.startswith("__"):
                        setattr(view, name, value.__dict__[name])
                table[attr] = view
            else:
                del table[attr]
            self.done.append((table, attr, view))


def _names_read(code):
    """Every name the functions and classes of a module's code read (its top level, run
    when it was imported, is left out: it binds every alias)."""
    names, todo = set(), [c for c in code.co_consts if type(c) is type(code)]
    while todo:
        code = todo.pop()
        names.update(code.co_names)
        todo.extend(c for c in code.co_consts if type(c) is type(code))
    return names


def _layer_check(namespace, own, expected, operators, patchers, path):
    """The check the worker runs after each call: None while the layer is as applied, else
    why not (at most 64 characters). A changed layer ends the session, which the supervisor
    restarts with the layer applied afresh; the call says ``state_lost``. Like the audit hook,
    it looks up no global name when it runs, and no attribute of an object user code can
    reach: what it uses is bound here."""
    audit, probe, error = NATIVE_LAYER[4], PROBE_EVENT, RuntimeError  # noqa: F821 - profile_hook
    guarded, removed, changed, sys_module = GUARDED_BUILTINS, REMOVED_BUILTINS, LAYER_CHANGED, sys
    operator, attrgetter, methodcaller = operators
    modules, sys_path, path = sys.modules, sys.path, tuple(path)
    tuple_ = tuple
    # The narrowed aliases and the blocklist stubs: (module's dict, attribute, what it holds).
    aliases, stubs = patchers
    patches = ((aliases.patch, aliases.done, changed.format("module alias")),
               (stubs.patch, stubs.done, changed.format("blocklist stub")))  # fmt: skip

    def check(current):
        try:
            audit(probe)
        except error:
            pass
        else:
            return changed.format("audit hook")
        if current is not namespace or namespace.get("__builtins__") is not own:
            return changed.format("namespace")
        for name in guarded:
            if own.get(name) is not expected[name]:
                return changed.format("builtins")
        for name in removed:
            if name in own:
                return changed.format("builtins")
        if operator.attrgetter is not attrgetter or operator.methodcaller is not methodcaller:
            return changed.format("operator")
        if sys_module.path is not sys_path or tuple_(sys_path) != path:
            return changed.format("sys.path")
        if sys_module.modules is not modules:
            return changed.format("sys.modules")
        for patch, done, why in patches:
            patch()  # modules a library loaded during the call
            for table, attr, value in done:
                if table.get(attr) is not value:
                    return why
        return None

    return check


class _Blocklist:
    """The profile's ``(module, attr)`` entries: refused as imports, stubbed in modules."""

    def __init__(self, entries):
        self.entries = entries
        self.paths = frozenset(f"{module}.{attr}" for module, attr in entries)
        self.waiting = set(module for module, _ in entries)
        self.done = []  # (module's dict, attribute, its stub)

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
            table = modules[module_name].__dict__
            for owner, attr in self.entries:
                if owner == module_name:
                    table[attr] = stub = Blocked(f"{owner}.{attr}")
                    self.done.append((table, attr, stub))


def _user_builtins(allowed, blocklist, aliases):
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
        aliases.patch()
        return module

    def getattr(obj, name, *default):
        if dunder(name):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        return real_getattr(obj, name, *default)

    def hasattr(obj, name):
        if dunder(name):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        try:
            real_getattr(obj, name)
        except AttributeError:
            return False
        return True

    def setattr(obj, name, value):
        if dunder(name):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        real_setattr(obj, name, value)

    def delattr(obj, name):
        if dunder(name):  # noqa: F821 - profile_hook.py
            raise RuntimeError(BLOCKED_DUNDER)
        real_delattr(obj, name)

    own = dict(builtins.__dict__)
    for name in REMOVED_BUILTINS:
        own.pop(name, None)
    own.update(__import__=guarded_import, getattr=getattr, hasattr=hasattr,
               setattr=setattr, delattr=delattr)  # fmt: skip
    return own

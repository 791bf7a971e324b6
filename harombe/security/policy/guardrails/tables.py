"""The names the guardrails refuse, as data. Kept apart from the scans so they read as lists.

Why each group is here:

* builtins that run strings as code, import by name, reach namespaces or read attributes by a
  computed name (``getattr`` is how ``"__glo" + "bals__"`` becomes an attribute);
* attribute names that are dangerous on whatever object they hang (``x.system`` is
  ``os.system`` when ``x`` is the os module, and static analysis cannot always tell);
* dunder and frame names: the classic escapes walk ``().__class__.__bases__[0]
  .__subclasses__()`` or a frame's ``f_globals`` to the builtins;
* names of modules that allowed modules keep as attributes (``random._os`` is ``os``).
"""

from __future__ import annotations

import re

#: Builtins refused as calls *and* as bare names (``e = eval`` is as good as a call).
BLOCKED_BUILTINS = frozenset({
    "eval", "exec", "compile", "__import__", "open", "getattr", "setattr", "delattr",
    "breakpoint", "input", "globals", "locals", "vars", "get_type_hints",
})  # fmt: skip

#: Attribute names refused on any object: they open files, run code or evaluate strings.
BLOCKED_ATTRIBUTES = frozenset({
    "open", "exec", "eval", "compile", "system", "popen", "get_data", "_evaluate", "FileIO",
    "ForwardRef", "get_field", "vformat", "get_type_hints",
    # typing's evaluator; numpy.distutils' shell; scipy's C-pointer calls; numpy.testing's
    # measure(), which runs a string as code.
    "_eval_type", "exec_command", "LowLevelCallable", "measure",
    # singledispatch's register evaluates the string annotations of what it is given
    # (typing.get_type_hints), and a class's annotations can be built at run time.
    "singledispatch", "singledispatchmethod",
    # Code and function objects built from raw parts (typing.types.CodeType) run any bytecode.
    "CodeType", "FunctionType", "LambdaType",
})  # fmt: skip

#: ``compile`` of the regular-expression module is ordinary and harmless.
ATTRIBUTE_EXCEPTIONS = frozenset({("re", "compile")})

#: Modules of which every member is refused (a profile that allows importing them still may
#: not use them).
BLOCKED_MODULES = frozenset({"subprocess", "socket", "importlib", "signal"})

#: The os process family: refused on ``os`` (and ``posix``) by exact name or prefix.
OS_MODULES = frozenset({"os", "posix"})
OS_PROCESS_NAMES = frozenset({
    "system", "popen", "kill", "killpg", "abort", "_exit", "setsid", "setpgid", "getpgid",
    "getpid", "getppid", "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid",
    "setresuid", "setresgid", "posix_spawn", "posix_spawnp", "wait", "waitpid", "wait3",
    "wait4", "pidfd_open",
})  # fmt: skip
OS_PROCESS_PREFIXES = ("fork", "exec", "spawn", "kill")

#: Dunder names refused as attributes, and as bare names, subscript keys, string literals and
#: format-string fields: class-graph walks, namespaces, code, frames, import machinery, and
#: the universal attribute primitives.
BLOCKED_DUNDERS = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__traceback__", "__import__",
    "__class__", "__bases__", "__base__", "__mro__", "__dict__", "__code__", "__closure__",
    "__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__self__", "__func__",
    "__wrapped__", "__loader__", "__spec__", "__cached__", "__defaults__", "__kwdefaults__",
    "__reduce__", "__reduce_ex__", "__objclass__", "__build_class__",
    # String annotations are evaluated (typing.get_type_hints, functools.singledispatch's
    # register): annotations written as code are scanned, ones set as data would not be.
    "__annotations__",
    # Class-pattern machinery (MATCH_DUNDERS below).
    "__match_args__", "__instancecheck__", "__subclasscheck__", "__subclasshook__",
})  # fmt: skip

#: Frame, generator, coroutine and traceback attributes: each reaches a frame's globals.
FRAME_ATTRIBUTES = frozenset({
    "f_globals", "f_locals", "f_builtins", "f_code", "f_back", "f_trace",
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "cr_origin",
    "ag_frame", "ag_code", "ag_await", "tb_frame", "tb_next",
})  # fmt: skip

#: Attribute names that are other modules kept inside allowed ones (``random._os``,
#: ``statistics.sys``, ``enum.bltns``, ``contextlib.os``).
MODULE_ALIASES = frozenset({
    "_os", "_sys", "_subprocess", "_socket", "_signal", "_ctypes", "_multiprocessing",
    "_pickle", "_marshal", "_shutil", "_mmap", "_pty", "_io", "_imp", "_thread", "_posix",
    "os", "sys", "subprocess", "socket", "signal", "ctypes", "multiprocessing", "pickle",
    "marshal", "shutil", "mmap", "pty", "posix", "nt", "builtins", "bltns", "codecs", "io",
    "pathlib", "tempfile", "importlib", "imp", "gc", "inspect", "threading", "distutils",
    "f2py",
})  # fmt: skip
#: Dotted module paths whose alias-named member is a real, harmless subpackage.
ALIAS_EXCEPTIONS = frozenset({("scipy", "io")})

#: Dunder bare names ordinary code reads (``if __name__ == "__main__":``); any other dunder
#: bare name is refused.
READABLE_DUNDERS = frozenset({
    "__name__", "__doc__", "__debug__", "__file__", "__all__", "__version__", "__author__",
    "__module__", "__qualname__", "__slots__",
})  # fmt: skip
#: Dunder names code may bind at module or function level; binding any other (``__name__ =``,
#: ``__builtins__ =``) changes how the module is treated, so it is refused. Class bodies may
#: bind dunders (``__init__``, ``__slots__``, ``__hash__ = None``).
BINDABLE_DUNDERS = frozenset({"__all__", "__doc__", "__version__", "__author__", "__slots__"})
#: Dunder names that decide what a class pattern matches and reads: ``__match_args__`` names
#: the attributes positional sub-patterns read (a name built at run time makes ``case C(x)``
#: a getattr the scan cannot see), and a metaclass ``__instancecheck__`` /
#: ``__subclasscheck__`` / ABC ``__subclasshook__`` makes ``C`` match any subject.
MATCH_DUNDERS = frozenset({
    "__match_args__", "__instancecheck__", "__subclasscheck__", "__subclasshook__",
})  # fmt: skip
#: Dunder names not even a class body may bind (a class's ``__annotations__`` copied onto a
#: function by functools.wraps would be evaluated by singledispatch's register; the class
#: pattern machinery). ``__getattr__``, ``__getattribute__``, ``__class_getitem__`` and
#: ``__set_name__`` stay bindable: they change only how the class's own objects answer, and
#: forwarding a name to another object needs a generic getattr, which is refused.
UNBINDABLE_DUNDERS = frozenset({"__annotations__"}) | MATCH_DUNDERS
#: Builtin types whose class pattern matches the subject itself (``case int(n)``): the only
#: classes a positional sub-pattern may follow, and only under their own, unbound names.
SELF_MATCHING_TYPES = frozenset({
    "bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str",
    "tuple",
})  # fmt: skip
#: Attributes that are namespaces (name → object): a computed key into one reads any name.
NAMESPACE_ATTRIBUTES = frozenset({
    "__dict__", "__globals__", "__builtins__", "f_globals", "f_locals", "f_builtins",
})  # fmt: skip
#: Builtins whose call returns a namespace.
NAMESPACE_CALLS = frozenset({"globals", "locals", "vars"})
#: Dunder attributes a format-string field may read without harm.
FORMAT_HARMLESS_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})

#: operator functions that reach attributes by a name given as a string; their names must be
#: literals the scan can read.
DYNAMIC_ATTRIBUTE_CALLS = frozenset({"attrgetter", "methodcaller"})
#: operator functions that reach items by a key; a literal dunder key is refused.
DYNAMIC_ITEM_CALLS = frozenset({"itemgetter"})

DUNDER = re.compile(r"__\w+__")
#: ``{0.__class__}``, ``{x[__globals__]}``, ``{0.f_back.f_globals}``: fields of str.format.
FORMAT_FIELD = re.compile(r"\{([^{}]*)\}")
FORMAT_PART = re.compile(r"[.\[]([^.\[\]!:]+)")
#: ``# -*- coding: utf-7 -*-`` on line 1 or 2 (PEP 263): honoured when code runs from bytes.
CODING_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.ASCII)
UTF8_NAMES = frozenset({"utf-8", "utf8", "u8", "utf"})  # after lower() and "_" -> "-"

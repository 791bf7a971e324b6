"""The names the Python analyzer judges: modules, callables, attribute names and escapes.

Data only, kept apart from the analyzer so the tables read as one list. A dotted name is judged
after alias resolution, by every suffix (see ``python._describe``).
"""

from __future__ import annotations

#: Builtins that turn data into running code.
DYNAMIC_BUILTINS = {
    "eval": "eval() runs a string as code",
    "exec": "exec() runs a string as code",
    "compile": "compile() turns a string into code",
    "__import__": "__import__() imports a module chosen at run time",
    "breakpoint": "breakpoint() opens an interactive debugger",
}
#: Builtins that only look names up; resolved (through aliases too) so their uses are judged.
REFLECTION_BUILTINS = {"getattr", "setattr"}
#: Modules whose import alone means running programs or poking memory.
DANGEROUS_MODULES = {
    "subprocess": "subprocess runs other programs",
    "_posixsubprocess": "_posixsubprocess runs other programs",
    "ctypes": "ctypes calls C functions and writes raw memory",
    "_ctypes": "ctypes calls C functions and writes raw memory",
    "cffi": "cffi calls C functions and writes raw memory",
    "pty": "pty spawns programs on a terminal",
    "pexpect": "pexpect runs other programs",
    "sh": "sh runs other programs",
    "plumbum": "plumbum runs other programs",
    "runpy": "runpy runs files and modules as code",
    "pdb": "pdb runs strings as code in a debugger",
    "bdb": "bdb runs strings as code in a debugger",
    "doctest": "doctest runs code found in strings",
    "webbrowser": "webbrowser runs other programs",
    "imp": "imp loads modules from arbitrary files",
    "zipimport": "zipimport loads code from arbitrary archives",
    "_pickle": "pickle loading can call any function",
    "cPickle": "pickle loading can call any function",
    "dill": "dill loading can call any function",
    "cloudpickle": "cloudpickle loading can call any function",
    "shelve": "shelve loads pickles, which can call any function",
    "invoke": "invoke runs shell commands",
    "fabric": "fabric runs shell commands",
    "sarge": "sarge runs shell commands",
    "envoy": "envoy runs shell commands",
    "delegator": "delegator runs shell commands",
    "commands": "commands runs shell commands",
    "popen2": "popen2 runs shell commands",
    "pip": "pip installs packages, running their build code",
    "ensurepip": "ensurepip runs pip, which runs package build code",
}
#: Modules whose import is a finding though their members are judged one by one (bare builtin
#: names resolve to ``builtins.*`` too, and ``getattr`` is not dangerous).
IMPORT_FINDINGS = {"builtins": "builtins reaches eval and exec by attribute"}
#: Functions (dotted, after alias resolution) that run programs or code.
DANGEROUS_CALLABLES = {
    "os.system": "os.system() runs a shell command",
    "os.popen": "os.popen() runs a shell command",
    "asyncio.create_subprocess_exec": "asyncio subprocess runs another program",
    "asyncio.create_subprocess_shell": "asyncio subprocess runs a shell command",
    "pickle.loads": "pickle.loads() can call any function while loading",
    "pickle.load": "pickle.load() can call any function while loading",
    "marshal.loads": "marshal.loads() loads raw code objects",
    "marshal.load": "marshal.load() loads raw code objects",
    "types.CodeType": "types.CodeType builds code objects by hand",
    "types.FunctionType": "types.FunctionType builds functions from code objects",
    "sys._getframe": "sys._getframe() reaches other frames' globals",
    "runpy.run_path": "runpy runs a file as code",
    "runpy.run_module": "runpy runs a module as code",
    "code.interact": "code.interact() opens an interpreter",
    "code.InteractiveInterpreter": "code.InteractiveInterpreter runs strings as code",
    "code.InteractiveConsole": "code.InteractiveConsole runs strings as code",
    "distutils.spawn.spawn": "distutils.spawn runs another program",
    "pickle.Unpickler": "pickle.Unpickler can call any function while loading",
    "shelve.open": "shelve loads pickles, which can call any function",
    "pandas.read_pickle": "read_pickle() can call any function while loading",
    "jsonpickle.decode": "jsonpickle.decode() can call any function while loading",
    "yaml.unsafe_load": "yaml.unsafe_load() can build any object",
    "yaml.unsafe_load_all": "yaml.unsafe_load_all() can build any object",
    "timeit.timeit": "timeit runs strings as code",
    "timeit.repeat": "timeit runs strings as code",
    "timeit.Timer": "timeit runs strings as code",
    "timeit.main": "timeit runs strings as code",
    "cProfile.run": "cProfile.run() runs a string as code",
    "cProfile.runctx": "cProfile.runctx() runs a string as code",
    "cProfile.Profile": "cProfile.Profile().run() runs strings as code",
    "profile.run": "profile.run() runs a string as code",
    "profile.runctx": "profile.runctx() runs a string as code",
    "profile.Profile": "profile.Profile().run() runs strings as code",
    "trace.Trace": "trace.Trace().run() runs strings as code",
    "importlib.__import__": "__import__() imports a module chosen at run time",
    "importlib.util.spec_from_file_location": "importlib loads code from an arbitrary file",
    "importlib.util.module_from_spec": "importlib builds a module to run code in",
    "importlib.machinery.SourceFileLoader": "importlib loads code from an arbitrary file",
    "importlib.machinery.SourcelessFileLoader": "importlib loads code from an arbitrary file",
    "importlib.machinery.ExtensionFileLoader": "importlib loads a native library",
    "inspect.currentframe": "inspect.currentframe() reaches other frames' globals",
    "pkgutil.resolve_name": "pkgutil.resolve_name() imports whatever a string names",
    "pydoc.locate": "pydoc.locate() imports whatever a string names",
    "logging.config.listen": "logging.config.listen() accepts configuration that runs code",
    "gc.get_referents": "gc.get_referents() reaches objects past their namespaces",
    "gc.get_referrers": "gc.get_referrers() reaches objects past their namespaces",
    "pydoc.pipepager": "pydoc.pipepager() runs a shell command",
    "pydoc.tempfilepager": "pydoc.tempfilepager() runs a shell command",
    "platform.popen": "platform.popen() runs a shell command",
    "os.fork": "os.fork() starts another process",
    "os.forkpty": "os.forkpty() starts another process on a terminal",
    "os.startfile": "os.startfile() runs another program",
    "multiprocessing.util.spawnv_passfds": "spawnv_passfds() runs another program",
    "multiprocessing.set_executable": "set_executable() makes multiprocessing run a program",
    "gc.get_objects": "gc.get_objects() reaches every object, modules included",
    "numpy.ctypeslib.load_library": "load_library() loads a native library",
    "pydoc.pager": "pydoc.pager() runs the $PAGER shell command",
    "pydoc.getpager": "pydoc.getpager() runs the $PAGER shell command",
    "IPython.get_ipython": "get_ipython() reaches IPython's system() and run_cell()",
    "IPython.core.getipython.get_ipython": "get_ipython() reaches IPython's system() and "
    "run_cell()",
    "builtins.get_ipython": "get_ipython() reaches IPython's system() and run_cell()",
    **{f"builtins.{name}": why for name, why in DYNAMIC_BUILTINS.items()},
}
DANGEROUS_PREFIXES = {
    "os.exec": "os.exec*() replaces the process with another program",
    "os.spawn": "os.spawn*() runs another program",
    "os.posix_spawn": "os.posix_spawn() runs another program",
    "os.fexecve": "os.fexecve() replaces the process with another program",
    "pickle.load": "pickle loading can call any function",
    "pickle._load": "pickle loading can call any function",
    "pickle.Unpickler": "pickle.Unpickler can call any function while loading",
    "pickle._Unpickler": "pickle.Unpickler can call any function while loading",
    "marshal.load": "marshal loads raw code objects",
}
#: ``posix`` is what ``os`` re-exports on Linux; the others are its private spellings.
MODULE_ALIASES = {"posix": "os", "nt": "os", "_os": "os", "_subprocess": "subprocess"}
#: Attribute names that, on an object not known to be harmless, are treated as the dangerous
#: function of that name: ``[os][0].system`` or ``tempfile._os.system`` cannot be told from
#: ``os.system`` without running the code, so the name alone decides (failing safe).
DANGEROUS_LEAVES = {
    "system": "system() runs a shell command",
    "popen": "popen() runs a shell command",
    "Popen": "Popen runs another program",
    "getoutput": "getoutput() runs a shell command",
    "getstatusoutput": "getstatusoutput() runs a shell command",
    "check_output": "check_output() runs another program",
    "check_call": "check_call() runs another program",
    "fork": "fork() starts another process",
    "forkpty": "forkpty() starts another process",
    "fork_exec": "fork_exec() runs another program",
    "exec": "exec() runs a string as code",
    "__import__": "__import__() imports a module chosen at run time",
    "create_subprocess_exec": "create_subprocess_exec() runs another program",
    "create_subprocess_shell": "create_subprocess_shell() runs a shell command",
    "subprocess_exec": "subprocess_exec() runs another program",
    "subprocess_shell": "subprocess_shell() runs a shell command",
    "runctx": "runctx() runs a string as code",
    "runeval": "runeval() runs a string as code",
    "runsource": "runsource() runs a string as code",
    "runcode": "runcode() runs a code object",
    "run_path": "run_path() runs a file as code",
    "run_module": "run_module() runs a module as code",
    "exec_module": "exec_module() runs a module's code",
    "load_module": "load_module() loads and runs a module's code",
    "load_source": "load_source() loads and runs a file's code",
    "load_dynamic": "load_dynamic() loads a native library",
    "spec_from_file_location": "spec_from_file_location() loads code from an arbitrary file",
    "SourceFileLoader": "SourceFileLoader loads code from an arbitrary file",
    "zipimporter": "zipimporter loads code from an archive",
    "CDLL": "CDLL loads a native library",
    "PyDLL": "PyDLL loads a native library",
    "LoadLibrary": "LoadLibrary loads a native library",
    "dlopen": "dlopen() loads a native library",
    "interact": "interact() opens an interpreter",
    "pipepager": "pipepager() runs a shell command",
    "tempfilepager": "tempfilepager() runs a shell command",
    "unsafe_load": "unsafe_load() can build any object",
    "_getframe": "_getframe() reaches other frames' globals",
    "__loader__": "__loader__ loads and runs modules",
    "set_executable": "set_executable() makes multiprocessing run another program",
    "run_setup": "run_setup() runs a package's build script",
    "run_cell": "run_cell() runs a string as code in IPython",
    "run_line_magic": "run_line_magic() runs IPython magics, shell commands included",
    "run_cell_magic": "run_cell_magic() runs IPython magics, shell commands included",
    "system_raw": "system_raw() runs a shell command",
    "get_ipython": "get_ipython() reaches IPython's system() and run_cell()",
    "load_library": "load_library() loads a native library",
}
EXEC_PREFIXES = ("execl", "execv", "fexecve", "spawnl", "spawnv", "posix_spawn", "popen")
#: Module members whose names collide with :data:`DANGEROUS_LEAVES` but do no harm.
HARMLESS_MEMBERS = {"platform.system", "platform.uname", "os.uname"}
#: Attributes used to climb out of a namespace to builtins or to raw code.
ESCAPE_ATTRIBUTES = {
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__mro__",
    "__bases__", "__base__", "__getattribute__", "__reduce__", "__reduce_ex__",
    "f_globals", "f_builtins", "f_locals", "f_back", "gi_frame", "gi_code", "cr_frame",
    "ag_frame", "tb_frame", "func_globals", "__self__", "__objclass__",
}  # fmt: skip
#: Names that, without an import, are bound by the environment the code may run in.
ENVIRONMENT_BUILTINS = {"get_ipython"}
#: Calls that delete the path they are given (first argument or ``path=``).
DELETERS = {"shutil.rmtree", "os.remove", "os.unlink", "os.rmdir", "os.removedirs"}
#: Calls that move their first argument away (from a system directory, a deletion there).
MOVERS = {"shutil.move", "os.rename", "os.replace", "os.renames"}
#: Path methods that delete or write the path the object was built from.
PATH_DELETERS = {"unlink", "rmdir"}
PATH_WRITERS = {"write_text", "write_bytes", "touch", "symlink_to", "hardlink_to"}
#: Constructors of path objects whose first argument is the path.
PATH_CLASSES = {"pathlib.Path", "pathlib.PosixPath", "pathlib.PurePath", "pathlib.PurePosixPath"}
#: Callables whose result, subscripted, is a namespace of names.
NAMESPACE_CALLS = {"globals", "vars", "locals", "dir"}

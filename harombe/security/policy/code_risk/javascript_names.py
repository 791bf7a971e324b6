"""The names the JavaScript scan (:mod:`.javascript`) looks for: modules, members, globals and
paths, as data. Pure tables; no logic."""

from __future__ import annotations

#: Modules whose import means running programs or strings as code.
DANGEROUS_MODULES = {
    "child_process": "child_process runs other programs",
    "vm": "vm runs strings as code",
    "inspector": "inspector evaluates code in the running process",
    "repl": "repl runs what it reads as code",
    "worker_threads": "worker_threads can run strings as code",
    # Packages that wrap those, or load native code.
    "shelljs": "shelljs runs shell commands", "execa": "execa runs other programs",
    "zx": "zx runs shell commands", "cross-spawn": "cross-spawn runs other programs",
    "node-pty": "node-pty runs programs on a terminal",
    "@npmcli/promise-spawn": "promise-spawn runs other programs",
    "child-process-promise": "child-process-promise runs other programs",
    "vm2": "vm2 runs strings as code", "isolated-vm": "isolated-vm runs strings as code",
    "safe-eval": "safe-eval runs strings as code", "node-cmd": "node-cmd runs shell commands",
    "ffi-napi": "ffi-napi calls C functions", "ffi": "ffi calls C functions",
    "koffi": "koffi calls C functions", "node-ffi": "node-ffi calls C functions",
}  # fmt: skip
#: Members of runtime globals that run programs or load native code (Deno, Bun).
RUNTIME_MEMBERS = {"Deno": {"run", "Command", "dlopen", "spawn", "spawnSync"},
                   "Bun": {"$", "spawn", "spawnSync", "dlopen"}}  # fmt: skip
#: Names that lead past the module system to the process's internals.
INTERNALS = {"mainModule", "binding", "_linkedBinding", "dlopen", "_load", "constructor"}
GLOBAL_OBJECTS = {"globalThis", "global", "window", "self", "process", "module"}
REFLECTED = (
    INTERNALS
    | {
        "eval",
        "Function",
        "require",
        "getBuiltinModule",
        "createRequire",
        "execve",
        "runInNewContext",
        "runInThisContext",
    }
    | DANGEROUS_MODULES.keys()
)
#: Strings that name a way to code execution wherever they appear (``const c = 'constructor';
#: [][c][c](…)``): the string is the only trace the scan can see.
TELLTALE_STRINGS = {"constructor", "__proto__", "Function", "getBuiltinModule", "createRequire",
                    "mainModule", "_linkedBinding", "dlopen", "_load"}  # fmt: skip
#: Global objects whose members can be looked up by name once they are handed to a function.
LOOKUP_GLOBALS = {"globalThis", "global", "window", "self", "process"}
#: fs members that delete, and that write, the path given as their first argument.
FS_DELETERS = {"rm", "rmSync", "rmdir", "rmdirSync", "unlink", "unlinkSync"}
FS_WRITERS = {
    "writeFile",
    "writeFileSync",
    "appendFile",
    "appendFileSync",
    "createWriteStream",
    "truncate",
    "truncateSync",
    "copyFile",
    "copyFileSync",
    "symlink",
    "symlinkSync",
}
FS_SCRIPT_WRITERS = {"writeFile", "writeFileSync", "appendFile", "appendFileSync"}
KERNEL_PATHS = ("/dev/", "/proc/", "/sys/")
SAFE_DEVICES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/shm/")
SYSTEM_DIRS = (
    "/etc/",
    "/bin/",
    "/sbin/",
    "/usr/",
    "/lib/",
    "/lib64/",
    "/boot/",
    "/root/",
    "/var/",
    "/opt/",
)
TIMERS = {"setTimeout", "setInterval", "setImmediate"}
#: Functions that load a module by name, like ``require``.
LOADERS = {"require", "getBuiltinModule"}
#: Member names that run programs or strings as code whatever object they are reached on (the
#: object may be child_process or vm obtained some way the scan cannot follow).
DANGEROUS_MEMBERS = {
    "execSync": "execSync() runs a shell command", "execFileSync": "execFileSync() runs a "
    "program", "execFile": "execFile() runs a program", "spawnSync": "spawnSync() runs a "
    "program", "spawn": "spawn() runs a program", "execve": "execve() replaces the process",
    "runInNewContext": "runInNewContext() runs a string as code", "runInThisContext":
    "runInThisContext() runs a string as code", "runInContext": "runInContext() runs a string "
    "as code", "compileFunction": "compileFunction() builds a function from a string",
    "createRequire": "createRequire() makes a require whose loads are not checked",
}  # fmt: skip
#: Names that, assembled from pieces (``'ev' + 'al'``), mean the assembly is hiding them.
ASSEMBLED = REFLECTED | {"child_process", "node:child_process", "getBuiltinModule", "exec",
                         "execSync", "spawn", "process", "global", "globalThis"}  # fmt: skip

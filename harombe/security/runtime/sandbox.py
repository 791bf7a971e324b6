"""Sandbox records, results, and the container spec: pure data, no Docker calls."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import socket
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from harombe.config import Language, Limits, SandboxConfig
from harombe.errors import SandboxNotFoundError
from harombe.security.guest import SUPERVISOR_SOURCE
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.channel import Channel

#: Linux's limit on one argument (MAX_ARG_STRLEN): runc enforces it, gVisor does not.
MAX_ARG_BYTES = 128 * 1024
#: ``python3 -c``'s argument: the supervisor's source, compressed so the argument stays under
#: :data:`MAX_ARG_BYTES` (zlib and binascii are built into Debian's interpreter: no import
#: from disk at start). Level 6: within 1% of level 9's size at a sixth of its time, which every
#: harombe process pays when it imports this module.
_PACKED = base64.b64encode(zlib.compress(SUPERVISOR_SOURCE.encode(), 6)).decode()
SUPERVISOR_BOOT = f"import zlib,binascii;exec(zlib.decompress(binascii.a2b_base64({_PACKED!r})))"

SANDBOX_ID = re.compile(r"^sandbox-[0-9a-f]{12}$")
LABEL_MANAGED = "harombe.managed"
LABEL_SANDBOX = "harombe.sandbox"
LABEL_OWNER = "harombe.owner"
LABEL_MANAGER = "harombe.manager"
LABEL_POOLED = "harombe.pooled"
HOME = "/home/sandbox"
#: Where the install cache's environments appear in every sandbox, read-only.
ENV_MOUNT = "/opt/harombe/envs"
WORKSPACE = "/workspace"
# gVisor keeps tmpfs files in sandbox memory, so the container's cgroup limit must cover the
# workspace, home and /tmp on top of user memory; user memory itself is enforced by the
# supervisor, which sums the resident size of user processes.
TMP_MB = 256
#: ``/mnt``: an empty tmpfs where a run with a host directory gets its copy (``harombe.mounts``).
MNT = "/mnt"
MNT_MB = 256
OVERHEAD_MB = 192
# Docker's pids limit also counts gVisor's own host threads and (on the ptrace platform) one
# host process per guest address space; when it is reached the sentry itself dies. So the
# host-side limit is roomy, and ``max_pids`` is enforced on user code as RLIMIT_NPROC inside.
HOST_PIDS_PER_GUEST_PID = 24
HOST_PIDS_BASE = 1024
#: Languages whose runs keep state between calls unless asked for a fresh process.
SESSION_LANGUAGES = ("python", "javascript")

RUN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": HOME,
    "USER": "sandbox",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONUNBUFFERED": "1",  # partial output survives a timeout kill
    "NODE_PATH": f"{HOME}/node_modules",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    # One thread for numpy's BLAS: a sandbox has a fraction of a core, and a session
    # interpreter left with threads after a call is restarted (its state would be lost).
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def new_sandbox_id() -> str:
    return f"sandbox-{secrets.token_hex(6)}"


def check_sandbox_id(sandbox_id: object) -> str:
    """``sandbox_id`` if it is well formed; otherwise :class:`SandboxNotFoundError`."""
    if not isinstance(sandbox_id, str) or not SANDBOX_ID.fullmatch(sandbox_id):
        raise SandboxNotFoundError(
            f"Sandbox not found: {str(sandbox_id)[:80]!r} is not a harombe sandbox id "
            "(they look like 'sandbox-0123456789ab'); create one with code_execute"
        )
    return sandbox_id


def not_found(sandbox_id: str, replaced: dict[str, str], lost: dict[str, str]) -> str:
    """Why ``sandbox_id`` is not a live sandbox: replaced (by which), lost, or unknown."""
    if sandbox_id in replaced:
        why = f"was lost and replaced by {replaced[sandbox_id]}; use that id"
    elif sandbox_id in lost:  # a file call found it dead: no replacement
        why = f"was lost ({lost[sandbox_id]}); create a new one with code_execute"
    else:
        why = "does not exist or was destroyed; create a new one with code_execute"
    return f"Sandbox not found: {sandbox_id} {why}"


def process_owner() -> str:
    """``host:pid:starttime`` — unique for this process even after its pid is reused."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def owner_is_gone(owner: str, *, hostname: str) -> bool:
    """True when the process that labelled a container as ``owner`` no longer runs here."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != hostname or not pid_text.isdigit():
        return False  # another machine's container, or a label we did not write
    return _start_time(int(pid_text)) != started


def argv_for(language: Language, code: str) -> tuple[list[str], bytes]:
    """The command that runs ``code`` and the bytes to feed it on stdin."""
    if language == "python":
        return ["python3", "-"], code.encode()
    if language == "javascript":
        return ["node", "-"], code.encode()
    return ["bash", "-c", code, "bash"], b""


def container_spec(
    sandbox_id: str,
    *,
    image: str,
    config: SandboxConfig,
    owner: str,
    manager_id: str,
    language: Language,
    pooled: bool = False,
    cpu_at_create: bool = True,
    network: str | None = None,
    extra_env: dict[str, str] | None = None,
    environments_dir: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``docker containers.create``: every isolation default in one place.
    ``environments_dir``: the install cache's ``envs``, seen read-only at ``ENV_MOUNT``."""
    limits = config.limits
    uid, _, gid = config.user.partition(":")
    owned = f"uid={uid},gid={gid or uid}"
    backstop_mb = limits.max_memory_mb + 2 * limits.max_disk_mb + TMP_MB + MNT_MB + OVERHEAD_MB
    return {
        "image": image,
        "command": ["python3", "-I", "-S", "-c", SUPERVISOR_BOOT],
        "name": f"harombe-{sandbox_id}",
        "hostname": "sandbox",
        # The supervisor is root with three capabilities so that user code, which it runs as
        # ``config.user`` with none, cannot signal, trace or impersonate it.
        "user": "0:0",
        "working_dir": WORKSPACE,
        "environment": {
            "LANG": "C.UTF-8",
            "HAROMBE_RUN_AS": config.user,
            "HAROMBE_RUNTIME": config.runtime,
            # The Python session interpreter starts with the supervisor (no worker source
            # needed); it gets exactly the environment every run gets.
            **(
                {
                    "HAROMBE_PREWARM": "python",
                    "HAROMBE_USER_ENV": json.dumps({**RUN_ENV, **(extra_env or {})}),
                    "HAROMBE_MAX_PIDS": str(limits.max_pids),
                }
                if config.stateful and language == "python"
                else {}
            ),
        },
        "labels": {
            LABEL_MANAGED: "1",
            LABEL_SANDBOX: sandbox_id,
            LABEL_OWNER: owner,
            LABEL_MANAGER: manager_id,
            "harombe.language": language,
            **({LABEL_POOLED: "1"} if pooled else {}),
        },
        # A network-enabled sandbox: its own --internal network and the runtime that uses it.
        "runtime": config.network.runtime if network else config.runtime,
        "network_mode": network or "none",
        # No resolver of the host's inside: Docker would copy the host's nameservers and search
        # domains in. Offline sandboxes have nothing to ask; network-enabled ones reach names
        # only through the egress proxy, which resolves them (Docker's embedded resolver on
        # their network forwards to this 127.0.0.1, where nothing listens). Lookups fail at once.
        "dns": ["127.0.0.1"],
        "dns_search": ["."],
        "dns_opt": ["attempts:1", "timeout:1"],
        "read_only": True,
        **(
            {"volumes": {environments_dir: {"bind": ENV_MOUNT, "mode": "ro"}}}
            if environments_dir
            else {}
        ),
        "tmpfs": {
            WORKSPACE: f"size={limits.max_disk_mb}m,mode=0755,{owned}",
            HOME: f"size={limits.max_disk_mb}m,mode=0755,{owned}",
            "/tmp": f"size={TMP_MB}m,mode=1777",
            MNT: f"size={MNT_MB}m,mode=0755,{owned}",
        },
        "mem_limit": f"{backstop_mb}m",
        "memswap_limit": f"{backstop_mb}m",
        # Normally set on the cgroup once the sandbox is ready (harombe.security.runtime.cgroups);
        # Docker's create-time quota is the fallback.
        **({"nano_cpus": int(limits.max_cpu_cores * 1e9)} if cpu_at_create else {}),
        "pids_limit": limits.max_pids * HOST_PIDS_PER_GUEST_PID + HOST_PIDS_BASE,
        "cap_drop": ["ALL"],
        "cap_add": ["SETUID", "SETGID", "KILL"],
        "security_opt": ["no-new-privileges:true"],
        "ipc_mode": "private",
        "stdin_open": True,
        "tty": False,
        "detach": True,
        # The protocol runs over stdout; a logging driver would copy every frame to disk.
        "log_config": {"type": "none", "config": {}},
    }


@dataclass
class Sandbox:
    """One live sandbox: its container, its channel, and the lock that serialises its calls."""

    sandbox_id: str
    container_id: str
    language: Language
    image: str
    runtime: str
    channel: Channel
    info: dict[str, Any]
    network_enabled: bool = False
    allowed_domains: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to every run's environment
    js_worker_sent: bool = False  # the supervisor has the JavaScript worker's source
    profile: Profile | None = None  # fixed at creation: every call runs under its layer
    limits: Limits | None = None  # its own limits, when a profile narrowed the configured ones
    environment: str | None = None  # the key of the dependency environment it started with
    linked: set[str] = field(default_factory=set)  # keys of the environments on its path
    created_at: float = field(default_factory=time.time)
    runs: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def has(self, interpreter: str) -> bool:
        return bool((self.info.get("interpreters") or {}).get(interpreter))


@dataclass
class ExecutionResult:
    """The outcome of one ``execute`` call. User-code failure is data here, never raised."""

    success: bool
    sandbox_id: str
    stdout: str
    stderr: str
    exit_code: int
    execution_time: float
    error: str | None
    status: str  # ok | error | timeout | oom | cancelled | lost
    language: str
    runtime: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0
    timeout_s: float = 0.0
    replaced_sandbox_id: str | None = None
    warnings: list[str] = field(default_factory=list)
    result: str | None = None  # repr of the final bare expression (stateful runs)
    state_lost: bool = False  # the session interpreter had to be killed; next call starts afresh
    stateful: bool = False
    # Output mode llm: where the full text of each cut stream is saved, relative to /workspace.
    output_files: dict[str, str] = field(default_factory=dict)
    # What the call left behind (see runtime/artifacts.py): files it created or changed under
    # /workspace, whether that list is incomplete, and images its Python code displayed.
    changed_files: list[dict[str, Any]] = field(default_factory=list)
    changed_files_truncated: bool = False
    artifacts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

"""The isolation self-check of ``harombe doctor``: the probe programs it runs inside a real
sandbox, and the pure reading of what they reported into pass/fail verdicts.

Each probe is a Python program run as user code (the sandbox's unprivileged user). A check
passes only on positive evidence of isolation (an errno that says "refused for this reason",
a zero capability mask), never on the mere absence of an answer: a probe that did not report
fails every check that reads it.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from harombe.config import Limits

#: A documentation address (RFC 5737): nothing answers there even with a network; "no route"
#: is what proves there is none.
UNROUTABLE = ("192.0.2.1", 9)
#: A file on the root filesystem that user code could write if the root were writable.
ROOT_PROBE = "/var/tmp/harombe-doctor-probe"
#: The environment variable the doctor sets in its own process; user code must not see it.
CANARY_ENV = "HAROMBE_DOCTOR_CANARY"
#: Seconds the timeout probe sleeps, and the timeout it runs under.
SLEEP_S, PROBE_TIMEOUT_S = 60, 2.0

FACTS = (
    r"""
import ctypes, errno, json, os, socket, subprocess
out = {}
def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno, "error": str(exc)}
def dmesg():
    return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
def connect():
    with socket.socket() as s:
        s.settimeout(3)
        s.connect((HOST, PORT))
def write_root():  # /var/tmp is world-writable: only a read-only root refuses it
    with open(ROOT_PROBE, "w") as f:
        f.write("x")
def no_new_privs():
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
def workspace():
    with open("/workspace/.harombe-doctor", "w") as f:
        f.write("probe")
    with open("/workspace/.harombe-doctor") as f:
        data = f.read()
    os.unlink("/workspace/.harombe-doctor")
    st = os.statvfs("/workspace")
    return {"read_back": data, "size_bytes": st.f_blocks * st.f_frsize}
out["dmesg"] = attempt(dmesg)
out["proc_version"] = attempt(lambda: open("/proc/version").read())
out["interfaces"] = attempt(lambda: sorted(os.listdir("/sys/class/net")))
out["connect"] = attempt(connect)
out["write_root"] = attempt(write_root)
out["mounts"] = attempt(lambda: open("/proc/self/mounts").read())
out["status"] = attempt(lambda: open("/proc/self/status").read())
out["no_new_privs"] = attempt(no_new_privs)
out["ids"] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())]
out["environ"] = dict(os.environ)
out["workspace"] = attempt(workspace)
print(json.dumps(out))
""".replace("HOST", repr(UNROUTABLE[0]))
    .replace("PORT", str(UNROUTABLE[1]))
    .replace("ROOT_PROBE", repr(ROOT_PROBE))
)

KILL = r"""
import json, os
try:
    os.kill(1, 9)
    print(json.dumps({"killed": True}))
except OSError as exc:
    print(json.dumps({"killed": False, "errno": exc.errno, "error": str(exc)}))
"""

PIDS = r"""
import json, threading
stop, started, error = threading.Event(), 0, None
for _ in range(%(attempts)d):
    try:
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
    except Exception as exc:
        error = repr(exc)
        break
stop.set()
print(json.dumps({"started": started, "error": error}))
"""

MEMORY = r"""
chunks = []
for _ in range(%(chunks)d):
    chunks.append(b"x" * (16 << 20))
print("allocated", len(chunks) * 16, "MiB and was not stopped")
"""

TIMEOUT = f"import time\ntime.sleep({SLEEP_S})\nprint('slept {SLEEP_S} s and was not stopped')\n"


def probes(limits: Limits) -> dict[str, tuple[str, float]]:
    """Probe name → (Python program, timeout in seconds), in the order they run."""
    memory_chunks = (limits.max_memory_mb * 2 + 256) // 16
    return {
        "facts": (FACTS, 60.0),
        "kill": (KILL, 30.0),
        "pids": (PIDS % {"attempts": limits.max_pids * 2 + 64}, 60.0),
        "timeout": (TIMEOUT, PROBE_TIMEOUT_S),
        "memory": (MEMORY % {"chunks": memory_chunks}, 120.0),
    }


@dataclass(frozen=True)
class Verdict:
    """One row of the doctor's table."""

    group: str  # "setup" or "isolation"
    name: str
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Evidence:
    """The probes' results, read defensively (they come from inside the sandbox)."""

    def __init__(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        self.results = results

    def report(self, probe: str) -> dict[str, Any]:
        """The JSON object probe ``probe`` printed; ``ValueError`` saying why there is none."""
        result = self.results.get(probe)
        if result is None:
            raise ValueError(f"the {probe} probe did not run")
        try:
            found = json.loads(str(result.get("stdout") or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            found = None
        if not isinstance(found, dict):
            raise ValueError(f"the {probe} probe reported nothing readable (status "
                             f"{result.get('status')}: {result.get('error')})")  # fmt: skip
        return found

    def fact(self, key: str) -> Any:
        """``facts[key]``, an ``attempt`` record or a plain value."""
        facts = self.report("facts")
        if key not in facts:
            raise ValueError(f"the facts probe did not report {key}")
        return facts[key]


def _refused(record: Any, expected: int) -> tuple[bool, str]:
    """Whether an attempt failed with errno ``expected`` (and what happened)."""
    if not isinstance(record, dict):
        return False, "no record of the attempt"
    if record.get("ok"):
        return False, "it succeeded"
    got = record.get("errno")
    name = errno.errorcode.get(got, str(got)) if isinstance(got, int) else str(got)
    return got == expected, f"refused with {name}: {record.get('error')}"


def kernel(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    record = ev.fact("dmesg")
    text = str(record.get("value") or "") if isinstance(record, dict) else ""
    first = text.strip().splitlines()[0] if text.strip() else "(dmesg said nothing)"
    return "gvisor" in text.lower(), f"dmesg: {first[:70]}"


def network(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    interfaces = ev.fact("interfaces")
    names = interfaces.get("value") if isinstance(interfaces, dict) else None
    record = ev.fact("connect")
    no_route = [_refused(record, code) for code in (errno.ENETUNREACH, errno.EHOSTUNREACH)]
    refused = any(ok for ok, _ in no_route)
    return names == ["lo"] and refused, f"interfaces {names}; connect {no_route[0][1]}"


def _mounts(ev: Evidence) -> dict[str, list[str]]:
    """Mount point → its options (the last mount on a point wins)."""
    record = ev.fact("mounts")
    lines = str(record.get("value") or "").splitlines() if isinstance(record, dict) else []
    fields = [line.split() for line in lines]
    return {f[1]: f[3].split(",") for f in fields if len(f) > 3}


def read_only_root(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    refused, how = _refused(ev.fact("write_root"), errno.EROFS)
    mounts = _mounts(ev)
    ro = "ro" in mounts.get("/", [])
    # The probe file must be on the root filesystem itself, not on a mount of its own.
    own_mount = any(ROOT_PROBE.startswith(point.rstrip("/") + "/") for point in mounts
                    if point != "/")  # fmt: skip
    shown = "ro" if ro else "rw or unknown"
    return refused and ro and not own_mount, f"/ mounted {shown}; {ROOT_PROBE}: {how}"


def non_root(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    ids = ev.fact("ids")
    if not (isinstance(ids, list) and len(ids) == 5 and isinstance(ids[4], list)):
        return False, f"unreadable ids {ids!r}"
    uids = [*ids[:4], *ids[4]]
    ok = all(isinstance(i, int) and i > 0 for i in uids)
    return ok, f"uid {ids[0]} euid {ids[1]} gid {ids[2]} egid {ids[3]} groups {ids[4]}"


def _status_fields(ev: Evidence) -> dict[str, str]:
    record = ev.fact("status")
    text = str(record.get("value") or "") if isinstance(record, dict) else ""
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in
                                                  text.splitlines())}  # fmt: skip


def no_capabilities(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    fields = _status_fields(ev)
    required = {name: fields.get(name) for name in ("CapEff", "CapPrm", "CapInh")}
    optional = {"CapAmb": fields["CapAmb"]} if "CapAmb" in fields else {}  # gVisor omits it

    def zero(mask: str | None) -> bool:
        return mask is not None and mask.isalnum() and int(mask, 16) == 0

    masks = {**required, **optional}
    return all(zero(m) for m in masks.values()), " ".join(f"{k} {v}" for k, v in masks.items())


def no_new_privs(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    record = ev.fact("no_new_privs")
    value = record.get("value") if isinstance(record, dict) and record.get("ok") else None
    status_field = _status_fields(ev).get("NoNewPrivs")  # Linux shows it; gVisor does not
    ok = value == 1 and status_field in (None, "1")
    return ok, f"prctl(PR_GET_NO_NEW_PRIVS) = {value}"


def no_host_env(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    env = ev.fact("environ")
    if not isinstance(env, dict):
        return False, "environment not reported"
    name, value = canary
    seen = name in env or any(value in str(v) for v in env.values())
    return not seen, f"canary {name} {'VISIBLE' if seen else 'not visible'}; {len(env)} variables"


def workspace(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    record = ev.fact("workspace")
    if not isinstance(record, dict) or not record.get("ok"):
        return False, f"write failed: {record.get('error') if isinstance(record, dict) else '?'}"
    value = record.get("value") or {}
    size = value.get("size_bytes") if isinstance(value, dict) else None
    cap = limits.max_disk_mb * 1_048_576
    sized = isinstance(size, int) and 0 < size <= cap
    ok = sized and value.get("read_back") == "probe"
    shown = f"{size / 1_048_576:.0f} MiB" if isinstance(size, int) else "unknown"
    return ok, f"writable; size {shown} (max_disk_mb {limits.max_disk_mb})"


def memory_limit(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    result = ev.results.get("memory") or {}
    status = result.get("status")
    return status == "oom", f"allocating past {limits.max_memory_mb} MiB ended with {status}"


def pids_limit(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    report = ev.report("pids")
    started, error = report.get("started"), report.get("error")
    ok = isinstance(started, int) and error is not None and started <= limits.max_pids
    refusal = error or "no refusal"
    return ok, f"{started} threads started, then {refusal} (max_pids {limits.max_pids})"


def timeout_binds(ev: Evidence, limits: Limits, canary: tuple[str, str]) -> tuple[bool, str]:
    status = (ev.results.get("timeout") or {}).get("status")
    slept = f"a {SLEEP_S} s sleep under a {PROBE_TIMEOUT_S:g} s timeout"
    return status == "timeout", f"{slept}: {status}"


def supervisor_unkillable(
    ev: Evidence, limits: Limits, canary: tuple[str, str]
) -> tuple[bool, str]:
    status = (ev.results.get("kill") or {}).get("status")
    report = ev.report("kill")
    refused = report.get("killed") is False and report.get("errno") == errno.EPERM
    return refused and status == "ok", f"kill -9 1: {report.get('error') or 'delivered'}"


Check = Callable[[Evidence, Limits, tuple[str, str]], tuple[bool, str]]
#: The isolation checks: name shown → how it is read from the probes.
CHECKS: dict[str, Check] = {
    "kernel is gVisor": kernel,
    "no network": network,
    "read-only root": read_only_root,
    "non-root user": non_root,
    "no capabilities": no_capabilities,
    "no_new_privs set": no_new_privs,
    "no host environment": no_host_env,
    "/workspace writable, size-limited": workspace,
    "memory limit binds": memory_limit,
    "pids limit binds": pids_limit,
    "timeout binds": timeout_binds,
    "supervisor cannot be killed": supervisor_unkillable,
}


def evaluate(
    results: Mapping[str, Mapping[str, Any]], *, limits: Limits, canary: tuple[str, str]
) -> list[Verdict]:
    """A verdict for every isolation check from the probes' ``results`` (probe name → the
    run's result dict). A check whose evidence is missing or unreadable fails."""
    evidence = Evidence(results)
    verdicts = []
    for name, check in CHECKS.items():
        try:
            passed, detail = check(evidence, limits, canary)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            passed, detail = False, f"no evidence: {exc}"
        verdicts.append(Verdict("isolation", name, bool(passed), detail))
    return verdicts

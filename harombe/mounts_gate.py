"""The HITL gate's decision on a :func:`~harombe.mounts.run_sandboxed` call, taken before any
sandbox is made, on the program's own text."""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Sequence

from harombe.config import HarombeConfig
from harombe.mounts_host import Snapshot
from harombe.security.approval.gate import FROM_CONFIG, HITLGate, Operation, gate_from_config
from harombe.security.approval.policy_line import announce
from harombe.security.runtime.sandbox import MNT


async def decide_run(
    gate: HITLGate | None,
    config: HarombeConfig,
    code: str | None,
    script_path: str | None,
    snap: Snapshot | None,
    *,
    lang: str,
    timeout_s: float | None,
    network: bool,
    allowed_domains: Sequence[str],
) -> None:
    """The gate's decision on the run, before any sandbox is made (``FROM_CONFIG``: the gate
    of ``config``); :class:`~harombe.errors.ApprovalDeniedError` when it is not approved. The
    gate judges the program's own text: ``code``, or the script as it will be copied in."""
    if gate is FROM_CONFIG:
        gate = gate_from_config(config)
        announce(gate, "run_sandboxed")
    if gate is None:
        return
    default_s = float(config.security.sandbox.limits.max_execution_time)
    params = {
        "language": lang,
        "code": code if code is not None else script_text(snap, script_path),
        "sandbox_id": None,
        "timeout": default_s if timeout_s is None else timeout_s,
        "timeout_default_s": default_s,
        "network_enabled": network,
        "allowed_domains": list(allowed_domains),
        "fresh": True,
        "mnt_dir": snap.root if snap is not None else None,
    }
    decision = await gate.check_approval(Operation("code_execute", params))
    if not decision.approved:
        raise decision.error()


def script_text(snap: Snapshot | None, script_path: str | None) -> str:
    """The script at ``script_path`` as the sandbox gets it: from the snapshot's archives."""
    rel = posixpath.normpath(script_path or "")[len(MNT) + 1 :]
    for archive in snap.archives if snap is not None else ():
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            try:
                member = tar.extractfile(rel)
            except KeyError:
                continue
            if member is not None:
                return member.read().decode("utf-8", "replace")
    return f"# {script_path} (its text could not be read)\n"

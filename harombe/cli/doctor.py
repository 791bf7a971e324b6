"""``harombe doctor``: check Docker, the runtime and the images, then run the isolation
self-check (:mod:`harombe.cli.doctor_probes`) inside a real sandbox; print a pass/fail table
and exit 0 only when every check passes."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import click

from harombe.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    Status,
    build_config,
    run_async,
    say_error,
    start_command,
)
from harombe.cli.doctor_probes import CANARY_ENV, Verdict, evaluate, probes
from harombe.config import LANGUAGES, HarombeConfig
from harombe.errors import HarombeError

HELP = """Check that harombe can run code here and that its sandboxes isolate it.

Setup: Docker answers, the configured runtime (runsc) is registered, each language's image
is present. Isolation, checked from inside a real sandbox: the kernel is gVisor's, there is
no network, the root filesystem is read-only, code runs as a non-root user with no
capabilities and no_new_privs, the doctor's own environment is not visible, /workspace is
writable and size-limited, the memory, pids and timeout limits bind, and the supervisor
cannot be killed. Exits 0 only when every check passes (1 otherwise, 2 for bad usage).
"""


async def setup_checks(docker: Any, config: HarombeConfig) -> list[Verdict]:
    """Docker, the runtime and the images, as verdicts; stops at the first that fails."""
    sandbox = config.security.sandbox
    found: list[Verdict] = []
    try:
        await docker.start()
        runtimes = await docker.runtimes()
    except HarombeError as exc:
        return [Verdict("setup", "Docker answers", False, str(exc))]
    shown = ", ".join(sorted(runtimes))
    found.append(Verdict("setup", "Docker answers", True, f"runtimes: {shown}"))
    registered = sandbox.runtime in runtimes
    found.append(Verdict("setup", f"runtime {sandbox.runtime} registered", registered,
                         "ok" if registered else "missing: run scripts/setup.sh"))  # fmt: skip
    if not registered:
        return found
    for image in sorted({sandbox.image_for(language) for language in LANGUAGES}):
        try:
            detail = (await docker.image_id(image))[:19]
            present = True
        except HarombeError as exc:
            detail, present = str(exc), False
        found.append(Verdict("setup", f"image {image} present", present, detail))
    return found


async def isolation_checks(config: HarombeConfig, status: Status) -> list[Verdict]:
    """Start a sandbox, run every probe in it, and read the verdicts."""
    from harombe.cli.common import started_manager

    canary = (CANARY_ENV, secrets.token_hex(16))
    os.environ[canary[0]] = canary[1]  # in this process, which starts the container
    limits = config.security.sandbox.limits
    results: dict[str, dict[str, Any]] = {}
    try:
        status.update("starting a sandbox")
        async with started_manager(config) as manager:
            box = await manager.create_sandbox("python")
            for name, (program, timeout_s) in probes(limits).items():
                status.update(f"isolation probe: {name}")
                result = await manager.execute(box.sandbox_id, program, language="python",
                                               timeout_s=timeout_s, fresh=True)  # fmt: skip
                results[name] = result.to_dict()
                if result.status == "lost":  # its replacement serves the next probes
                    box = manager.get(result.sandbox_id)
    except HarombeError as exc:
        return [Verdict("isolation", "a sandbox runs the probes", False, str(exc))]
    finally:
        os.environ.pop(canary[0], None)
    return evaluate(results, limits=limits, canary=canary)


async def diagnose(config: HarombeConfig) -> list[Verdict]:
    """Every verdict: setup first; isolation when setup passed (else one failing row)."""
    from harombe.security.runtime.docker import DockerManager

    with Status() as status:
        status.update("checking Docker, the runtime and the images")
        docker = DockerManager()
        try:
            verdicts = await setup_checks(docker, config)
        finally:
            await docker.stop()
        if all(v.passed for v in verdicts):
            return verdicts + await isolation_checks(config, status)
    skipped = "not run: fix the setup checks above first"
    return [*verdicts, Verdict("isolation", "isolation self-check", False, skipped)]


def table(verdicts: list[Verdict]) -> str:
    """The verdicts as a table: PASS/FAIL, group, check, what was seen."""
    width = max(len(v.name) for v in verdicts)
    lines = [f"{'':4}  {'GROUP':9}  {'CHECK':{width}}  DETAIL"]
    for v in verdicts:
        mark = "PASS" if v.passed else "FAIL"
        lines.append(f"{mark:4}  {v.group:9}  {v.name:{width}}  {v.detail}")
    failed = sum(not v.passed for v in verdicts)
    lines.append(f"\n{len(verdicts) - failed} passed, {failed} failed")
    return "\n".join(lines)


@click.command(help=HELP)
@click.option("--json", "as_json", is_flag=True, help="print the verdicts as JSON")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="config file (default $HAROMBE_CONFIG)",
)
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, config_path: str | None) -> int:
    start_command(ctx)
    try:
        config = build_config(config_path)
    except HarombeError as exc:
        return say_error("harombe doctor", exc, EXIT_USAGE)

    async def main() -> int:
        verdicts = await diagnose(config)
        passed = all(v.passed for v in verdicts)
        if as_json:
            checks = [v.to_dict() for v in verdicts]
            click.echo(json.dumps({"passed": passed, "checks": checks}, indent=2))
        else:
            click.echo(table(verdicts))
        return 0 if passed else EXIT_ERROR

    return run_async(main)

"""``harombe ls`` and ``harombe rm``: the sandboxes on this Docker daemon, found by the labels
every harombe container carries (whichever process made them)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import click

from harombe.cli.common import EXIT_ERROR, EXIT_USAGE, run_async, say_error, start_command
from harombe.errors import HarombeError
from harombe.security.runtime.backend import ContainerInfo, DockerBackend
from harombe.security.runtime.sandbox import (
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_POOLED,
    LABEL_SANDBOX,
    SANDBOX_ID,
    owner_is_gone,
)

#: The columns of ``harombe ls``: heading and the row key shown under it.
COLUMNS = (("SANDBOX", "sandbox_id"), ("LANGUAGE", "language"), ("IMAGE", "image"),
           ("OWNER PID", "owner_pid"), ("OWNER", "owner"), ("AGE", "age"),
           ("STATE", "state"))  # fmt: skip


def describe(container: ContainerInfo, *, now_s: float, hostname: str) -> dict[str, Any]:
    """One row of ``harombe ls`` for a harombe container: its sandbox id, language, image,
    owning process (pid, and whether it still runs: ``None`` when it is another machine's),
    age in seconds and Docker state."""
    labels = container.labels
    owner = labels.get(LABEL_OWNER, "")
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    alive = None if host != hostname or not pid.isdigit() else not owner_is_gone(
        owner, hostname=hostname)  # fmt: skip
    return {
        "sandbox_id": labels.get(LABEL_SANDBOX, ""),
        "container_id": container.id[:12],
        "language": labels.get("harombe.language", "?"),
        "image": container.image or "?",
        "owner_host": host or None,
        "owner_pid": int(pid) if pid.isdigit() else None,
        "owner_alive": alive,
        "age_s": round(max(0.0, now_s - container.created_s), 1) if container.created_s else None,
        "state": container.status,
        "pooled": labels.get(LABEL_POOLED) == "1",
    }


def age_text(age_s: float | None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d`` (``?`` when unknown)."""
    if age_s is None:
        return "?"
    for unit, size_s in (("d", 86400), ("h", 3600), ("m", 60)):
        if age_s >= size_s:
            return f"{int(age_s // size_s)}{unit}"
    return f"{int(age_s)}s"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as aligned text columns (a heading line first)."""
    owner = {True: "alive", False: "gone", None: "elsewhere"}
    shown = [
        {**row, "age": age_text(row["age_s"]), "owner": owner[row["owner_alive"]],
         "owner_pid": row["owner_pid"] or "?",
         "state": row["state"] + (" (pooled)" if row["pooled"] else "")}
        for row in rows
    ]  # fmt: skip
    cells = [[head for head, _ in COLUMNS]] + [[str(r[key]) for _, key in COLUMNS] for r in shown]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)  # fmt: skip


async def list_sandboxes(docker: DockerBackend) -> list[dict[str, Any]]:
    """Every harombe sandbox container on the daemon, oldest first."""
    found = await docker.list_containers({LABEL_MANAGED: "1"})
    hostname, now_s = socket.gethostname(), time.time()
    rows = [describe(c, now_s=now_s, hostname=hostname) for c in found]
    return sorted(rows, key=lambda r: (-(r["age_s"] or 0), r["sandbox_id"]))


async def remove_sandboxes(docker: DockerBackend, sandbox_ids: Sequence[str]) -> list[str]:
    """Remove the containers of ``sandbox_ids`` and then their networks (with the firewall
    rules, through the manager's own sweep); the ids of those that did not exist."""
    from harombe.security.runtime.network import LABEL_NETWORK, SandboxNetworks

    wanted = set(sandbox_ids)
    found = [c for c in await docker.list_containers({LABEL_MANAGED: "1"})
             if c.labels.get(LABEL_SANDBOX) in wanted]  # fmt: skip
    for container in found:
        await docker.remove_container(container.id)
    networks = SandboxNetworks(docker, labels={})
    await networks.sweep(lambda labels: labels.get(LABEL_NETWORK) in wanted)
    present = {c.labels.get(LABEL_SANDBOX) for c in found}
    return [sid for sid in sandbox_ids if sid not in present]


def with_docker(name: str, work: Callable[[DockerBackend], Awaitable[int]]) -> int:
    """Run ``work`` with a started Docker client; a harombe error is printed, exit 1."""
    from harombe.security.runtime.docker import DockerManager

    async def main() -> int:
        docker = DockerManager()
        try:
            await docker.start()
            return await work(docker)
        except HarombeError as exc:
            return say_error(name, exc)
        finally:
            await docker.stop()

    return run_async(main)


@click.command(help="List the sandboxes on this Docker daemon: id, language, image, the "
               "process that made them (and whether it still runs), age and state.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> int:
    start_command(ctx)

    async def work(docker: DockerBackend) -> int:
        rows = await list_sandboxes(docker)
        if as_json:
            click.echo(json.dumps(rows, indent=2))
        elif rows:
            click.echo(table(rows))
        else:
            click.echo("no sandboxes", err=True)
        return 0

    return with_docker("harombe ls", work)


def sweep(rows: Sequence[dict[str, Any]], *, force: bool) -> tuple[list[str], list[str]]:
    """What ``rm --all`` removes and what it keeps: ids of sandboxes whose owner process is
    gone, and of those whose owner still runs or is unknown (another machine's, unlabelled),
    which only ``force`` removes too. Rows without a well-formed sandbox id are skipped."""
    ids = [r["sandbox_id"] for r in rows if SANDBOX_ID.fullmatch(r["sandbox_id"])]
    live = [r["sandbox_id"] for r in rows if r["owner_alive"] is not False]
    kept = [] if force else [sid for sid in live if sid in ids]
    return sorted(set(ids) - set(kept)), sorted(set(kept))


@click.command(help="Remove sandboxes by id (sandbox-0123456789ab), or with --all every one "
               "whose owner process is gone (--all --force: every one), with their networks. "
               "The process that made one sees it as lost.")  # fmt: skip
@click.argument("sandbox_ids", nargs=-1, metavar="ID...")
@click.option("--all", "remove_all", is_flag=True,
              help="remove every harombe sandbox whose owner process is gone")  # fmt: skip
@click.option("--force", is_flag=True, help="with --all: also those of running processes "
              "(a harombe serve's, another shell's) and of unknown owners")  # fmt: skip
@click.pass_context
def rm(ctx: click.Context, sandbox_ids: tuple[str, ...], remove_all: bool, force: bool) -> int:
    start_command(ctx)
    name = "harombe rm"
    if remove_all == bool(sandbox_ids):
        return say_error(name, "name sandbox ids or --all (not both)", EXIT_USAGE)
    for sandbox_id in sandbox_ids:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            return say_error(name, f"{sandbox_id[:80]!r} is not a sandbox id (they look like "
                             "'sandbox-0123456789ab'; see harombe ls)", EXIT_USAGE)  # fmt: skip

    if force and not remove_all:
        return say_error(name, "--force goes with --all (named sandboxes are removed as "
                         "they are)", EXIT_USAGE)  # fmt: skip

    async def work(docker: DockerBackend) -> int:
        ids, kept = list(sandbox_ids), list[str]()
        if remove_all:
            ids, kept = sweep(await list_sandboxes(docker), force=force)
        for sandbox_id in kept:
            say_error(name, f"kept {sandbox_id}: its owner process still runs or is unknown "
                      "(harombe ls shows it); rm --all --force removes it too", 0)  # fmt: skip
        unknown = await remove_sandboxes(docker, ids)
        for sandbox_id in ids:
            if sandbox_id not in unknown:
                click.echo(f"removed {sandbox_id}")
        for sandbox_id in unknown:
            say_error(name, f"no sandbox {sandbox_id} on this Docker daemon (see harombe ls)")
        return EXIT_ERROR if unknown else 0

    return with_docker(name, work)

"""``harombe run --mnt DIR``: the program runs with DIR copied in at ``/mnt`` and what it
changed there is applied to DIR (see :mod:`harombe.mounts`); harombe then says what changed."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harombe.cli.common import EXIT_ERROR, started_manager
from harombe.cli.screen import printable
from harombe.config import HarombeConfig
from harombe.errors import UsageError


def check_mnt(*, packages: Sequence[str], profile: str | None) -> None:
    """:class:`UsageError` for what ``--mnt`` does not combine with."""
    if packages or profile:
        raise UsageError("--mnt cannot be combined with --install or --profile; run the "
                         "program with --mnt alone")  # fmt: skip


async def run_mounted(
    config: HarombeConfig, *, mnt_dir: str, language: str, code: str,
    timeout_s: float | None, network: bool | None, allowed_domains: Sequence[str],
    on_output: Callable[[str, bytes], Any], gate: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``code`` in a new sandbox with ``mnt_dir`` copied in at ``/mnt``, its output
    streamed to ``on_output``, and apply its changes there to ``mnt_dir``; the result, with
    the applied changes under ``mnt_changed``. ``gate`` (when not None) decides the run first:
    a denial is :class:`~harombe.errors.ApprovalDeniedError`."""
    from harombe.mounts import run_sandboxed_async

    async with started_manager(config) as manager:
        result, changed = await run_sandboxed_async(
            code, mnt_dir=mnt_dir, language=language, timeout=timeout_s,
            network=bool(network), allowed_domains=allowed_domains, manager=manager,
            on_output=on_output, gate=gate,
        )  # fmt: skip
    return {**result, "mnt_changed": changed}


def name(path: object) -> str:
    """A path the program chose, for one line on a terminal: every control and invisible
    character escaped, a newline included (:func:`harombe.cli.screen.printable`)."""
    return printable(str(path), keep="")


def mnt_report(result: Mapping[str, Any]) -> list[str]:
    """harombe's lines after a ``--mnt`` run: each change applied to the directory, each
    refused, and why nothing came back if so (none after a run without ``--mnt``)."""
    lines = [f"mnt: {c['change']} {name(c['path'])}" + ("/" if c["type"] == "directory" else "")
             for c in result.get("mnt_changed") or ()]  # fmt: skip
    lines += [f"mnt: refused {name(r['path'])}: {r['reason']}" for r in result.get("refused") or ()]
    if result.get("mount_error"):
        lines.append(f"mnt: {printable(str(result['mount_error']))}")
    return lines


def mnt_exit_code(result: Mapping[str, Any], code: int) -> int:
    """The exit code of a run: ``code`` (the program's), but 1 (harombe's own failure) when
    the program succeeded and what it changed in ``/mnt`` could not be brought back
    (``mount_error``, said on stderr by :func:`mnt_report`)."""
    return EXIT_ERROR if code == 0 and result.get("mount_error") else code

"""What the guarded pip is doing, as progress: the files it starts to download (from its
output, line by line) and the bytes it has written so far (its work directory, each second).
Used by :mod:`.pypi`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import structlog

from harombe.security.runtime.install_progress import Reporter, human_bytes

log = structlog.get_logger(__name__)


class Download(Protocol):
    """What progress reads of :class:`.pypi.Download`."""

    @property
    def report(self) -> Reporter: ...

    @property
    def fetched_bytes(self) -> list[int]: ...


#: pip's line for each file it fetches: ``Downloading <url or file name> (12.3 MB)``.
PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([\d.]+) (k?B|[MG]B)\))?")
SIZE_UNITS = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
#: How often the bytes downloaded so far are reported while pip runs (when they grew).
PROGRESS_TICK_S = 1.0


def pip_download_line(line: str) -> tuple[str, int | None, str] | None:
    """``(file name, bytes or None, size as pip wrote it)`` of pip's line announcing a
    download, else None. Pure."""
    found = PIP_DOWNLOADING.match(line)
    if found is None:
        return None
    name = found.group(1).split("#", 1)[0].rsplit("/", 1)[-1]
    if not found.group(2):
        return name, None, ""
    size = int(float(found.group(2)) * SIZE_UNITS.get(found.group(3), 1))
    return name, size, f"{found.group(2)} {found.group(3)}"


async def on_pip_line(download: Download, line: str) -> None:
    """A line of pip's output: a download begins (with its size where pip knows it); the rest
    goes to the debug log only."""
    parsed = pip_download_line(line)
    if parsed is None:
        if line.strip():
            log.debug("package.pip_said", line=line[:500])
        return
    name, size, shown = parsed
    text = f"downloading {name}" + (f" ({shown})" if shown else "")
    await download.report("downloading", text, package=name, bytes=size)


def bytes_in(work: Path) -> int:
    """Bytes of the files (finished or partial) under ``work``, each file name once."""
    sizes: dict[str, int] = {}
    seen = 0
    for root, _dirs, files in os.walk(work):
        for name in files:
            seen += 1
            if seen > 10_000:
                return sum(sizes.values())
            with contextlib.suppress(OSError):
                size = os.lstat(os.path.join(root, name)).st_size
                sizes[name] = max(size, sizes.get(name, 0))
    return sum(sizes.values())


@contextlib.asynccontextmanager
async def ticking(download: Download, work: Path) -> AsyncIterator[None]:
    """While the block runs, report the bytes downloaded so far, each second they grew."""

    async def tick() -> None:
        last = 0
        while True:
            await asyncio.sleep(PROGRESS_TICK_S)
            now = await asyncio.to_thread(bytes_in, work)
            if now > last:
                last = now
                total = download.fetched_bytes[0] + now
                await download.report(
                    "downloading", f"downloaded {human_bytes(total)} so far", bytes=total
                )

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""What listing a call's changed files costs, against the same call without the listing, in
the same run.

    python bench/bench_artifacts.py [--runs N]

Three sandboxes: one with the supervisor as shipped (changed files from its inotify watch),
one that walks the workspace after every call (the watch left out), and one whose listing is
stubbed out (supervisor sources patched in this process only). On each, with an empty
workspace and then with 1,000 files, calls of ``pass`` (Python, session interpreter) and
``true`` (shell, a fresh process) alternate between the sandboxes. Prints p50 per call and the
ratio to the stubbed one, and the walk's own time measured inside the sandbox (its function
run as user code), which the end-to-end numbers hide in the host's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import statistics
import time
import zlib

import structlog
from bench_density import config as pool_off_config  # bench/ is the script's directory

from harombe.security.docker_manager import DockerManager
from harombe.security.guest import HERE, SUPERVISOR_SOURCE
from harombe.security.runtime import sandbox as sandbox_module
from harombe.security.sandbox_manager import SandboxManager

MAIN = '\n\nif __name__ == "__main__":\n    main()\n'
WATCHED = "SCAN[0] = watched_scan\n"
STUBS = "\n\ndef begin_call():\n    return None, 0\n\n\ndef end_call(run, msg):\n    return b''\n"
#: The walk as the supervisor runs it, timed as user code inside the sandbox.
WALK_TIMER = """
import os, time
exec(compile({source!r}, "walk", "exec"))
samples = []
for _ in range({runs}):
    t = time.perf_counter()
    files, cut = scan_workspace()
    samples.append(time.perf_counter() - t)
samples.sort()
(samples[len(samples) // 2] * 1000, len(files), cut)
"""


def boot(source: str) -> str:
    packed = base64.b64encode(zlib.compress(source.encode(), 9)).decode()
    return f"import zlib,binascii;exec(zlib.decompress(binascii.a2b_base64({packed!r})))"


def walk_source() -> str:
    text = (HERE / "supervisor_artifacts.py").read_text(encoding="utf-8")
    start = text.index("def scan_workspace")
    return text[:start].split('"""', 2)[2] + text[start : text.index("def scan_as_user")]


async def p50_calls(
    manager: SandboxManager, pair: list[str], language: str, runs: int
) -> list[float]:
    """p50 seconds of a trivial call on each sandbox of ``pair``, calls alternating."""
    code = "pass" if language == "python" else "true"
    for sid in pair:  # the first call after a change pays for it (and hardens a supervisor)
        await manager.execute(sid, code, language=language)  # type: ignore[arg-type]
    samples: list[list[float]] = [[] for _ in pair]
    for _ in range(runs):
        for i, sid in enumerate(pair):
            t = time.perf_counter()
            result = await manager.execute(sid, code, language=language)  # type: ignore[arg-type]
            samples[i].append(time.perf_counter() - t)
            assert result.success, result
    return [statistics.median(s) for s in samples]


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager, config=pool_off_config())
    await manager.start()
    shipped = sandbox_module.SUPERVISOR_BOOT
    try:
        watched = (await manager.create_sandbox("python")).sandbox_id
        assert SUPERVISOR_SOURCE.endswith(MAIN) and SUPERVISOR_SOURCE.count(WATCHED) == 1
        walking = SUPERVISOR_SOURCE.replace(WATCHED, "")
        sandbox_module.SUPERVISOR_BOOT = boot(walking)
        with_scan = (await manager.create_sandbox("python")).sandbox_id
        sandbox_module.SUPERVISOR_BOOT = boot(SUPERVISOR_SOURCE[: -len(MAIN)] + STUBS + MAIN)
        without = (await manager.create_sandbox("python")).sandbox_id
        sandbox_module.SUPERVISOR_BOOT = shipped
        pair = [watched, with_scan, without]
        for label, setup in (("empty workspace", None), ("1,000 files", "1000")):
            if setup:
                for sid in pair:
                    made = await manager.execute(
                        sid, f"mkdir -p many && cd many && seq 1 {setup} | xargs touch",
                        language="shell",
                    )  # fmt: skip
                    assert made.success, made
            walk = await manager.execute(
                with_scan, WALK_TIMER.format(source=walk_source(), runs=runs * 5)
            )
            print(f"{label}: the walk inside the sandbox (ms, entries, cut): {walk.result}")
            for language in ("python", "shell"):
                watch, scanned, plain = await p50_calls(manager, pair, language, runs)
                print(
                    f"  {language:<7} call p50: inotify {watch * 1000:7.2f} ms "
                    f"({watch / plain:.3f}x), walk {scanned * 1000:7.2f} ms "
                    f"({scanned / plain:.3f}x), no listing {plain * 1000:7.2f} ms"
                )
    finally:
        sandbox_module.SUPERVISOR_BOOT = shipped
        await manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    asyncio.run(main(parser.parse_args().runs))

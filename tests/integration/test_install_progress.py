"""Install progress and the install cache's size cap, on real gVisor, from a loopback index
(``harombe.testing.wheel_index``): the tool's ``on_progress``, ``harombe run --install``'s
lines, ``/v1``'s server-sent events; a cache that cannot make room refuses clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harombe.config import parse_config
from harombe.errors import ImageNotFoundError
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing.wheel_index import WheelIndex, make_wheel
from harombe.tools.code_execution import CodeExecutionTools
from tests.integration.service_support import client, live_service, service_config

pytestmark = pytest.mark.integration

#: Wheels of this size come down in 64 KiB pieces with a pause between: long enough that the
#: download is seen in progress.
SLOW_KB = 512


@pytest.fixture(scope="module")
def index() -> Iterator[WheelIndex]:
    """A slow loopback index: ``progroot`` needs two ``progdep`` wheels; ``capa``/``capb`` are
    600 KB each (for a 1 MB cache)."""
    with WheelIndex(chunk_delay_s=0.02) as made, made.as_pip_config():
        made.publish(make_wheel("progroot", "1.0", requires=["progdep0", "progdep1"]))
        for i in range(2):
            made.publish(make_wheel(f"progdep{i}", "1.0", padding_bytes=SLOW_KB << 10))
        for name in ("capa", "capb"):
            made.publish(make_wheel(name, "1.0", padding_bytes=600 << 10))
        yield made


@pytest.fixture
async def manager(
    docker_manager: DockerManager, tmp_path: Path, index: WheelIndex
) -> AsyncIterator[SandboxManager]:
    """A manager with an empty install cache of its own, no pool."""
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 0}, "install_cache": {"directory": str(tmp_path / "cache")},
    }}})  # fmt: skip
    made = SandboxManager(docker_manager=docker_manager, runtime="runsc", config=config)
    await made.start()
    yield made
    await made.stop()


async def test_the_tool_reports_each_step_while_it_installs(
    manager: SandboxManager, capfd: pytest.CaptureFixture[str]
) -> None:
    """code_install_package(on_progress=...) gets dicts for resolving, downloading (with
    bytes), unpacking, linking and done, in that order, the downloads before the result; the
    package imports; nothing of the build (pip's output) reaches this process's stderr."""
    tools = CodeExecutionTools(manager)
    sid = (await manager.create_sandbox("python")).sandbox_id
    capfd.readouterr()
    events: list[dict[str, Any]] = []

    async def on_progress(event: dict[str, Any]) -> None:  # an async callback works
        events.append(event)

    result = await tools.code_install_package(sid, "progroot==1.0", on_progress=on_progress)
    assert result["success"], result["error"]
    stages = [e["stage"] for e in events]
    firsts = [stages.index(s) for s in ("resolving", "downloading", "unpacking", "linking")]
    assert firsts == sorted(firsts) and stages[-1] == "done", stages
    assert all(set(e) == {"stage", "package", "bytes", "message"} for e in events)
    sized = [e for e in events if e["stage"] == "downloading" and e["bytes"]]
    assert any(e["package"] == "progdep0-1.0-py3-none-any.whl" for e in sized), events
    printed = capfd.readouterr().err  # harombe's own log lines may be there; pip's never
    assert not any(w in printed for w in ("Collecting", "Saved ", "Downloading", "Warning:"))
    check = await manager.execute(sid, "import progdep1\nprogdep1.VERSION")
    assert check.result == "'1.0'", check


async def test_a_cache_that_cannot_make_room_refuses_and_keeps_what_is_linked(
    manager: SandboxManager,
) -> None:
    """With max_mb 1, a second 600 KB set cannot join one a live sandbox links: the install
    fails naming the cap and the setting, and leaves no entry; once that sandbox is gone,
    the same install evicts the first set and succeeds."""
    tools = CodeExecutionTools(manager)
    store = manager.installs.store
    assert store is not None
    store.max_bytes = 1 << 20  # below what the config accepts: set on the store
    first = (await manager.create_sandbox("python")).sandbox_id
    assert (await tools.code_install_package(first, "capa==1.0"))["success"]
    second = (await manager.create_sandbox("python")).sandbox_id
    refused = await tools.code_install_package(second, "capb==1.0")
    assert refused["success"] is False
    assert "cap is 1 MB" in refused["error"], refused
    assert "security.sandbox.install_cache.max_mb" in refused["error"], refused
    assert len(os.listdir(store.envs)) == 1 and os.listdir(store.directory / "tmp") == []
    still = await manager.execute(first, "import capa\ncapa.VERSION")
    assert still.result == "'1.0'", still
    await manager.destroy_sandbox(first)
    done = await tools.code_install_package(second, "capb==1.0")
    assert done["success"], done
    assert len(os.listdir(store.envs)) == 1
    check = await manager.execute(second, "import capb\ncapb.VERSION")
    assert check.result == "'1.0'", check


def test_run_install_prints_progress_lines_on_stderr(index: WheelIndex, tmp_path: Path) -> None:
    """`harombe run --install` prints a line per step (downloads included) on stderr, not
    pip's own output, and the program imports the package."""
    program = tmp_path / "p.py"
    program.write_text("import progdep0\nprint(progdep0.VERSION)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")  # an empty install cache
    done = subprocess.run(
        [sys.executable, "-m", "harombe", "run", "--install", "progroot==1.0", str(program)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1.0\n"
    lines = done.stderr.splitlines()
    assert any("progroot==1.0: downloading progdep0-1.0-py3-none-any.whl" in x for x in lines)
    assert any("progroot==1.0: installed" in x for x in lines), done.stderr
    assert "Saved " not in done.stderr and "Collecting" not in done.stderr


async def test_v1_streams_install_progress_as_server_sent_events(
    docker_manager: DockerManager, index: WheelIndex, tmp_path: Path
) -> None:
    """POST /v1/sandboxes/{id}/packages/stream sends progress events as the install goes,
    then one result event with the install's result."""
    config = service_config({"security": {"sandbox": {
        "install_cache": {"directory": str(tmp_path / "cache")},
    }}})  # fmt: skip
    events: list[tuple[str, dict[str, Any]]] = []
    async with live_service(docker_manager, config) as (_, base), client(base, timeout_s=300) as h:
        sid = (await h.post("/v1/sandboxes", json={"language": "python"})).json()["sandbox_id"]
        url = f"/v1/sandboxes/{sid}/packages/stream"
        async with h.stream("POST", url, json={"package": "progroot==1.0"}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kind = None
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind:
                    events.append((kind, json.loads(line[6:])))
        ran = await h.post(f"/v1/sandboxes/{sid}/execute", json={"code": "import progdep1"})
        assert ran.json()["success"] is True, ran.json()
    kinds = [k for k, _ in events]
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"progress"}, kinds
    assert events[-1][1]["success"] is True, events[-1]
    stages = [e["stage"] for k, e in events if k == "progress"]
    assert "downloading" in stages and stages[-1] == "done", stages


async def test_the_guides_yaml_runs_or_names_the_missing_image(
    docker_manager: DockerManager,
) -> None:
    """A manager on the usage guide's YAML (host names for registries, public image names)
    starts; a sandbox of an image that is not on this machine is an ImageNotFoundError that
    says how to get one."""
    from tests.unit.test_install_hosts import _guide_config

    data = yaml.safe_load(_guide_config())
    data["security"]["sandbox"]["pool"] = {"size": 0}
    made = SandboxManager(docker_manager=docker_manager, config=parse_config(data))
    await made.start()
    try:
        with pytest.raises(ImageNotFoundError, match="harombe images build"):
            await made.create_sandbox("python")
    finally:
        await made.stop()

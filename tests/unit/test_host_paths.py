"""No path of this host reaches a caller: errors provoked with the install cache, the profiles
directory, temporary directories, Python's own files in a traceback, the working directory,
the home directory or the Docker socket in them come out of every exit (a tool result's
``error``, a ``/v1`` problem, fips ``/execute``, an MCP error) with labels instead; paths inside
the sandbox stay as written."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import pytest

from harombe import errors
from harombe.config import parse_config
from harombe.host_paths import remember_host_path, scrub_host_paths
from harombe.profile_files import read_profile_documents
from harombe.security.runtime.environments import EnvironmentStore
from harombe.service.app import create_app
from harombe.service.mcp_content import error_result
from harombe.service.problems import problem_from
from harombe.service.state import Service
from harombe.testing import FakeDocker
from harombe.testing.http import clients
from harombe.tools import plans


def host_roots(*more: Path) -> list[str]:
    """Paths that must not appear in anything a caller sees."""
    roots = [str(Path.home()), sys.prefix, os.getcwd(), "/var/run/docker.sock"]
    return [*roots, *(str(p) for p in more)]


def traceback_text() -> str:
    """A real traceback of a host-side failure (it names Python's own files)."""
    try:
        json.loads("{not json")
    except ValueError:
        return traceback.format_exc()
    raise AssertionError("json.loads accepted bad JSON")


def provoked(tmp_path: Path) -> list[tuple[str, errors.HarombeError]]:
    """Errors harombe really raises, each quoting a host path."""
    found: list[tuple[str, errors.HarombeError]] = []
    blocked = tmp_path / "cache-file"
    blocked.write_text("a file where the cache directory should be")
    store = EnvironmentStore(blocked, max_mb=64, resolve_ttl_s=0)
    try:
        store.open()
    except errors.ConfigError as err:
        found.append(("install-cache", err))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "viz.yaml").write_text("imports: [\n")
    try:
        read_profile_documents(profiles)
    except errors.ConfigError as err:
        found.append(("profile-file", err))
    try:
        open(tmp_path / "missing.pem")  # noqa: SIM115 - provoking the error is the point
    except OSError as exc:
        found.append(("os-error", errors.InfrastructureError(f"cannot read it: {exc}")))
    download = Path(tempfile.mkdtemp(prefix="harombe-pip-"))
    download.rmdir()  # gone by the time its error is shown, as pip's directories are
    text = f"downloading x failed:\n{traceback_text()}  in {download}/work/x.whl"
    found.append(("pip-output", errors.PackageFetchError(text)))
    found.append(("home", errors.PackageFetchError(f"see {Path.home()}/.cache/pip/log.txt")))
    found.append(("cwd", errors.ConfigError(f"config file {os.getcwd()}/harombe.yaml is bad")))
    found.append(("docker-socket", errors.DockerUnavailableError(
        "Docker socket error at /var/run/docker.sock while starting: refused")))  # fmt: skip
    assert len(found) == 7
    return found


SANDBOX_TEXTS = [
    ("workspace", "path /workspace/data/a.csv does not exist"),
    ("sandbox-tmp", "code_execute needs approval: rm -rf /tmp/x"),
    ("mnt", "/mnt/out.txt is outside /workspace"),
]


@pytest.mark.parametrize("text", [t[1] for t in SANDBOX_TEXTS], ids=[t[0] for t in SANDBOX_TEXTS])
def test_paths_in_the_sandbox_are_kept(text: str) -> None:
    """A sandbox path is the caller's own: it is shown as written."""
    assert scrub_host_paths(text) == text


def test_every_provoked_error_is_shown_without_host_paths(tmp_path: Path) -> None:
    """Each exit — problem body, MCP error — of each provoked error names no host path."""
    remember_host_path("<install cache>", tmp_path / "cache-file")
    roots = host_roots(tmp_path)
    for name, err in provoked(tmp_path):
        raw = str(err)
        assert any(root in raw for root in roots), name  # it did quote a host path
        shown = [
            json.loads(problem_from(err).response().body)["message"],
            error_result(err.kind, str(err)).structured_content["error"],  # type: ignore[index]
        ]
        for text in shown:
            assert not [root for root in roots if root in text], (name, text)
            assert "<" in text, text  # a label stands where the path was


@pytest.fixture
async def service(docker: FakeDocker, tmp_path: Path) -> Any:
    config = parse_config({
        "security": {"sandbox": {"pool": {"size": 0},
                                 "install_cache": {"directory": str(tmp_path / "cache")}},
                     "hitl": {"enabled": False}},
    })  # fmt: skip
    svc = Service(config, docker_manager=docker, environ={})
    await svc.start()
    yield svc
    await svc.stop()


async def test_tool_results_and_service_answers_name_no_host_path(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provoked error raised while a call is planned reaches the library's result, /v1 and
    fips /execute with its host paths replaced; the log keeps the original."""
    cache = tmp_path / "cache"
    roots = host_roots(tmp_path, cache)
    for name, err in provoked(tmp_path):
        if name == "install-cache":  # the service's own cache directory, this time
            err = errors.InfrastructureError(f"cannot write {cache}/envs/abc: No space left")

        async def failing(*args: Any, error: Exception = err, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(plans, "execute", failing)
        result = await service.tools.code_execute("python", "print(1)")
        async with clients(create_app(service=service))() as http:
            v1 = (await http.post("/v1/sandboxes", json={})).json()["message"]
            fips = (await http.post("/execute", json={"code": "print(1)"})).json()["error"]
        for text in (result["error"], v1, fips):
            assert "<" in text, (name, text)  # a label stands where the path was
            assert not [root for root in roots if root in text], (name, text)

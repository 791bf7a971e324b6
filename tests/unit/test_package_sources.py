"""Where the host downloads packages from: the configured registries reach pip's environment
and npm's arguments, and replace the machine's own sources; without them, the machine's pip /
npm configuration decides (no Docker, no network: the download tools are never started)."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from harombe.errors import PackageFetchError
from harombe.security.runtime.packages import npm, pypi
from harombe.security.runtime.packages.wheels import Target, Want

MACHINE = {
    "PIP_INDEX_URL": "https://machine.example/simple",
    "PIP_EXTRA_INDEX_URL": "https://other.example/simple",
    "PIP_FIND_LINKS": "/srv/wheels",
    "PIP_NO_INDEX": "1",
    "PIP_PROXY": "http://proxy.example:3128",
    "PIP_CERT": "/etc/ssl/certs/company.pem",
}
CONFIGURED = ("https://one.example/simple", "https://two.example/simple", "http://three.example/")


class RecordingArea:
    """A FetchArea whose programs never start: each run is recorded and fails."""

    def __init__(self, root: Path, output: str) -> None:
        self.root = root
        self.output = output
        self.runs: list[tuple[list[str], dict[str, str]]] = []

    def new_dir(self, name: str) -> Path:
        path = self.root / f"{len(list(self.root.iterdir())):03d}-{name}"
        (path / "home").mkdir(parents=True)
        return path

    async def run(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], **_: Any
    ) -> tuple[int, str]:
        self.runs.append((list(argv), dict(env)))
        return 1, self.output


@pytest.fixture
def machine_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pypi, "_pip_config", lambda: dict(MACHINE))


async def test_configured_indexes_replace_the_machines_sources(
    machine_pip: None, tmp_path: Path
) -> None:
    """The first URL is the index, the others extra indexes; find-links and no-index of the
    machine are dropped, its proxy and certificate kept."""
    env = await pypi.pip_env(tmp_path, CONFIGURED)
    assert env["PIP_INDEX_URL"] == CONFIGURED[0]
    assert env["PIP_EXTRA_INDEX_URL"] == f"{CONFIGURED[1]} {CONFIGURED[2]}"
    assert "PIP_FIND_LINKS" not in env and "PIP_NO_INDEX" not in env
    assert env["PIP_PROXY"] == MACHINE["PIP_PROXY"] and env["PIP_CERT"] == MACHINE["PIP_CERT"]


async def test_one_configured_index_has_no_extras(machine_pip: None, tmp_path: Path) -> None:
    env = await pypi.pip_env(tmp_path, CONFIGURED[:1])
    assert env["PIP_INDEX_URL"] == CONFIGURED[0] and "PIP_EXTRA_INDEX_URL" not in env


async def test_without_configured_indexes_the_machine_decides(
    machine_pip: None, tmp_path: Path
) -> None:
    env = await pypi.pip_env(tmp_path)
    assert {k: env[k] for k in MACHINE} == MACHINE
    assert env["PIP_CONFIG_FILE"] and env["PIP_NO_CACHE_DIR"] == "1"


async def test_resolve_downloads_from_the_configured_indexes(
    machine_pip: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resolve() hands index_urls to every pip run it starts."""

    async def runtime(area: Any) -> pypi.PipRuntime:
        return pypi.PipRuntime("python3", tmp_path / "pip-only")

    monkeypatch.setattr(pypi, "pip_runtime", runtime)
    area = RecordingArea(tmp_path, "ERROR: No matching distribution found for six")
    target = Target("3.11.2", "x86_64", "2.36")
    with pytest.raises(PackageFetchError, match="no wheel of six"):
        await pypi.resolve(area, "six", target, ["linux_x86_64"], index_urls=CONFIGURED)  # type: ignore[arg-type]
    ((argv, env),) = area.runs
    assert argv[argv.index("--") + 1 :] == ["six"]
    assert env["PIP_INDEX_URL"] == CONFIGURED[0]


def test_npm_arguments_name_the_configured_registry(tmp_path: Path) -> None:
    args = npm.npm_common_args(tmp_path, "https://npm.example/")
    assert args[-1] == "--registry=https://npm.example/"
    assert {"--ignore-scripts", "--allow-git=none"} <= set(args)
    assert not [a for a in npm.npm_common_args(tmp_path) if a.startswith("--registry")]


@pytest.mark.parametrize("registry", ["https://npm.example/", None])
async def test_both_npm_runs_use_the_configured_registry(
    registry: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fetch_tree passes --registry to npm exactly when one is configured."""
    monkeypatch.setenv("npm_config_userconfig", str(tmp_path / "no-npmrc"))
    area = RecordingArea(tmp_path, "npm error code ECONNREFUSED\n")
    with pytest.raises(PackageFetchError, match="could not download"):
        await npm.fetch_tree(area, "npm", "axios@1.6.0", registry=registry)  # type: ignore[arg-type]
    ((argv, _),) = area.runs
    assert argv[:3] == ["npm", "install", "--package-lock-only"]
    given = [a for a in argv if a.startswith("--registry")]
    assert given == ([f"--registry={registry}"] if registry else [])


@pytest.mark.parametrize(
    ("output", "kind", "needle"),
    [
        ("ERROR: No matching distribution found for six", "PackageNotFoundError", "no wheel of"),
        (
            "WARNING: Retrying after connection broken by 'NewConnectionError(...)'"
            "\nERROR: No matching distribution found for six",
            "PackageFetchError",
            "could not be reached",
        ),
        (
            "ProxyError('Cannot connect to proxy.')\nERROR: No matching distribution found",
            "PackageFetchError",
            "could not be reached",
        ),
        ("ERROR: something else entirely", "PackageFetchError", "failed"),
    ],
    ids=["index-answered-no-such-package", "index-down", "proxy-down", "other"],
)
def test_pip_failures_tell_a_missing_package_from_an_unreachable_index(
    output: str, kind: str, needle: str
) -> None:
    """'No matching distribution' is the package's fault only when the index was reached."""
    want = Want("six", SpecifierSet())
    error = pypi._pip_failure([want], Target("3.11.2", "x86_64", "2.36"), output)
    assert error.kind == kind and needle in str(error)


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        (
            "npm error code E404\nnpm error 404 Not Found - GET http://127.0.0.1:9/nope",
            "PackageNotFoundError",
        ),
        ("npm error code ETARGET\nnpm error notarget No matching version", "PackageNotFoundError"),
        ("npm error code ECONNREFUSED", "PackageFetchError"),
    ],
    ids=["no-such-package", "no-such-version", "registry-down"],
)
def test_npm_failures_tell_a_missing_package_from_an_unreachable_registry(
    output: str, kind: str, tmp_path: Path
) -> None:
    """npm's E404/ETARGET mean the registry answered; anything else is a fetch failure."""
    assert npm._npm_failure("nope", output, tmp_path).kind == kind  # type: ignore[attr-defined]

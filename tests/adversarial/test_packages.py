"""Attacks from a malicious package index on the host that downloads packages.

A local index (PEP 503 for pip, a registry for npm) on 127.0.0.1, built here with plain
zipfile/tarfile, serves packages whose dependency metadata points at URLs, VCS repositories,
host paths and source distributions whose build would write a marker file on the host. Each
probe asserts the attack is held: the download is refused with an error naming the offending
requirement, the marker file does not exist, and the server never saw a request for the
payload. Nothing here leaves the loopback interface; the machine's own pip / npm configuration
is replaced for the duration of each test through environment variables.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harombe.errors import PackageFetchError, PackageSpecError
from harombe.security.runtime import packages
from harombe.security.runtime.packages.fetch_runner import FetchArea
from harombe.security.runtime.packages.pypi import PIP_GUARD, pip_env, pip_runtime
from harombe.tools.code_execution import CodeExecutionTools

TARGET = {"python": "3.11.2", "machine": "x86_64", "glibc": "2.36"}


@dataclass
class Index:
    """Routes served on 127.0.0.1 and every path requested, in order."""

    routes: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    requested: list[str] = field(default_factory=list)
    url: str = ""

    def payload_requests(self) -> list[str]:
        return [p for p in self.requested if "payload" in p and not p.startswith("/simple/")]


def _server(index: Index) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            index.requested.append(path)
            found = index.routes.get(path) or index.routes.get(path.rstrip("/") + "/")
            if found is None:
                self.send_error(404)
                return
            kind, body = found
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Index]:
    """A loopback index that pip and npm use instead of the machine's configuration."""
    found = Index()
    server = _server(found)
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for key in list(os.environ):
        if key.upper().startswith(("PIP_", "NPM_CONFIG_")) or "proxy" in key.lower():
            monkeypatch.delenv(key)
    for name in ("npmrc", "global-npmrc"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"{found.url}/simple/")
    monkeypatch.setenv("npm_config_registry", f"{found.url}/")
    monkeypatch.setenv("npm_config_userconfig", str(tmp_path / "npmrc"))
    monkeypatch.setenv("npm_config_globalconfig", str(tmp_path / "global-npmrc"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every user can read (pytest's own tmp_path is private to root): payload
    sources on disk live here, so only harombe's refusal keeps the download user from them."""
    path = Path(tempfile.mkdtemp(prefix="harombe-probe-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def marker(world: Path) -> Path:
    """Where payload code would write; writable by anyone, so only not running keeps it away."""
    spot = world / "spot"
    spot.mkdir()
    spot.chmod(0o1777)
    return spot / "PWNED"


def ran(marker: Path) -> bool:
    """Whether payload code wrote its marker."""
    return marker.exists()


def members(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return tar.getnames()


# --- PyPI -------------------------------------------------------------------------------------


def wheel(name: str, version: str, requires: list[str], extras: Sequence[str] = ()) -> bytes:
    """A pure-Python wheel whose METADATA declares ``requires``."""
    dist = f"{name}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras]
    meta += [f"Requires-Dist: {r}" for r in requires]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{dist}/METADATA", "\n".join(meta) + "\n")
        zf.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}/RECORD", "")
    return buf.getvalue()


def sdist(name: str, version: str, marker: Path) -> bytes:
    """A source tree whose in-tree build backend (no build requirements) and setup.py write
    ``marker`` the moment anything imports or runs them."""
    write = f"open({str(marker)!r}, 'a').write('built on the host\\n')\n"
    backend = write + (
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
        "    raise SystemExit(1)\n"
        "def build_wheel(d, config_settings=None, metadata_directory=None):\n"
        "    raise SystemExit(1)\n"
    )
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "probe_backend"\n'
        'backend-path = ["."]\n',
        "probe_backend.py": backend,
        "setup.py": write,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def publish(index: Index, files: dict[str, bytes]) -> None:
    """Serve ``files`` (wheel / sdist file name → bytes) from a PEP 503 simple index."""
    by_project: dict[str, list[str]] = {}
    for filename, data in files.items():
        project = filename.split("-")[0].lower().replace("_", "-")
        by_project.setdefault(project, []).append(filename)
        kind = "application/zip" if filename.endswith(".whl") else "application/gzip"
        index.routes[f"/files/{filename}"] = (kind, data)
    for project, names in by_project.items():
        links = "".join(
            f'<a href="/files/{n}#sha256={hashlib.sha256(files[n]).hexdigest()}">{n}</a>\n'
            for n in names
        )
        page = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        index.routes[f"/simple/{project}/"] = ("text/html", page)


def payload_files(index: Index, marker: Path) -> dict[str, bytes]:
    """The payload sdist, also at a URL, a VCS path and on disk (by ``file://``)."""
    data = sdist("payload", "1.0", marker)
    index.routes["/payload/payload-1.0.tar.gz"] = ("application/gzip", data)
    return {"payload-1.0.tar.gz": data}


def url_of(kind: str, index: Index, tmp: Path) -> str:
    if kind == "http":
        return f"{index.url}/payload/payload-1.0.tar.gz"
    if kind == "file":
        return (tmp / "payload-1.0.tar.gz").as_uri()
    return f"{kind}+{index.url}/payload/payload.git"


@dataclass(frozen=True)
class PypiProbe:
    request: str
    tree: dict[str, list[str]]  # "name-version" → Requires-Dist lines ({url}: payload's URL)
    url_kind: str = "http"
    error: type[Exception] = PackageSpecError
    needle: str = "payload @ "
    extras: tuple[str, ...] = ()
    payload_indexed: bool = False


URL_DEP = "payload @ {url}"
PYPI_PROBES = {
    "direct-url": PypiProbe("evil", {"evil-1.0": [URL_DEP]}),
    "direct-url-no-spaces": PypiProbe(
        "evil", {"evil-1.0": ["payload@{url}"]}, needle="payload@http"
    ),
    "direct-url-https-upper": PypiProbe(
        "evil", {"evil-1.0": ["Payload @ {url}"]}, needle="Payload @ "
    ),
    "file-url-on-host": PypiProbe("evil", {"evil-1.0": [URL_DEP]}, url_kind="file"),
    "vcs-git": PypiProbe("evil", {"evil-1.0": [URL_DEP]}, url_kind="git", needle="git+http"),
    "vcs-hg": PypiProbe("evil", {"evil-1.0": [URL_DEP]}, url_kind="hg", needle="hg+http"),
    "vcs-svn": PypiProbe("evil", {"evil-1.0": [URL_DEP]}, url_kind="svn", needle="svn+http"),
    "two-levels-deep": PypiProbe(
        "evil", {"evil-1.0": ["mid>=1"], "mid-1.0": [URL_DEP]}, needle="mid 1.0 depends on"
    ),
    "three-levels-deep": PypiProbe(
        "evil==1.0",
        {"evil-1.0": ["mid"], "mid-1.0": ["low<2"], "low-1.0": [URL_DEP]},
        needle="low 1.0 depends on",
    ),
    "extra-requested": PypiProbe(
        "evil[x]", {"evil-1.0": ['payload @ {url} ; extra == "x"']}, extras=("x",)
    ),
    "extra-not-requested": PypiProbe(
        "evil", {"evil-1.0": ['payload @ {url} ; extra == "x"']}, extras=("x",)
    ),
    "extra-of-a-dependency": PypiProbe(
        "evil",
        {"evil-1.0": ["mid[x]"], "mid-1.0": ['payload @ {url} ; extra == "x"']},
        needle="mid 1.0 depends on",
    ),
    "marker-for-another-platform": PypiProbe(
        "evil", {"evil-1.0": ['payload @ {url} ; sys_platform == "win32"']}
    ),
    "only-sdist-for-dependency": PypiProbe(
        "evil",
        {"evil-1.0": ["payload>=1.0"]},
        error=PackageFetchError,
        needle="no wheel of payload>=1.0",
        payload_indexed=True,
    ),
    "only-sdist-two-levels-deep": PypiProbe(
        "evil",
        {"evil-1.0": ["mid"], "mid-1.0": ["payload"]},
        error=PackageFetchError,
        needle="needed by mid 1.0",
        payload_indexed=True,
    ),
    "only-sdist-for-the-request": PypiProbe(
        "payload==1.0",
        {},
        error=PackageFetchError,
        needle="no wheel of payload==1.0",
        payload_indexed=True,
    ),
}


@pytest.mark.parametrize("probe", PYPI_PROBES.values(), ids=PYPI_PROBES.keys())
async def test_malicious_index_cannot_run_code_on_the_host(
    index: Index, marker: Path, world: Path, probe: PypiProbe
) -> None:
    """The install is refused naming the requirement; no payload is fetched, built or run."""
    sources = payload_files(index, marker)
    (world / "payload-1.0.tar.gz").write_bytes(sources["payload-1.0.tar.gz"])
    url = url_of(probe.url_kind, index, world)
    files = {
        f"{dist}-py3-none-any.whl": wheel(
            dist.split("-")[0], dist.split("-")[1], [r.format(url=url) for r in reqs], probe.extras
        )
        for dist, reqs in probe.tree.items()
    }
    if probe.payload_indexed:
        files.update(sources)
    publish(index, files)
    spec = packages.parse_spec(probe.request, "pypi")
    with pytest.raises(probe.error) as caught:
        await packages.fetch_pypi(spec, **TARGET)
    assert probe.needle in str(caught.value), caught.value
    assert not ran(marker), "package code ran on the host"
    assert index.payload_requests() == [], index.requested


async def test_a_newer_sdist_is_never_built_and_the_wheel_is_used(
    index: Index, marker: Path
) -> None:
    """An index offering evil 2.0 as an sdist next to the evil 1.0 wheel: 1.0 is fetched,
    2.0 is neither downloaded nor built."""
    publish(
        index,
        {
            "evil-1.0-py3-none-any.whl": wheel("evil", "1.0", ["mid"]),
            "mid-1.0-py3-none-any.whl": wheel("mid", "1.0", []),
            "evil-2.0.tar.gz": sdist("evil", "2.0", marker),
        },
    )
    archive = await packages.fetch_pypi(packages.parse_spec("evil", "pypi"), **TARGET)
    names = members(archive)
    assert sorted(names) == ["evil-1.0-py3-none-any.whl", "mid-1.0-py3-none-any.whl"]
    assert not ran(marker)
    assert "/files/evil-2.0.tar.gz" not in index.requested


@pytest.mark.parametrize(
    "target",
    ["payload-1.0.tar.gz", "payload @ {url}"],
    ids=["sdist-file-given-to-pip", "url-requirement-given-to-pip"],
)
async def test_guarded_pip_cannot_build_even_when_asked_directly(
    index: Index, marker: Path, world: Path, target: str
) -> None:
    """Second layer: the guarded pip, handed a source distribution outright, refuses to start
    the build backend — the marker is never written."""
    payload_files(index, marker)
    local = world / "payload-1.0.tar.gz"
    local.write_bytes(index.routes["/payload/payload-1.0.tar.gz"][1])
    local.chmod(0o644)
    url = f"{index.url}/payload/payload-1.0.tar.gz"
    requirement = str(local) if target.endswith(".tar.gz") else target.format(url=url)
    area = FetchArea("harombe-test-")
    try:
        runtime = await pip_runtime(area)
        work = area.new_dir("pip")
        code, output = await area.run(
            [runtime.python, "-I", "-S", "-c", PIP_GUARD, str(runtime.pip_path), "download",
             "--no-deps", "--dest", str(work / "out"), "--", requirement],
            cwd=work,
            env=await pip_env(work / "home"),
        )  # fmt: skip
    finally:
        area.close()
    assert code != 0, output
    assert "harombe-guard-refused" in output, output
    assert not ran(marker), "a build backend ran on the host"


async def test_downloads_run_unprivileged() -> None:
    """The download tools never run as root: as root, they run as nobody with no groups."""
    area = FetchArea("harombe-test-")
    try:
        work = area.new_dir("id")
        code, output = await area.run(
            ["sh", "-c", "id -u; id -G"], cwd=work, env={"PATH": os.defpath}
        )
    finally:
        area.close()
    uid, groups = output.split("\n", 1)
    assert code == 0
    assert int(uid) != 0 and "0" not in groups.split(), output


# --- npm --------------------------------------------------------------------------------------


def npm_tarball(name: str, version: str, manifest: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in {
            "package.json": json.dumps({"name": name, "version": version, **manifest}),
            "index.js": "module.exports = 42\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def npm_publish(index: Index, name: str, version: str, manifest: dict[str, object]) -> None:
    data = npm_tarball(name, version, manifest)
    path = f"/{name}/-/{name}-{version}.tgz"
    index.routes[path] = ("application/octet-stream", data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    doc = {
        "name": name,
        "dist-tags": {"latest": version},
        "versions": {
            version: {
                "name": name,
                "version": version,
                **manifest,
                "dist": {
                    "tarball": index.url + path,
                    "integrity": integrity,
                    "shasum": hashlib.sha1(data).hexdigest(),
                },
            }
        },
    }
    index.routes[f"/{name}"] = ("application/json", json.dumps(doc).encode())


@dataclass(frozen=True)
class NpmProbe:
    packages: dict[str, dict[str, object]]  # name → manifest fields (1.0.0 of each)
    needle: str = "payload"


def payload_spec(kind: str, index: Index, tmp: Path) -> str:
    return {
        "git": f"git+{index.url}/payload/payload.git",
        "git-hash": f"git+{index.url}/payload/payload.git#v1.0.0",
        "url": f"{index.url}/payload/payload-1.0.0.tgz",
        "file-dir": f"file:{tmp / 'secret'}",
        "file-tgz": f"file:{tmp / 'payload-1.0.0.tgz'}",
        "link": f"link:{tmp / 'secret'}",
    }[kind]


NPM_PROBES = {
    "git-dependency": NpmProbe({"evil": {"dependencies": {"payload": "{git}"}}}),
    "git-with-ref": NpmProbe({"evil": {"dependencies": {"payload": "{git-hash}"}}}),
    "url-dependency": NpmProbe({"evil": {"dependencies": {"payload": "{url}"}}}),
    "file-directory-on-host": NpmProbe({"evil": {"dependencies": {"payload": "{file-dir}"}}}),
    "file-tarball-on-host": NpmProbe({"evil": {"dependencies": {"payload": "{file-tgz}"}}}),
    "link-to-host-directory": NpmProbe(
        {"evil": {"dependencies": {"payload": "{link}"}}}, needle="link:"
    ),
    "git-two-levels-deep": NpmProbe(
        {"evil": {"dependencies": {"mid": "1.0.0"}}, "mid": {"dependencies": {"payload": "{git}"}}}
    ),
    "url-as-optional-dependency": NpmProbe(
        {"evil": {"optionalDependencies": {"payload": "{url}"}}}
    ),
    "git-as-peer-dependency": NpmProbe({"evil": {"peerDependencies": {"payload": "{git}"}}}),
    "file-as-alias-target": NpmProbe(
        {"evil": {"dependencies": {"payload": "npm:{file-dir}"}}}, needle="tree of evil@1.0.0"
    ),
}


@pytest.mark.parametrize("probe", NPM_PROBES.values(), ids=NPM_PROBES.keys())
async def test_malicious_registry_cannot_pull_non_registry_code(
    index: Index, marker: Path, world: Path, probe: NpmProbe
) -> None:
    """A git/URL/file/link dependency anywhere in the tree is refused naming it; nothing is
    fetched from it, no host file is copied, no script runs."""
    tmp_path = world
    secret = world / "secret"
    secret.mkdir()
    (secret / "package.json").write_text('{"name":"payload","version":"1.0.0"}')
    (secret / "host-secret.txt").write_text("host data")
    (tmp_path / "payload-1.0.0.tgz").write_bytes(npm_tarball("payload", "1.0.0", {}))
    index.routes["/payload/payload-1.0.0.tgz"] = (
        "application/octet-stream",
        npm_tarball("payload", "1.0.0", {"scripts": {"install": f"touch {marker}"}}),
    )
    for name, manifest in probe.packages.items():
        text = json.dumps(manifest)
        for kind in ("git-hash", "git", "url", "file-dir", "file-tgz", "link"):
            text = text.replace("{" + kind + "}", payload_spec(kind, index, tmp_path))
        npm_publish(index, name, "1.0.0", json.loads(text))
    with pytest.raises(PackageSpecError) as caught:
        await packages.fetch_npm(packages.parse_spec("evil@1.0.0", "npm"))
    assert probe.needle in str(caught.value), caught.value
    assert "registry" in str(caught.value)
    assert not ran(marker)
    assert index.payload_requests() == [], index.requested


async def test_install_scripts_in_the_tree_never_run(index: Index, marker: Path) -> None:
    """Lifecycle scripts of registry packages (preinstall/install/postinstall/prepare) are
    not run on the host; the registry-only tree itself installs."""
    scripts = {k: f"touch {marker}" for k in ("preinstall", "install", "postinstall", "prepare")}
    npm_publish(index, "mid", "1.0.0", {"scripts": scripts})
    npm_publish(index, "evil", "1.0.0", {"dependencies": {"mid": "^1.0.0"}, "scripts": scripts})
    archive, _ = await packages.fetch_npm(packages.parse_spec("evil@1.0.0", "npm"))
    names = members(archive)
    assert "evil/index.js" in names and "mid/index.js" in names
    assert not ran(marker)


# --- end to end, through the tool ------------------------------------------------------------


@pytest.mark.parametrize(
    ("registry", "package", "needle"),
    [("pypi", "evil", "payload @ "), ("npm", "evil@1.0.0", "payload@git+")],
    ids=["pypi-url-dependency", "npm-git-dependency"],
)
async def test_install_tool_refuses_a_malicious_tree(
    tools: CodeExecutionTools,
    sandbox_id: str,
    index: Index,
    marker: Path,
    registry: str,
    package: str,
    needle: str,
) -> None:
    """code_install_package returns a PackageSpecError result naming the dependency; nothing ran
    on the host and the sandbox is unharmed."""
    payload_files(index, marker)
    url = f"{index.url}/payload/payload-1.0.tar.gz"
    publish(index, {"evil-1.0-py3-none-any.whl": wheel("evil", "1.0", [f"payload @ {url}"])})
    npm_publish(
        index, "evil", "1.0.0", {"dependencies": {"payload": f"git+{index.url}/payload/p.git"}}
    )
    result = await tools.code_install_package(
        sandbox_id=sandbox_id, package=package, registry=registry
    )
    assert result["success"] is False, result
    assert result["error"].startswith("PackageSpecError") and needle in result["error"], result
    assert not ran(marker)
    assert index.payload_requests() == [], index.requested
    alive = await tools.code_execute(language="python", code="print(1)", sandbox_id=sandbox_id)
    assert alive["stdout"] == "1\n"

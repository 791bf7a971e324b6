"""Attacks on what root does on the host around package downloads, and on the in-sandbox untar.

The download tools run as ``nobody`` in a directory lent to them; everything harombe does with
that directory afterwards (taking it back, lending it again, reading wheels, tarring trees)
runs as root. These probes play a download tool that went bad — a planted symlink, FIFO,
foreign file, hard link, lingering process or runaway file — and a malicious index (on
127.0.0.1, built here) serving wheels whose names, archives or metadata lie. In the sandbox,
user code plants symlinks where an install unpacks. Each probe asserts the attack is held:
refused with a clear error, and nothing outside the intended place changed or leaked.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harombe.errors import PackageFetchError, PackageSpecError
from harombe.security.runtime import packages
from harombe.security.runtime.packages import fetch_runner
from harombe.security.runtime.packages import npm as npm_fetch
from harombe.security.runtime.packages import pypi as pypi_fetch
from harombe.security.runtime.packages import wheels as wheel_data
from harombe.security.runtime.packages.fetch_runner import FetchArea
from harombe.security.runtime.sandbox import HOME
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from tests.adversarial.test_packages import (
    TARGET,
    Index,
    index,
    marker,
    npm_publish,
    publish,
    ran,
    wheel,
    world,
)

__all__ = ["index", "marker", "world"]  # fixtures used by name below

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="lending to nobody needs root")


@pytest.fixture
def victim() -> Iterator[Path]:
    """A root-owned file in a root-owned directory every user can read: what a bad download
    tool would like root to chown, chmod or copy for it."""
    where = Path(tempfile.mkdtemp(prefix="harombe-victim-"))
    where.chmod(0o755)
    spot = where / "secret"
    spot.write_text("root only\n")
    spot.chmod(0o600)
    yield spot
    spot.unlink(missing_ok=True)
    where.rmdir()


def untouched(spot: Path) -> bool:
    st = os.lstat(spot)
    same = spot.read_text() == "root only\n"
    return st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600 and same


# --- root lending and reclaiming the download user's directory --------------------------------

#: Shell run as the download user in its work directory (``{victim}`` is the root file).
PLANTS = {
    "home-swapped-for-symlink": ("mv home h2 && ln -s {victim} home", ()),
    "home-swapped-for-symlink-to-dir": ("mv home h2 && ln -s {victim_dir} home", ()),
    "given-file-swapped-for-symlink": ("rm package.json && ln -s {victim} package.json",
                                       ("package.json",)),
    "given-file-swapped-for-fifo": ("rm package.json && mkfifo package.json", ("package.json",)),
    "given-file-swapped-for-dir": ("rm package.json && mkdir package.json", ("package.json",)),
}  # fmt: skip


@AS_ROOT
@pytest.mark.parametrize("plant", PLANTS.values(), ids=PLANTS.keys())
async def test_planted_entries_are_never_chowned_through(
    victim: Path, plant: tuple[str, tuple[str, ...]]
) -> None:
    """What a run leaves in its directory is never followed when it is lent again: the second
    run is refused (without blocking on a FIFO) and the root file keeps its owner and mode."""
    script, give = plant
    area = FetchArea("harombe-probe-")
    try:
        work = area.new_dir("tool")
        (work / "package.json").write_text("{}")
        shell = script.format(victim=victim, victim_dir=victim.parent)
        code, out = await area.run(["sh", "-c", shell], cwd=work, env={"PATH": os.defpath},
                                   give=("package.json",))  # fmt: skip
        assert code == 0, out
        with pytest.raises(PackageFetchError, match="replaced"):
            await asyncio.wait_for(
                area.run(["true"], cwd=work, env={"PATH": os.defpath}, give=give), 30
            )
    finally:
        area.close()
    assert untouched(victim)
    assert os.lstat(victim.parent).st_uid == 0


@AS_ROOT
async def test_lingering_processes_die_with_the_run() -> None:
    """A process the tool left behind (same group, output detached) is killed when the run
    ends, so nothing of the download user can change files after harombe checked them."""
    area = FetchArea("harombe-probe-")
    try:
        work = area.new_dir("tool")
        code, out = await area.run(
            ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], cwd=work, env={"PATH": os.defpath}
        )
        assert code == 0, out
        pid = int(out.strip())
        for _ in range(50):
            try:
                with open(f"/proc/{pid}/stat") as proc_stat:  # noqa: ASYNC230 - /proc, instant
                    state = proc_stat.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                state = "gone"
            if state in ("gone", "Z", "X"):
                break
            await asyncio.sleep(0.1)
        assert state in ("gone", "Z", "X"), f"pid {pid} still {state}"
    finally:
        area.close()


async def test_a_runaway_file_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A download tool cannot write a file past the cap: the write fails and the file stays
    within it (the host's disk is not filled by one hostile download)."""
    monkeypatch.setattr(fetch_runner, "FILE_MAX_BYTES", 1 << 20)
    area = FetchArea("harombe-probe-")
    try:
        work = area.new_dir("tool")
        _, out = await area.run(
            ["sh", "-c", "head -c 4194304 /dev/zero > home/big; echo rc=$?"],
            cwd=work,
            env={"PATH": os.defpath},
        )
        size = (work / "home" / "big").stat().st_size
    finally:
        area.close()
    assert size <= 1 << 20, (size, out)
    assert "rc=0" not in out


# --- the tar of a tree the download user wrote -------------------------------------------------


def tree_with(kind: str, root: Path, owner: int) -> None:
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "index.js").write_text("ok")
    os.chown(pkg / "index.js", owner, owner)
    if kind == "foreign-file":  # what a hard link to a host file looks like from root
        (pkg / "shadow").write_text("root only")
    elif kind == "fifo":
        os.mkfifo(pkg / "pipe")
    elif kind == "device":
        os.mknod(pkg / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "hardlink":
        os.link(pkg / "index.js", pkg / "again.js")
    for p in pkg.rglob("*"):
        if kind != "foreign-file":
            os.chown(p, owner, owner, follow_symlinks=False)


@AS_ROOT
@pytest.mark.parametrize("kind", ["foreign-file", "fifo", "device", "hardlink"])
def test_tar_refuses_what_the_tool_did_not_write(tmp_path: Path, kind: str) -> None:
    """Only the download user's own files, directories and symlinks leave the host: a file of
    root's (a hard link to a host file), a FIFO, a device or a hard link is refused."""
    tree_with(kind, tmp_path, 65534)
    with pytest.raises(PackageFetchError, match="not a file the download tool"):
        packages._tar([tmp_path / "pkg"], 65534)


def test_tar_keeps_symlinks_as_links(tmp_path: Path) -> None:
    """A symlink to a host file is stored as a link, never its target's content."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "leak").symlink_to("/etc/passwd")
    archive = packages._tar([pkg], os.geteuid())
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.getmember("pkg/leak")
        assert member.issym() and member.size == 0
    assert b"root:" not in archive and b"root:" not in tarfile_bytes(archive)


def tarfile_bytes(archive: bytes) -> bytes:
    import gzip

    return gzip.decompress(archive)


def test_tar_of_a_huge_tree_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree past the member cap (10,000 packages) is refused, not copied into memory."""
    monkeypatch.setattr(packages, "TAR_MAX_MEMBERS", 20)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for i in range(40):
        (pkg / f"f{i}").write_text("x")
    with pytest.raises(PackageFetchError, match="more than 20 files"):
        packages._tar([pkg], os.geteuid())


# --- wheels read as data ------------------------------------------------------------------------


def zip_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


META = b"Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
BAD_WHEELS: dict[str, dict[str, bytes]] = {
    "sdist-named-as-wheel": {"setup.py": b"import os; os.system('touch /tmp/x')",
                             "PKG-INFO": META},
    "two-dist-info": {"evil-1.0.dist-info/METADATA": META,
                      "other-1.0.dist-info/METADATA": META + b"Requires-Dist: x @ http://h/x\n"},
    "metadata-bomb": {"evil-1.0.dist-info/METADATA": META + b"X: " + b"0" * (8 << 20)},
    "metadata-nested-only": {"evil/evil-1.0.dist-info/METADATA": META},
    "url-requirement": {"evil-1.0.dist-info/METADATA": META + b"Requires-Dist: p@http://h/p\n"},
    "vcs-under-false-marker": {"evil-1.0.dist-info/METADATA": META
                               + b"Requires-Dist: p @ git+https://h/p ; python_version<'2'\n"},
    "file-url-under-extra": {"evil-1.0.dist-info/METADATA": META
                             + b"Requires-Dist: p @ file:///etc ; extra == 'x'\n"},
    "folded-url-header": {"evil-1.0.dist-info/METADATA": META
                          + b"Requires-Dist: p\n  @ https://h/p.tar.gz\n"},
    "unreadable-requirement": {"evil-1.0.dist-info/METADATA": META
                               + b"Requires-Dist: p (>=1) @ https://h/p\n"},
}  # fmt: skip


@pytest.mark.parametrize("members", BAD_WHEELS.values(), ids=BAD_WHEELS.keys())
def test_lying_wheels_are_refused(tmp_path: Path, members: dict[str, bytes]) -> None:
    """A file named like a wheel that is not one, hides a second METADATA, bombs, or declares a
    URL/VCS/path dependency under any marker is refused before anything else happens."""
    dest = tmp_path / "wheels"
    dest.mkdir()
    (dest / "evil-1.0-py3-none-any.whl").write_bytes(zip_of(members))
    with pytest.raises((PackageFetchError, PackageSpecError)):
        wheel_data.collect_wheels(dest, "evil")


DEST_PLANTS: dict[str, Callable[[Path], object]] = {
    "symlink-wheel": lambda d: (d / "evil-1.0-py3-none-any.whl").symlink_to("/etc/passwd"),
    "hardlinked-wheel": lambda d: os.link(d.parent / "ok.bin", d / "evil-1.0-py3-none-any.whl"),
    "setup-py-beside": lambda d: (d / "setup.py").write_text("print('hi')"),
    "fifo-wheel": lambda d: os.mkfifo(d / "evil-1.0-py3-none-any.whl"),
}


@pytest.mark.parametrize("plant", DEST_PLANTS.values(), ids=DEST_PLANTS.keys())
def test_odd_entries_in_the_download_dir_are_refused(
    tmp_path: Path, plant: Callable[[Path], object]
) -> None:
    """Whatever else a download leaves (link, hard link, FIFO, non-wheel) is refused unread."""
    dest = tmp_path / "wheels"
    dest.mkdir()
    (tmp_path / "ok.bin").write_bytes(zip_of({"evil-1.0.dist-info/METADATA": META}))
    plant(dest)
    with pytest.raises(PackageFetchError):
        wheel_data.collect_wheels(dest, "evil")


def test_a_central_directory_bomb_is_refused_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel whose zip has more members than the cap is refused before its central
    directory is parsed (millions of entries would exhaust root's memory)."""
    monkeypatch.setattr(wheel_data, "ZIP_MAX_MEMBERS", 100)
    dest = tmp_path / "wheels"
    dest.mkdir()
    members = {f"evil/{i}.py": b"" for i in range(500)}
    members["evil-1.0.dist-info/METADATA"] = META
    (dest / "evil-1.0-py3-none-any.whl").write_bytes(zip_of(members))
    with pytest.raises(PackageFetchError, match="over 100 members"):
        wheel_data.collect_wheels(dest, "evil")


#: Bodies of a stand-in ``pip`` run under the guard, and what its output must show.
GUARD_PROBES = {
    "memory-capped": ("b = bytearray(6 << 30); print('ALLOC' + 'ATED')", "MemoryError"),
    "host-file-unreadable": ("open({world!r} + '/secret').read(); print('RE' + 'AD')",
                             "harombe-guard-refused"),
    "os-system": ("import os; os.system('true'); print('SPAW' + 'NED')", "harombe-guard-refused"),
    "subprocess": ("import subprocess; subprocess.run(['true']); print('SPAW' + 'NED')",
                   "harombe-guard-refused"),
    "import-setuptools": ("import setuptools; print('IMPOR' + 'TED')", "harombe-guard-refused"),
    "cwd-module-shadowing": ("import json; print('SHADO' + 'WED' if 'PLANTED' in "
                             "open(json.__file__).read() else 'clean')", "clean"),
    "sitecustomize-in-cwd": ("import sys; print('SHADO' + 'WED' if 'sitecustomize' in sys.modules "
                             "else 'clean')", "clean"),
    "pythonpath-ignored": ("import sys; print('SHADO' + 'WED' if any('planted' in p for p in "
                           "sys.path) else 'clean')", "clean"),
}  # fmt: skip


@AS_ROOT
@pytest.mark.parametrize("probe", GUARD_PROBES.values(), ids=GUARD_PROBES.keys())
async def test_the_pip_guard_holds_whatever_pip_does(
    world: Path, marker: Path, probe: tuple[str, str]
) -> None:
    """The guard around pip, tried with a stand-in pip: no program starts, no build tool
    imports, no host file outside its sources is read, memory is capped, and nothing planted
    in the work directory (modules, sitecustomize, PYTHONPATH) is imported."""
    body, expected = probe
    (world / "secret").write_text("host secret")
    (world / "secret").chmod(0o644)
    fake = world / "fakepip" / "pip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(body.format(world=str(world)) + "\n")
    for path in (world / "fakepip", fake, *fake.iterdir()):
        path.chmod(0o755)
    area = FetchArea("harombe-probe-")
    try:
        work = area.new_dir("pip")
        (work / "json.py").write_text("PLANTED = 1\n")
        (work / "sitecustomize.py").write_text("PLANTED = 1\n")
        (work / "evil.pth").write_text("import os; os.system('touch /tmp/x')\n")
        env = {"PATH": os.defpath, "PYTHONPATH": str(work / "planted"), "PYTHONSTARTUP": "x"}
        code, out = await area.run(
            ["/usr/bin/python3", "-I", "-S", "-c", pypi_fetch.PIP_GUARD, str(world / "fakepip")],
            cwd=work,
            env=env,
            give=("json.py", "sitecustomize.py"),
        )
    finally:
        area.close()
    assert expected in out, (code, out)
    for leak in ("ALLOCATED", "READ", "SPAWNED", "IMPORTED", "SHADOWED"):
        assert leak not in out, out
    assert not ran(marker)


# --- a malicious index, end to end -----------------------------------------------------------


def page(index: Index, project: str, anchors: list[str]) -> None:
    body = "<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n"
    index.routes[f"/simple/{project}/"] = ("text/html", body.encode())


def serve(index: Index, filename: str, data: bytes) -> str:
    index.routes[f"/files/{filename}"] = ("application/zip", data)
    return f"/files/{filename}#sha256={hashlib.sha256(data).hexdigest()}"


async def test_pep658_metadata_cannot_hide_a_url_dependency(index: Index, marker: Path) -> None:
    """The index serves clean PEP 658 metadata for a wheel whose own METADATA names a URL
    dependency: harombe reads the wheel it will install, and refuses."""
    evil = wheel("evil", "1.0", [f"payload @ {index.url}/payload/payload-1.0.tar.gz"])
    clean = META
    href = serve(index, "evil-1.0-py3-none-any.whl", evil)
    index.routes["/files/evil-1.0-py3-none-any.whl.metadata"] = ("text/plain", clean)
    digest = hashlib.sha256(clean).hexdigest()
    page(
        index,
        "evil",
        [
            f'<a href="{href}" data-dist-info-metadata="sha256={digest}" '
            f'data-core-metadata="sha256={digest}">evil-1.0-py3-none-any.whl</a>'
        ],
    )
    with pytest.raises((PackageSpecError, PackageFetchError)):
        await packages.fetch_pypi(packages.parse_spec("evil", "pypi"), **TARGET)
    assert index.payload_requests() == [] and not ran(marker)


async def test_a_zip_with_setup_py_named_as_a_wheel_never_runs(index: Index, marker: Path) -> None:
    """``evil-1.0-py3-none-any.whl`` that is a source tree (setup.py writing a marker): pip
    only saves it, harombe refuses it, nothing runs."""
    data = zip_of({"setup.py": f"open({str(marker)!r}, 'w')".encode(), "PKG-INFO": META})
    publish(index, {"evil-1.0-py3-none-any.whl": data})
    with pytest.raises(PackageFetchError):
        await packages.fetch_pypi(packages.parse_spec("evil", "pypi"), **TARGET)
    assert not ran(marker)


async def test_an_index_link_to_a_host_file_is_not_copied(
    index: Index, world: Path, marker: Path
) -> None:
    """An index page linking a ``file:`` URL on the host (a wheel-named file the download user
    could read): the host file never ends up in the archive for the sandbox."""
    secret = world / "evil-1.0-py3-none-any.whl"
    secret.write_bytes(wheel("evil", "1.0", []) + b"HOSTSECRET")
    secret.chmod(0o644)
    page(index, "evil", [f'<a href="file://{secret}">evil-1.0-py3-none-any.whl</a>'])
    try:
        archive = await packages.fetch_pypi(packages.parse_spec("evil", "pypi"), **TARGET)
    except (PackageFetchError, PackageSpecError):
        return
    assert b"HOSTSECRET" not in tarfile_bytes(archive)


ANCHOR_TRICKS = {
    "egg-fragment": '<a href="{href}&egg=payload @ {url}/payload/payload-1.0.tar.gz">{n}</a>',
    "requires-python-quote": '<a href="{href}" data-requires-python="&gt;=3&quot; x=&quot;">{n}'
                             "</a>",
    "second-anchor-to-sdist": '<a href="{href}">{n}</a><a href="{url}/payload/payload-1.0.tar.gz'
                              '">evil-9.0.tar.gz</a>',
}  # fmt: skip


@pytest.mark.parametrize("anchor", ANCHOR_TRICKS.values(), ids=ANCHOR_TRICKS.keys())
async def test_index_html_tricks_fetch_only_the_wheel(
    index: Index, marker: Path, anchor: str
) -> None:
    """Fragments and attributes in the index's HTML do not make pip fetch or build anything
    else: the archive holds the wheel alone, and the payload is never requested."""
    name = "evil-1.0-py3-none-any.whl"
    href = serve(index, name, wheel("evil", "1.0", []))
    page(index, "evil", [anchor.format(href=href, url=index.url, n=name)])
    try:
        archive = await packages.fetch_pypi(packages.parse_spec("evil", "pypi"), **TARGET)
    except PackageFetchError:
        archive = b""
    if archive:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert tar.getnames() == [name]
    assert index.payload_requests() == [] and not ran(marker)


async def test_a_ten_thousand_package_tree_is_refused_before_fetching(index: Index) -> None:
    """A wheel declaring 10,000 dependencies is refused at the distribution cap before pip is
    asked for any of them."""
    deps = [f"dep{i}" for i in range(10_000)]
    publish(index, {"wide-1.0-py3-none-any.whl": wheel("wide", "1.0", deps)})
    with pytest.raises(PackageFetchError, match="more than"):
        await packages.fetch_pypi(packages.parse_spec("wide", "pypi"), **TARGET)
    assert not [p for p in index.requested if p.startswith("/simple/dep")]


async def test_the_total_download_is_capped(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wheels past the per-install byte cap are refused instead of being copied on."""
    monkeypatch.setattr(pypi_fetch, "DOWNLOAD_MAX_BYTES", 1000)
    publish(index, {"big-1.0-py3-none-any.whl": wheel("big", "1.0", []) + b"\0" * 4000})
    with pytest.raises(PackageFetchError, match="exceed"):
        await packages.fetch_pypi(packages.parse_spec("big", "pypi"), **TARGET)


async def test_two_installs_at_once_stay_apart(index: Index) -> None:
    """Two downloads at the same time each get their own private area and their own wheels."""
    publish(index, {"one-1.0-py3-none-any.whl": wheel("one", "1.0", []),
                    "two-1.0-py3-none-any.whl": wheel("two", "1.0", [])})  # fmt: skip
    first, second = await asyncio.gather(
        packages.fetch_pypi(packages.parse_spec("one", "pypi"), **TARGET),
        packages.fetch_pypi(packages.parse_spec("two", "pypi"), **TARGET),
    )
    for archive, name in ((first, "one"), (second, "two")):
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert tar.getnames() == [f"{name}-1.0-py3-none-any.whl"]


# --- npm ---------------------------------------------------------------------------------------


async def test_npm_ci_installs_the_checked_lockfile_unchangeable(
    index: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check and ``npm ci`` the lockfile is a new file of root's that the download
    user can only read: nothing can swap its content after it was checked."""
    npm_publish(index, "leftpad", "1.0.0", {})
    seen: list[os.stat_result] = []
    real = FetchArea.run

    async def spy(self: FetchArea, argv: list[str], **kw: Any) -> tuple[int, str]:
        if "ci" in argv:
            seen.append(os.lstat(kw["cwd"] / "package-lock.json"))
        return await real(self, argv, **kw)

    monkeypatch.setattr(FetchArea, "run", spy)
    archive, _ = await packages.fetch_npm(packages.parse_spec("leftpad@1.0.0", "npm"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert "leftpad/package.json" in tar.getnames()
    assert len(seen) == 1 and stat.S_ISREG(seen[0].st_mode)
    assert seen[0].st_uid == os.geteuid() and stat.S_IMODE(seen[0].st_mode) == 0o644


def hostile_npm_tarball(name: str, escape: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add(tarfile.TarInfo("package/package.json"),
            json.dumps({"name": name, "version": "1.0.0"}).encode())  # fmt: skip
        add(tarfile.TarInfo(f"package/../../../../../../..{escape}/dotdot"), b"x")
        add(tarfile.TarInfo(f"{escape}/absolute"), b"x")
        link = tarfile.TarInfo("package/shadow")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        add(link)
        hard = tarfile.TarInfo("package/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/shadow"
        add(hard)
        rc = tarfile.TarInfo("package/.npmrc")
        add(rc, f"registry=http://127.0.0.1:9/\nprefix={escape}\n".encode())
    return buf.getvalue()


async def test_hostile_npm_tarball_stays_in_its_directory(index: Index, world: Path) -> None:
    """A registry tarball with ``../`` and absolute members, a symlink and a hard link to
    /etc/shadow and its own .npmrc: nothing lands outside, no host file's content is copied."""
    escape = world / "out"
    escape.mkdir()
    escape.chmod(0o777)
    npm_publish(index, "hostile", "1.0.0", {})
    data = hostile_npm_tarball("hostile", escape)
    path = "/hostile/-/hostile-1.0.0.tgz"
    index.routes[path] = ("application/octet-stream", data)
    doc = json.loads(index.routes["/hostile"][1])
    import base64

    dist = doc["versions"]["1.0.0"]["dist"]
    dist["integrity"] = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    dist["shasum"] = hashlib.sha1(data).hexdigest()
    index.routes["/hostile"] = ("application/json", json.dumps(doc).encode())
    try:
        archive, _ = await packages.fetch_npm(packages.parse_spec("hostile@1.0.0", "npm"))
    except PackageFetchError:
        archive = b""
    assert list(escape.iterdir()) == []
    if archive:
        shadow = await asyncio.to_thread(Path("/etc/shadow").read_bytes)
        assert shadow[:32] not in tarfile_bytes(archive)


def _swap_logs_dir(logs: Path, secret: Path) -> None:
    logs.rmdir()
    logs.symlink_to(secret.parent, target_is_directory=True)


LOG_PLANTS: dict[str, Callable[[Path, Path], object]] = {
    "log-symlink-to-secret": lambda logs, secret: (logs / "x.log").symlink_to(secret),
    "logs-dir-symlink": _swap_logs_dir,
    "log-fifo": lambda logs, secret: os.mkfifo(logs / "x.log"),
}


@pytest.mark.parametrize("plant", LOG_PLANTS.values(), ids=LOG_PLANTS.keys())
async def test_npm_logs_are_read_without_following_links(
    tmp_path: Path, plant: Callable[[Path, Path], object]
) -> None:
    """npm's debug logs (written by the download user) are read for the refusal message
    without following a planted link to a host secret and without blocking on a FIFO."""
    secret = tmp_path / "secret" / "s.log"
    secret.parent.mkdir()
    secret.write_text("placeDep ROOT SECRETLEAK@1 OK for: x want: file:/etc/SECRETLEAK\n")
    logs = tmp_path / "home" / "cache" / "_logs"
    logs.mkdir(parents=True)
    plant(logs, secret)
    found = await asyncio.wait_for(asyncio.to_thread(npm_fetch._offender, "EALLOWFILE", logs), 30)
    assert found is None or "SECRETLEAK" not in found


# --- the in-sandbox untar against a hostile home ------------------------------------------------


@pytest.fixture(scope="module")
async def box(tools: CodeExecutionTools) -> AsyncIterator[str]:
    result = await tools.code_execute(language="shell", code="true")
    assert result["success"], result
    yield str(result["sandbox_id"])
    await tools.code_destroy_sandbox(result["sandbox_id"])


def small_tar(members: dict[str, bytes | tuple[str, str]], mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(body, tuple):
                info.type = tarfile.SYMTYPE if body[0] == "sym" else tarfile.LNKTYPE
                info.linkname = body[1]
                tar.addfile(info)
            else:
                info.size, info.mode = len(body), mode
                tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


async def sh(
    tools: CodeExecutionTools, sid: str, code: str, *, timeout_s: float | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = await tools.code_execute(
        language="shell", code=code, sandbox_id=sid, timeout=timeout_s
    )
    return result


#: (setup run as the sandbox user with $P = a fresh probe dir, untar root under $HOME, members)
UNTAR_ATTACKS: dict[str, tuple[str, str, dict[str, bytes | tuple[str, str]]]] = {
    "root-is-symlink-to-tmp": ("ln -s $P $HOME/{id}", "{id}", {"pkg/index.js": b"x"}),
    "root-is-symlink-to-proc-self": ("ln -s /proc/self $HOME/{id}", "{id}", {"fd/9": b"x"}),
    "parent-of-root-is-symlink": ("ln -s $P $HOME/{id}", "{id}/sub", {"a": b"x"}),
    "member-dir-is-symlink": ("mkdir -p $HOME/{id} && ln -s $P $HOME/{id}/pkg", "{id}",
                              {"pkg/index.js": b"x"}),
    "deep-member-dir-is-symlink": ("mkdir -p $HOME/{id}/a && ln -s $P $HOME/{id}/a/b", "{id}",
                                   {"a/b/c/d.js": b"x"}),
    "member-file-is-symlink": ("mkdir -p $HOME/{id} && ln -s $P/v $HOME/{id}/.package-lock.json",
                               "{id}", {".package-lock.json": b"x"}),
    "member-dotdot": ("mkdir -p $HOME/{id}", "{id}", {"../../../tmp/{id}/v": b"x"}),
    "member-absolute-symlink": ("mkdir -p $HOME/{id}", "{id}", {"l": ("sym", "/tmp/{id}/v")}),
    "member-symlink-escapes": ("mkdir -p $HOME/{id}", "{id}", {"l": ("sym", "../../../tmp/x")}),
    "member-hardlink": ("mkdir -p $HOME/{id}", "{id}", {"h": ("hard", "/tmp/{id}/v")}),
    "symlink-then-file-through-it": ("mkdir -p $HOME/{id}", "{id}",
                                     {"d": ("sym", "e"), "e/.keep": b"", "d/v": b"x"}),
}  # fmt: skip


@pytest.mark.parametrize("attack", UNTAR_ATTACKS.values(), ids=UNTAR_ATTACKS.keys())
async def test_untar_never_follows_planted_links(
    tools: CodeExecutionTools,
    sandbox_manager: SandboxManager,
    box: str,
    attack: tuple[str, str, dict[str, bytes | tuple[str, str]]],
    request: pytest.FixtureRequest,
) -> None:
    """User code plants symlinks where an install unpacks: the unpack is refused (or replaces
    the link itself), and nothing changes in the directory the links point to."""
    probe = request.node.callspec.id
    setup, root, members = attack
    made = await sh(tools, box, f"P=/tmp/{probe}; mkdir -p $P && echo orig > $P/v && "
                                 + setup.format(id=probe))  # fmt: skip
    assert made["exit_code"] == 0, made
    archive = small_tar({k.format(id=probe): (v if isinstance(v, bytes) else
                         (v[0], v[1].format(id=probe))) for k, v in members.items()})  # fmt: skip
    sandbox = sandbox_manager.get(box)
    try:
        await asyncio.wait_for(
            sandbox_manager.files.untar(sandbox, archive, root=f"{HOME}/{root.format(id=probe)}"),
            60,
        )
    except Exception as exc:  # noqa: BLE001 - a refusal is the held outcome; which kind is not
        assert "not allowed" in str(exc) or "symbolic link" in str(exc) or "Error" in str(exc)
    after = await sh(tools, box, f"cd /tmp/{probe} && ls -A && cat v")
    assert after["stdout"] == "v\norig\n", after
    alive = await sh(tools, box, "echo alive")
    assert alive["stdout"].strip() == "alive"


async def test_untar_strips_setuid_and_keeps_modes_sane(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, box: str
) -> None:
    """A member with setuid/setgid/sticky and world-write bits is written 0755 at most."""
    archive = small_tar({"tool": b"#!/bin/sh\n"}, mode=0o7777)
    await sandbox_manager.files.untar(sandbox_manager.get(box), archive, root=f"{HOME}/modes")
    result = await sh(tools, box, f"stat -c %a {HOME}/modes/tool")
    assert result["stdout"].strip() == "755", result


async def test_untar_racing_a_symlink_swap(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, box: str
) -> None:
    """A background process flips ``pkg`` between a directory and a symlink to /tmp while
    archives unpack: every unpack lands inside its root or is refused, /tmp is untouched."""
    made = await sh(tools, box, "mkdir -p /tmp/race/inner $HOME/race && echo orig > /tmp/race/v")
    assert made["exit_code"] == 0, made
    flipper = asyncio.ensure_future(sh(tools, box, (
        "cd $HOME/race && for i in $(seq 60); do mkdir pkg; mv -T pkg d; "
        "ln -sT /tmp/race/inner pkg; rm -f pkg; rm -rf d; done >/dev/null 2>&1; echo flipped"
    ), timeout_s=300))  # fmt: skip  (unpacks compete with it: on a busy machine it takes 30 s)
    archive = small_tar({"pkg/index.js": b"x", "pkg/v": b"pwned"})
    sandbox = sandbox_manager.get(box)
    unpacked = 0
    for _ in range(200):
        if flipper.done():
            break
        try:
            await asyncio.wait_for(
                sandbox_manager.files.untar(sandbox, archive, root=f"{HOME}/race"), 60
            )
            unpacked += 1
        except Exception:  # noqa: BLE001 - a refusal under the race is a held outcome
            continue
    flipped = await flipper
    assert flipped["stdout"].strip() == "flipped", flipped
    after = await sh(tools, box, "ls -A /tmp/race /tmp/race/inner; cat /tmp/race/v")
    assert after["stdout"] == "/tmp/race:\ninner\nv\n\n/tmp/race/inner:\norig\n", (after, unpacked)


# --- the file API from inside: modes, odd names, races on the temporary file -----------------


async def request(
    sandbox_manager: SandboxManager, sid: str, msg: dict[str, Any], blob: bytes = b""
) -> dict[str, Any]:
    """A raw file request to the supervisor; an error comes back as data."""
    try:
        reply, _ = await asyncio.wait_for(
            sandbox_manager.files.request(sandbox_manager.get(sid), msg, blob), 60
        )
    except Exception as exc:  # noqa: BLE001 - the refusal is the probe's data
        return {"ok": False, "error": str(exc)}
    return reply


MODE_PROBES = {
    "new-file-setuid-requested": ("", 0o7777),
    "replacing-a-setuid-file": ("echo old > f && chmod 6755 f", 0o644),
}


@pytest.mark.parametrize("probe", MODE_PROBES.values(), ids=MODE_PROBES.keys())
async def test_writes_never_leave_setuid_bits(
    tools: CodeExecutionTools,
    sandbox_manager: SandboxManager,
    box: str,
    probe: tuple[str, int],
    request_id: str,
) -> None:
    """Neither a requested mode nor the mode of a replaced file can give the written file
    setuid, setgid or sticky bits."""
    setup, mode = probe
    made = await sh(tools, box, f"mkdir -p /workspace/{request_id} && cd /workspace/{request_id}"
                                f" && {setup or 'true'}")  # fmt: skip
    assert made["exit_code"] == 0, made
    reply = await request(sandbox_manager, box, {"op": "write", "root": "/workspace",
                          "path": f"{request_id}/f", "mode": mode}, b"new")  # fmt: skip
    assert reply.get("ok"), reply
    after = await sh(tools, box, f"stat -c %a /workspace/{request_id}/f")
    assert int(after["stdout"].strip(), 8) & 0o7000 == 0, after


@pytest.fixture
def request_id(request: pytest.FixtureRequest) -> str:
    return "p" + hashlib.sha1(request.node.name.encode()).hexdigest()[:10]


async def test_write_into_a_read_only_directory_leaves_nothing(
    tools: CodeExecutionTools, box: str, request_id: str
) -> None:
    """A directory the user cannot write: the write is refused with a clear error and leaves
    no temporary file behind."""
    await sh(tools, box, f"mkdir -p /workspace/{request_id}/ro && chmod 555 "
                         f"/workspace/{request_id}/ro")  # fmt: skip
    result = await tools.code_write_file(
        sandbox_id=box, file_path=f"{request_id}/ro/f.txt", content="x"
    )
    assert result["success"] is False and "ermission" in str(result), result
    listing = await sh(tools, box, f"ls -A /workspace/{request_id}/ro")
    assert listing["stdout"] == "", listing


async def test_names_with_newlines_round_trip(
    tools: CodeExecutionTools, box: str, request_id: str
) -> None:
    """A name with a newline is written as that one name and listed as valid text."""
    name = f"{request_id}/a\nb.txt"
    written = await tools.code_write_file(sandbox_id=box, file_path=name, content="nl")
    if not written["success"]:  # refusing such a name is also held, if it says why
        assert "path" in str(written).lower(), written
        return
    listing = await tools.code_list_files(sandbox_id=box, path=request_id)
    names = [e["name"] for e in listing["files"]] if "files" in listing else str(listing)
    assert "a\nb.txt" in names, listing
    read = await tools.code_read_file(sandbox_id=box, file_path=name)
    assert read["content"] == "nl", read


async def test_listing_a_directory_being_filled(
    tools: CodeExecutionTools, box: str, request_id: str
) -> None:
    """Listings of a directory another process fills meanwhile all come back, capped and
    consistent (``total`` at least the entries returned)."""
    filler = asyncio.ensure_future(sh(tools, box, (
        f"mkdir -p /workspace/{request_id} && cd /workspace/{request_id} && "
        "for i in $(seq 400); do : > f$i; done; echo filled"
    )))  # fmt: skip
    seen = 0
    while not filler.done() and seen < 200:
        listing = await asyncio.wait_for(tools.code_list_files(sandbox_id=box, path=request_id), 60)
        seen += 1
        if listing.get("success") and "files" in listing:
            assert listing.get("total", len(listing["files"])) >= len(listing["files"])
    assert (await filler)["stdout"].strip() == "filled"


async def test_temp_file_hijack_cannot_write_out(
    tools: CodeExecutionTools, box: str, request_id: str
) -> None:
    """A process replacing every temporary write file it sees with a symlink to /tmp while
    writes run: the file behind the link is never written."""
    await sh(tools, box, f"mkdir -p /tmp/{request_id} /workspace/{request_id} && "
                         f"echo orig > /tmp/{request_id}/v")  # fmt: skip
    hijacker = asyncio.ensure_future(sh(tools, box, (
        f"cd /workspace/{request_id} && for i in $(seq 300); do for t in .harombe-write-*; do "
        f"[ -e \"$t\" ] && ln -sfn /tmp/{request_id}/v \"$t\"; done; done 2>/dev/null; echo done"
    )))  # fmt: skip
    writes = 0
    while not hijacker.done() and writes < 100:
        await asyncio.wait_for(tools.code_write_file(
            sandbox_id=box, file_path=f"{request_id}/f.txt", content="pwned"), 60)  # fmt: skip
        writes += 1
    await hijacker
    after = await sh(tools, box, f"cat /tmp/{request_id}/v")
    assert after["stdout"] == "orig\n", (after, writes)

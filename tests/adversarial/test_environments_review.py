"""Adversarial review of the install cache and dependency environments (no Docker): crafted
wheels, compiler bombs, concurrent and cross-process use of one cache, eviction races, odd
inputs, and the session worker's ``.pth`` pickup — with local wheels made here."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from harombe.config_environments import EnvironmentConfig
from harombe.errors import HarombeError, InvalidArgumentError, PackageFetchError, PackageSpecError
from harombe.security.runtime import environments
from harombe.security.runtime.environment_sandboxes import Environments
from harombe.security.runtime.environments import (
    Environment,
    EnvironmentStore,
    environment_key,
)
from harombe.security.runtime.packages.wheels import Target, Wheel
from tests.unit.test_environments import TARGET, make_wheel

REPO = Path(__file__).resolve().parents[2]

HOUR_S = 3600.0


def new_store(tmp_path: Path, *, max_mb: int = 64, name: str = "cache") -> EnvironmentStore:
    made = EnvironmentStore(tmp_path / name, max_mb=max_mb, resolve_ttl_s=3600)
    made.open()
    return made


def build(store: EnvironmentStore, wheels: list[Wheel]) -> Environment:
    hashed = [(w, environments.sha256_of(w.path)) for w in wheels]
    key = environment_key([(w.path.name, h) for w, h in hashed], TARGET)
    env = store._build(key, hashed, ("x",), TARGET)
    store.holds.unhold(env.key)  # no sandbox links it
    return env


def tree(path: Path) -> list[str]:
    """Every entry below ``path`` (relative), sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def rewrite(path: Path, change: Any) -> None:
    """Rewrite the zip at ``path`` with each member's ZipInfo passed through ``change``."""
    with zipfile.ZipFile(path) as archive:
        items = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in items:
            change(info)
            archive.writestr(info, data)


def patch_headers(path: Path, *, method: int | None = None, flag: int = 0) -> None:
    """Set every member's compression method and OR ``flag`` into its flags, in both the local
    headers and the central directory (what a hand-made zip can claim)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        offsets = [info.header_offset for info in archive.infolist()]
    for at in offsets:
        data[at + 6] |= flag
        if method is not None:
            data[at + 8 : at + 10] = struct.pack("<H", method)
    at = data.find(b"PK\x01\x02")
    while at != -1:
        data[at + 8] |= flag
        if method is not None:
            data[at + 10 : at + 12] = struct.pack("<H", method)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def corrupt_deflate(path: Path, member: str) -> None:
    """Deflate every member, then flip the bytes of ``member``'s compressed stream (its CRC and
    sizes stay as they were)."""

    def deflate(info: zipfile.ZipInfo) -> None:
        info.compress_type = zipfile.ZIP_DEFLATED

    rewrite(path, deflate)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    at = info.header_offset
    start = at + 30 + sum(struct.unpack("<HH", data[at + 26 : at + 30]))  # name, extra lengths
    for i in range(start, start + info.compress_size):
        data[i] ^= 0x55
    path.write_bytes(bytes(data))


# -- crafted wheels -------------------------------------------------------------------------


def _traversal(d: Path) -> Wheel:
    return make_wheel(d, files={"tinypkg/__init__.py": b"", "../../../escaped.py": b"x"})


def _absolute(d: Path) -> Wheel:
    return make_wheel(d, files={"tinypkg/__init__.py": b"", f"{d}/abs-escaped.py": b"x"})


def _data_traversal(d: Path) -> Wheel:
    return make_wheel(d, files={"tinypkg/__init__.py": b"",
                                "tinypkg-1.0.data/data/../../../escaped.py": b"x"})  # fmt: skip


def _unsupported_method(d: Path) -> Wheel:
    wheel = make_wheel(d)
    patch_headers(wheel.path, method=99)
    return wheel


def _encrypted(d: Path) -> Wheel:
    wheel = make_wheel(d)
    patch_headers(wheel.path, flag=0x1)
    return wheel


def _record_lies(d: Path) -> Wheel:
    return make_wheel(d, bad_hash=True)


def _unlisted_member(d: Path) -> Wheel:
    wheel = make_wheel(d)
    with zipfile.ZipFile(wheel.path, "a") as archive:
        archive.writestr("tinypkg/extra.py", b"UNLISTED = 1\n")
    return wheel


def _central_field(d: Path, at_offset: int, value: bytes) -> Wheel:
    """A wheel whose central-directory entry for its module has ``value`` at ``at_offset``
    (16: CRC-32, 24: uncompressed size) — what the archive claims, not what it holds."""
    wheel = make_wheel(d, files={"tinypkg/__init__.py": b"A = 1\n" * 1000})
    data = bytearray(wheel.path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        length = struct.unpack("<H", data[at + 28 : at + 30])[0]
        if data[at + 46 : at + 46 + length] == b"tinypkg/__init__.py":
            data[at + at_offset : at + at_offset + len(value)] = value
        at = data.find(b"PK\x01\x02", at + 4)
    wheel.path.write_bytes(bytes(data))
    return wheel


def _size_lie(d: Path) -> Wheel:
    return _central_field(d, 24, struct.pack("<I", 10))


def _crc_lie(d: Path) -> Wheel:
    return _central_field(d, 16, b"\0\0\0\0")


def _truncated(d: Path) -> Wheel:
    wheel = make_wheel(d, files={"tinypkg/__init__.py": b"A = 1\n" * 1000})
    wheel.path.write_bytes(wheel.path.read_bytes()[:2000])
    return wheel


def _not_a_zip(d: Path) -> Wheel:
    wheel = make_wheel(d)
    wheel.path.write_bytes(b"PK\x03\x04 not really a zip")
    return wheel


@pytest.mark.parametrize(
    "craft",
    [_traversal, _absolute, _data_traversal, _unsupported_method, _encrypted, _record_lies,
     _unlisted_member, _not_a_zip, _size_lie, _crc_lie, _truncated],
    ids=["dotdot-member", "absolute-member", "data-dotdot", "compression-99", "encrypted",
         "record-hash-lies", "member-not-in-record", "not-a-zip", "size-lie", "crc-lie",
         "truncated"],
)  # fmt: skip
def test_a_crafted_wheel_is_refused_without_debris(tmp_path: Path, craft: Any) -> None:
    """A wheel that escapes its directories, cannot be read, or lies in RECORD is refused with
    PackageFetchError naming it; nothing is published, staged or written outside."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = craft(wheels)
    store = new_store(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(PackageFetchError, match="tinypkg"):
        build(store, [wheel])
    assert os.listdir(store.envs) == [] and os.listdir(store.directory / "tmp") == []
    assert tree(tmp_path) == before


def test_a_corrupt_deflate_stream_is_a_package_fetch_error(tmp_path: Path) -> None:
    """A wheel whose compressed bytes are damaged is refused with PackageFetchError naming it
    (not a bare zlib.error), and leaves nothing behind."""
    wheel = make_wheel(tmp_path, files={"tinypkg/__init__.py": b"A = 1\n" * 1000})
    corrupt_deflate(wheel.path, "tinypkg/__init__.py")
    store = new_store(tmp_path)
    try:
        with pytest.raises(PackageFetchError, match="tinypkg"):
            build(store, [wheel])
    finally:
        assert os.listdir(store.envs) == [] and os.listdir(store.directory / "tmp") == []


def test_member_modes_are_normalised(tmp_path: Path) -> None:
    """Members claiming setuid, setgid, sticky, world-writable or symlink modes are published
    as plain files and directories of mode 0644/0755 at most."""

    def hostile(info: zipfile.ZipInfo) -> None:
        kind = stat.S_IFLNK if info.filename.endswith("__init__.py") else stat.S_IFREG
        info.external_attr = (kind | 0o7777) << 16

    wheel = make_wheel(tmp_path, files={"tinypkg/__init__.py": b"X = 1\n", "tinypkg/run": b"#!"})
    rewrite(wheel.path, hostile)
    env = build(new_store(tmp_path), [wheel])
    root = tmp_path / "cache" / "envs" / env.key
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        assert stat.S_ISDIR(mode) or stat.S_ISREG(mode), path
        assert stat.S_IMODE(mode) & ~0o755 == 0, (path, oct(mode))


def test_a_compiler_bomb_does_not_take_down_the_host(tmp_path: Path) -> None:
    """Modules made to exhaust the bytecode compiler (deep nesting, a huge literal) are parsed
    in a limited child: the build finishes in this process, those modules simply have no
    bytecode and the others do."""
    deep = b"x = " + b"(" * 200_000 + b"1" + b")" * 200_000 + b"\n"
    blocks = b"".join(b" " * i + b"if 1:\n" for i in range(200)) + b" " * 200 + b"pass\n"
    huge = b"x = [" + b"1," * 400_000 + b"]\n"
    wheel = make_wheel(tmp_path, files={
        "bomb/__init__.py": b"", "bomb/deep.py": deep, "bomb/blocks.py": blocks,
        "bomb/huge.py": huge, "bomb/zz_ok.py": b"Y = 1\n",
    })  # fmt: skip
    store = new_store(tmp_path)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}.0"
    hashed = [(wheel, environments.sha256_of(wheel.path))]
    target = Target(python=python, machine="x86_64", glibc="2.36")
    key = environment_key([(wheel.path.name, hashed[0][1])], target)
    env = store._build(key, hashed, ("bomb",), target)
    cache = store.envs / env.key / "site" / "bomb" / "__pycache__"
    compiled = sorted(p.name.split(".")[0] for p in cache.iterdir())
    assert "zz_ok" in compiled and "deep" not in compiled, compiled


# -- size limits, debris --------------------------------------------------------------------


def test_an_environment_larger_than_the_cache_is_refused(tmp_path: Path) -> None:
    """A set whose unpacked size exceeds the whole cache's max_mb is refused with
    PackageFetchError (each wheel is within the per-wheel limit), and is not published."""
    store = new_store(tmp_path, max_mb=1)
    wheels = [make_wheel(tmp_path, f"part{i}", files={f"part{i}/blob": os.urandom(700_000)})
              for i in range(3)]  # fmt: skip
    try:
        with pytest.raises(PackageFetchError, match="max_mb"):
            build(store, wheels)
    finally:
        store.evict()
        total = sum(p.stat().st_size for p in store.envs.rglob("*") if p.is_file())
        assert total <= store.max_bytes, total


def test_staging_left_by_a_dead_builder_is_cleaned(tmp_path: Path) -> None:
    """A staging tree (or an evicted tree) left in tmp/ by a process that died mid-build is
    removed when a store opens the cache; a live builder's staging is kept."""
    store = new_store(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    stale = store.directory / "tmp" / f"{'a' * 32}.{dead_pid}.1"
    (stale / "site").mkdir(parents=True)
    (stale / "site" / "big.bin").write_bytes(b"x" * 4096)
    evicted = store.directory / "tmp" / f"evicted-{'b' * 32}.2"
    evicted.mkdir()
    old = time.time() - 2 * HOUR_S
    for path in (stale, evicted):
        os.utime(path, (old, old))
    live = store.directory / "tmp" / f"{'c' * 32}.{os.getpid()}.3"
    live.mkdir()
    new_store(tmp_path).evict()
    assert sorted(os.listdir(store.directory / "tmp")) == [live.name]


# -- concurrency ----------------------------------------------------------------------------


class LocalStore(EnvironmentStore):
    """A store whose resolution returns local wheels (no network)."""

    def __init__(self, *args: Any, wheels: list[Wheel], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wheels = wheels
        self.resolved = 0

    async def _resolve(self, *_args: Any) -> list[Wheel]:
        self.resolved += 1
        await asyncio.sleep(0.05)
        return self.wheels


async def test_different_requests_of_one_set_publish_one_environment(tmp_path: Path) -> None:
    """Eight different requests that resolve to the same wheels, built at once under different
    locks: one environment, every caller gets it, nothing left in tmp/."""
    wheels = [make_wheel(tmp_path), make_wheel(tmp_path, "other", "2.0")]
    store = LocalStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600, wheels=wheels)
    store.open()
    envs = await asyncio.gather(
        *(store.ensure([f"tinypkg>={i}.0" if i else "tinypkg"], target=TARGET) for i in range(8))
    )
    assert store.resolved == 8 and len({e.key for e in envs}) == 1
    assert os.listdir(store.envs) == [envs[0].key]
    assert os.listdir(store.directory / "tmp") == []
    assert store.load(envs[0].key, reused=True) is not None


ENSURE_IN_A_PROCESS = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from tests.adversarial.test_environments_review import LocalStore
    from tests.unit.test_environments import TARGET, make_wheel
    from harombe.security.runtime.packages.wheels import Wheel
    from packaging.version import Version
    wheels = [Wheel(p.name.split("-")[0], Version("1.0"), p, ())
              for p in sorted(Path(sys.argv[3]).glob("*.whl"))]
    store = LocalStore(Path(sys.argv[2]), max_mb=64, resolve_ttl_s=3600, wheels=wheels)
    store.open()
    env = asyncio.run(store.ensure(["tinypkg"], target=TARGET))
    print(json.dumps([env.key, env.reused, store.resolved]))
    """
)


def test_two_processes_build_one_set_once(tmp_path: Path) -> None:
    """Two processes ensuring the same set at once: one resolves and builds, the other waits
    on the lock file and reuses it; one environment, nothing left in tmp/."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, files={"tinypkg/__init__.py": b"V = 1\n" * 20000})
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENSURE_IN_A_PROCESS, str(REPO), str(cache), str(wheels)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert len({key for key, _, _ in results}) == 1
    assert sorted(resolved for _, _, resolved in results) == [0, 1]
    assert os.listdir(cache / "envs") == [results[0][0]]
    assert os.listdir(cache / "tmp") == []


def _over_the_limit(tmp_path: Path) -> tuple[EnvironmentStore, EnvironmentStore, list[Wheel]]:
    """A builder and another process's store (max_mb 0: anything not used lately goes)."""
    builder = new_store(tmp_path)
    other = EnvironmentStore(tmp_path / "cache", max_mb=0, resolve_ttl_s=3600)
    return builder, other, [make_wheel(tmp_path, files={"tinypkg/d": b"z" * 4096})]


def test_eviction_in_another_process_cannot_remove_a_build_as_it_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process evicting between the publishing rename and the first touch does not take
    the new environment: the build returns it and it is still there."""
    builder, other, wheels = _over_the_limit(tmp_path)
    touch = builder.touch

    def evict_first(key: str) -> None:
        other.evict()  # the other process runs here
        touch(key)

    monkeypatch.setattr(builder, "touch", evict_first)
    env = build(builder, wheels)
    assert (builder.envs / env.key / "manifest.json").is_file()


async def test_a_reused_environment_is_not_evicted_under_its_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request answered from the cache while another process evicts (its environment last
    used long ago) returns an environment that exists, or builds it again."""
    _, other, wheels = _over_the_limit(tmp_path)
    store = LocalStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600, wheels=wheels)
    first = await store.ensure(["tinypkg"], target=TARGET)
    when = time.time() - 2 * HOUR_S
    os.utime(store.directory / "used" / first.key, (when, when))
    fresh = LocalStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600, wheels=wheels)
    load = fresh.load

    def load_then_evict(key: str, *, reused: bool) -> Environment | None:
        found = load(key, reused=reused)
        other.evict()  # the other process runs here
        return found

    monkeypatch.setattr(fresh, "load", load_then_evict)
    again = await fresh.ensure(["tinypkg"], target=TARGET)
    assert (fresh.envs / again.key / "site").is_dir()


def test_a_used_file_from_the_future_does_not_pin_forever(tmp_path: Path) -> None:
    """A used/ stamp in the future (clock skew, another host) does not crash evict() or pin
    its environment; the rest of the cache is evicted by age, first."""
    builder = new_store(tmp_path)
    envs = [build(builder, [make_wheel(tmp_path, f"f{i}")]) for i in range(2)]
    store = new_store(tmp_path, max_mb=0)  # anything no sandbox holds goes
    future, past = time.time() + 10 * HOUR_S, time.time() - 10 * HOUR_S
    os.utime(store.directory / "used" / envs[0].key, (future, future))
    os.utime(store.directory / "used" / envs[1].key, (past, past))
    assert store.evict() == [envs[1].key, envs[0].key]


# -- inputs ---------------------------------------------------------------------------------


class RecordingStore:
    """Stands in for the store: records what reached it."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def ensure(self, requirements: list[str], **_options: Any) -> Environment:
        self.asked.append(list(requirements))
        return Environment("0" * 32, tuple(requirements), (), 0, reused=True)


def registry() -> tuple[Environments, RecordingStore]:
    store = RecordingStore()
    installs: Any = type("Installs", (), {"store": store})()
    runs: Any = None
    configured = {"data": EnvironmentConfig(requirements=["pandas"])}
    return Environments(installs, runs, configured), store


@pytest.mark.parametrize(
    "requirement",
    ["--index-url=http://127.0.0.1:9/simple", "-r requirements.txt", "pkg @ http://127.0.0.1/p.whl",
     "git+http://127.0.0.1/repo", "../x", "/abs/path", "p\u00e4ndas", "a" * 100_000,
     "pandas; python_version > '3'", "pandas --pre", "pandas\n--extra-index-url x"],
    ids=["index-option", "requirements-file", "direct-url", "vcs", "relative-path",
         "absolute-path", "unicode-name", "huge", "marker", "trailing-option", "newline-option"],
)  # fmt: skip
async def test_only_registry_specs_reach_the_store(requirement: str) -> None:
    """Options, URLs, paths, markers and odd names in a requirement list are refused before
    anything is resolved."""
    environments_, store = registry()
    with pytest.raises(PackageSpecError):
        await environments_.ensure(["six", requirement], target=TARGET)
    assert store.asked == []


@pytest.mark.parametrize("environment", [123, 1.5, object()],
                         ids=["int", "float", "object"])  # fmt: skip
def test_an_environment_of_the_wrong_type_is_an_invalid_argument(environment: Any) -> None:
    """An environment that is neither a name nor a list is InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError, match="requirement strings"):
        registry()[0].requirements_of(environment)


@pytest.mark.parametrize("environment", [{"pandas": "2"}, {"six"}],
                         ids=["dict", "set"])  # fmt: skip
def test_a_mapping_or_set_is_not_a_requirement_list(environment: Any) -> None:
    """Only a list or tuple of strings is a requirement list: a dict's keys, a set's arbitrary
    order are refused."""
    with pytest.raises(HarombeError):
        registry()[0].requirements_of(environment)


@pytest.mark.parametrize(
    ("requirements", "preimport"),
    [("pandas", ()), (["pandas"], "pandas")],
    ids=["requirements-string", "preimport-string"],
)
def test_define_refuses_a_string_where_a_list_belongs(requirements: Any, preimport: Any) -> None:
    """define_environment('x', 'pandas') is refused, not defined as p, a, n, d, a, s."""
    with pytest.raises(InvalidArgumentError):
        registry()[0].define("x", requirements, preimport=preimport)


@pytest.mark.parametrize(
    "name",
    ["../x", "a/b", "A", "", "x" * 64, "data\n", "d\u0430ta", ".hidden"],
    ids=["dotdot", "slash", "upper", "empty", "too-long", "newline", "homoglyph", "leading-dot"],
)
def test_environment_names_are_plain(name: str) -> None:
    """Names with paths, capitals, control characters or look-alike letters are refused."""
    with pytest.raises(InvalidArgumentError, match="lowercase letters"):
        registry()[0].define(name, ["six"])


# -- the session worker's .pth pickup -------------------------------------------------------

PICKUP = textwrap.dedent(
    """
    import json, sys, types
    from harombe.security.guest import PY_WORKER_PARTS, load
    worker = load(PY_WORKER_PARTS, "harombe_worker_review")
    before = list(sys.path)
    worker._Interpreter._user_site_changed(types.SimpleNamespace(user_site=sys.argv[1]))
    print(json.dumps([p for p in sys.path if p not in before]))
    """
)


def pickup(user_site: Path, *, timeout_s: float = 60) -> list[str]:
    """What the worker adds to sys.path from ``user_site``; fails if it does not return."""
    argv = [sys.executable, "-c", PICKUP, str(user_site)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-2000:]
    added: list[str] = json.loads(done.stdout.splitlines()[-1])
    return added


def test_odd_pth_entries_are_skipped(tmp_path: Path) -> None:
    """A directory named like an environment's .pth, one not UTF-8 and a 10 MB one-line .pth
    (read only to its first 4096 bytes, and not an environment's path) are skipped; a good one
    is still added."""
    (tmp_path / "harombe-env-dir.pth").mkdir()
    (tmp_path / "harombe-env-big.pth").write_bytes(b"/opt/harombe/envs/" + b"a" * (10 << 20))
    (tmp_path / "harombe-env-bin.pth").write_bytes(b"\xff\xfe/opt/harombe/envs/x\n")
    (tmp_path / "harombe-env-good.pth").write_text("/opt/harombe/envs/" + "e" * 32 + "/site\n")
    added = pickup(tmp_path)
    assert added == ["/opt/harombe/envs/" + "e" * 32 + "/site"]


def test_thousands_of_pth_files_are_read_once(tmp_path: Path) -> None:
    """Three thousand environment .pth files: the pickup returns with each path added once."""
    for i in range(3000):
        (tmp_path / f"harombe-env-{i:032x}.pth").write_text(f"/opt/harombe/envs/{i:032x}/site\n")
    (tmp_path / "harombe-env-dup.pth").write_text(f"/opt/harombe/envs/{0:032x}/site\n")
    assert len(pickup(tmp_path)) == 3000


@pytest.mark.parametrize("via_link", [False, True], ids=["fifo", "symlink-to-fifo"])
def test_a_fifo_named_like_a_pth_does_not_hang_the_worker(tmp_path: Path, via_link: bool) -> None:
    """A FIFO with an environment .pth's name in the user site (or a symlink so named to a
    FIFO elsewhere) is skipped: the pickup returns, so the session's next call is not stuck
    before it starts."""
    fifo = tmp_path / ("elsewhere" if via_link else "harombe-env-fifo.pth")
    os.mkfifo(fifo)
    if via_link:
        (tmp_path / "harombe-env-link.pth").symlink_to(fifo)
    (tmp_path / "harombe-env-good.pth").write_text("/opt/harombe/envs/" + "e" * 32 + "/site\n")
    try:
        added = pickup(tmp_path, timeout_s=10)
    except subprocess.TimeoutExpired:
        added = None
    assert added == ["/opt/harombe/envs/" + "e" * 32 + "/site"]


@pytest.mark.parametrize(
    "line",
    ["/opt/harombe/envs/../../../workspace/evil", "/opt/harombe/envs/x/../../../../etc",
     "/opt/harombe/envs//../../../tmp"],
    ids=["to-workspace", "to-etc", "double-slash"],
)  # fmt: skip
def test_a_pth_cannot_climb_out_of_the_environments(tmp_path: Path, line: str) -> None:
    """A planted .pth whose path starts with the environments' mount but climbs out with '..'
    is not put on sys.path (as one naming /workspace directly is not)."""
    (tmp_path / "harombe-env-climb.pth").write_text(line + "\n")
    assert pickup(tmp_path) == []


# -- the shared import check ----------------------------------------------------------------


class ArgvRuns:
    """Stands in for Runs: records the argv of each run."""

    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    async def run(self, _box: Any, argv: list[str], _stdin: bytes, **_options: Any) -> Any:
        self.argv.append(list(argv))
        return type("Done", (), {"stderr": ""})()


def test_the_shared_import_check_cannot_be_silenced_by_the_user_site(
    tmp_path: Path,
) -> None:
    """The import check whose clean result marks an environment checked for every sandbox is
    not fooled by a usercustomize.py the sandbox's code planted: run as harombe runs it (here
    with the host's system Python and a HOME like the sandbox's), a module that fails to
    import still reports the failure."""
    from harombe.security.runtime.installs import Installs
    from harombe.security.runtime.packages import parse_spec

    runs = ArgvRuns()
    installs = Installs.__new__(Installs)
    installs._runs = runs  # type: ignore[assignment]
    env_site = tmp_path / "env-site"
    spec = parse_spec("brokenpkg", "pypi")
    asyncio.run(installs._import_check(None, spec, paths=[str(env_site)]))  # type: ignore[arg-type]
    (env_site / "brokenpkg").mkdir(parents=True)
    (env_site / "brokenpkg" / "__init__.py").write_text(
        "raise ImportError('module compiled using NumPy 1.x cannot be run in NumPy 2')\n"
    )
    info = env_site / "brokenpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpkg\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("brokenpkg\n")
    system = "/usr/bin/python3"
    minor = subprocess.run([system, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    user_site = tmp_path / "home" / ".local" / "lib" / f"python{minor}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "harombe-env-x.pth").write_text(f"{env_site}\n")
    (user_site / "usercustomize.py").write_text("import os\nos._exit(0)\n")
    argv = [system if runs.argv[0][0] == "python3" else runs.argv[0][0], *runs.argv[0][1:]]
    home = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=home)
    assert "NumPy 1.x" in done.stderr, (done.returncode, done.stderr)


def test_bytecode_does_not_reveal_the_host_cache_path(tmp_path: Path) -> None:
    """The .pyc files every sandbox can read name the module by its path in the sandbox
    (/opt/harombe/envs/<key>/site/...), never the host's cache directory or a builder's pid."""
    wheel = make_wheel(tmp_path)
    store = new_store(tmp_path)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}.0"
    hashed = [(wheel, environments.sha256_of(wheel.path))]
    target = Target(python=python, machine="x86_64", glibc="2.36")
    key = environment_key([(wheel.path.name, hashed[0][1])], target)
    env = store._build(key, hashed, ("tinypkg",), target)
    compiled = list((store.envs / env.key / "site").rglob("*.pyc"))
    assert compiled
    for pyc in compiled:
        data = pyc.read_bytes()
        assert str(store.directory).encode() not in data, pyc
        assert f"/opt/harombe/envs/{env.key}/site/".encode() in data, pyc


# -- two names of one set -------------------------------------------------------------------


async def test_two_names_of_one_set_keep_their_own_preimports() -> None:
    """Environments 'fast' (preimport six) and 'other' (preimport a module that does not
    exist) hold the same requirements: preparing 'other' does not change what the pooled
    sandboxes of 'fast' import (nor their pool size)."""
    environments_, _ = registry()
    environments_.define("fast", ["six"], preimport=["six"], pool_size=3)
    environments_.define("other", ["six"], preimport=["no_such_module"], pool_size=0)
    fast = await environments_.ensure("fast", target=TARGET)
    await environments_.ensure("other", target=TARGET)
    pooled = environments_.prepared[fast.pool_id]  # what a pool refill of 'fast' prepares with
    assert (pooled.preimport, pooled.pool_size) == (("six",), 3)


async def test_an_environment_is_evictable_once_its_sandboxes_are_gone(tmp_path: Path) -> None:
    """A long-running manager does not pin every environment it ever linked: once the
    sandbox that used one is destroyed (and it was last used long ago), eviction removes it."""
    from tests.unit.fake_manager import running

    async with running(install_cache={"directory": str(tmp_path / "cache")}) as (_, manager):
        store = manager.installs.store
        assert store is not None
        env = await asyncio.to_thread(build, store, [make_wheel(tmp_path)])
        box = await manager.create_sandbox("python")
        await manager.installs.link(box, env)
        await manager.destroy_sandbox(box.sandbox_id)
        when = time.time() - 2 * HOUR_S
        os.utime(store.directory / "used" / env.key, (when, when))
        store.max_bytes = 0
        assert store.evict() == [env.key]


def _compile_processes() -> int:
    """How many processes below this one run the bytecode compiler (the child and its
    workers)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat_line = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat_line.rsplit(")", 1)[1].split()[1])
    below, changed = {os.getpid()}, True
    while changed:
        grown = below | {pid for pid, parent in parents.items() if parent in below}
        changed, below = grown != below, grown
    return len(below) - 1  # this process itself does not count


def test_the_bytecode_compiler_is_one_limited_process(tmp_path: Path) -> None:
    """Compiling a wheel's modules uses one process under the memory limit, not a pool of one
    worker per CPU each with the full limit (a compiler bomb costs one limit, not N)."""
    import threading

    site = tmp_path / "site"
    site.mkdir()
    for i in range(3):
        (site / f"m{i}.py").write_text("x = [" + "1," * 500_000 + "]\n")
    done = threading.Event()
    worker = threading.Thread(
        target=lambda: (environments.compile_tree(site, shown_as="/x/site"), done.set()),
        daemon=True,
    )
    worker.start()
    most = 0
    while not done.wait(0.05) and worker.is_alive():  # a failing compile_tree ends it too
        most = max(most, _compile_processes())
    worker.join()
    assert done.is_set()
    assert most == 1, most  # 0 would mean it ended before a look: no proof either way


def test_a_manifest_swapped_between_environments_is_refused(tmp_path: Path) -> None:
    """Two published environments whose manifests were swapped (each valid for the other's
    key) are both refused by load(), and eviction skips them rather than trusting their
    sizes."""
    builder = new_store(tmp_path)
    one, two = (build(builder, [make_wheel(tmp_path, name)]) for name in ("swapa", "swapb"))
    store = new_store(tmp_path, max_mb=0)
    first, second = store.envs / one.key / "manifest.json", store.envs / two.key / "manifest.json"
    for path in (first, second):
        os.chmod(path, 0o644)
        os.chmod(path.parent, 0o755)
    body = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(body)
    assert store.load(one.key, reused=True) is None and store.load(two.key, reused=True) is None
    assert store.evict(now=time.time() + 10 * HOUR_S) == []

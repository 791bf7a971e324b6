"""The host-side install cache (environments.py, environment_unpack.py): keys, building from
wheels, verification, reuse within the resolve TTL, concurrency and LRU eviction — with local
wheels made here (no network, no Docker)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import stat
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harombe.errors import PackageFetchError
from harombe.security.runtime import environments
from harombe.security.runtime.environments import (
    EnvironmentStore,
    environment_key,
    request_hash,
)
from harombe.security.runtime.packages.wheels import Target, Wheel

TARGET = Target(python="3.11.2", machine="x86_64", glibc="2.36")

HOUR_S = 3600.0


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str = "tinypkg",
    version: str = "1.0",
    files: dict[str, bytes] | None = None,
    *,
    bad_hash: bool = False,
    symlink_member: str | None = None,
) -> Wheel:
    """A minimal valid wheel (or a broken one) at ``directory``."""
    files = dict(files or {f"{name}/__init__.py": b"VALUE = 42\n"})
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [
        f"{path},{_digest(b'x' if bad_hash else data)},{len(data)}" for path, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            entry = zipfile.ZipInfo(member)
            if member == symlink_member:
                entry.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(entry, data)
    return Wheel(name, Version(version), path, ())


@pytest.fixture
def store(tmp_path: Path) -> EnvironmentStore:
    made = EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600)
    made.open()
    return made


def build(
    store: EnvironmentStore, wheels: list[Wheel], requirements: tuple[str, ...] = ("x",)
) -> Any:
    hashed = [(w, environments.sha256_of(w.path)) for w in wheels]
    key = environment_key([(w.path.name, h) for w, h in hashed], TARGET)
    env = store._build(key, hashed, requirements, TARGET)
    store.holds.unhold(env.key)  # no sandbox links it
    return env


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ((["a", "b"], TARGET, [], []), (["b", "a", "a"], TARGET, [], []), True),
        ((["a"], TARGET, [], []), (["a"], Target("3.12.1", "x86_64", "2.36"), [], []), False),
        ((["a"], TARGET, [], []), (["a"], TARGET, ["numpy<2"], []), False),
        ((["a"], TARGET, [], []), (["a"], TARGET, [], ["http://index.invalid/simple"]), False),
        ((["a"], TARGET, [], []), (["a>=1"], TARGET, [], []), False),
    ],
    ids=["order-and-duplicates", "python", "constraints", "index", "specifier"],
)
def test_request_hash_names_the_set_as_asked(one: tuple, other: tuple, same: bool) -> None:
    """The request hash ignores order and duplicates, and changes with anything else."""
    assert (request_hash(*one) == request_hash(*other)) is same


def test_environment_key_follows_the_wheel_bytes() -> None:
    """The key changes when a wheel's hash does, not when the list's order does."""
    a, b = ("a-1-py3-none-any.whl", "1" * 64), ("b-1-py3-none-any.whl", "2" * 64)
    assert environment_key([a, b], TARGET) == environment_key([b, a], TARGET)
    assert environment_key([a, b], TARGET) != environment_key(
        [a, ("b-1-py3-none-any.whl", "3" * 64)], TARGET
    )


def test_a_built_environment_is_published_whole_and_read_only(
    store: EnvironmentStore, tmp_path: Path
) -> None:
    """Building puts site/, a manifest and nothing else writable by others under envs/<key>;
    load() returns it; nothing is left in tmp/."""
    env = build(store, [make_wheel(tmp_path), make_wheel(tmp_path, "other", "2.0")])
    root = store.envs / env.key
    assert (root / "site" / "tinypkg" / "__init__.py").read_bytes() == b"VALUE = 42\n"
    assert (root / "site" / "tinypkg-1.0.dist-info" / "INSTALLER").read_bytes() == b"harombe\n"
    assert env.wheels == ("other-2.0", "tinypkg-1.0") or set(env.wheels) == {
        "other-2.0",
        "tinypkg-1.0",
    }
    assert env.site == f"/opt/harombe/envs/{env.key}/site"
    assert store.load(env.key, reused=True) == env.__class__(**{**env.__dict__, "reused": True})
    for walk_root, dirs, files in os.walk(root):
        for name in dirs + files:
            assert not os.lstat(os.path.join(walk_root, name)).st_mode & 0o022, name
    assert os.listdir(store.directory / "tmp") == []


def test_bytecode_is_compiled_only_for_the_same_python(
    store: EnvironmentStore, tmp_path: Path
) -> None:
    """With the host's own minor version the tree has __pycache__; with another it has none."""
    import sys

    same = Target(f"{sys.version_info[0]}.{sys.version_info[1]}.0", "x86_64", "2.36")
    other = Target("3.2.0", "x86_64", "2.36")
    for target, expected in ((same, True), (other, False)):
        wheel = make_wheel(tmp_path, f"pkg{int(expected)}")
        hashed = [(wheel, environments.sha256_of(wheel.path))]
        key = environment_key([(wheel.path.name, hashed[0][1])], target)
        env = store._build(key, hashed, ("x",), target)
        assert (store.envs / env.key / "site" / wheel.name / "__pycache__").is_dir() is expected


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"bad_hash": True}, "refused while unpacking"),
        ({"files": {"../evil.py": b"x"}}, "refused while unpacking"),
    ],
    ids=["record-hash", "path-traversal"],
)
def test_a_bad_wheel_is_refused_naming_it(
    store: EnvironmentStore, tmp_path: Path, kwargs: dict, needle: str
) -> None:
    """A wheel whose RECORD does not hold, or that writes outside its scheme, fails the build
    with a PackageFetchError naming the distribution; nothing is published or left behind."""
    with pytest.raises(PackageFetchError, match=needle) as caught:
        build(store, [make_wheel(tmp_path, **kwargs)])
    assert "tinypkg" in str(caught.value)
    assert os.listdir(store.envs) == [] and os.listdir(store.directory / "tmp") == []
    assert not (tmp_path / "evil.py").exists() and not (store.directory / "evil.py").exists()


def test_a_symlink_member_is_written_as_a_plain_file(
    store: EnvironmentStore, tmp_path: Path
) -> None:
    """A zip member marked as a symlink becomes a regular file with its stored bytes."""
    wheel = make_wheel(tmp_path, files={"tinypkg/__init__.py": b"", "tinypkg/link": b"/etc/passwd"},
                       symlink_member="tinypkg/link")  # fmt: skip
    env = build(store, [wheel])
    link = store.envs / env.key / "site" / "tinypkg" / "link"
    assert not link.is_symlink() and link.read_bytes() == b"/etc/passwd"


@pytest.mark.parametrize(
    "tamper",
    ["key", "wheel-hash", "garbage", "missing"],
)
def test_an_altered_cache_entry_is_not_used(
    store: EnvironmentStore, tmp_path: Path, tamper: str
) -> None:
    """An entry whose manifest does not hash to the key it is filed under is not loaded."""
    env = build(store, [make_wheel(tmp_path)])
    manifest_path = store.envs / env.key / "manifest.json"
    os.chmod(manifest_path, 0o644)
    manifest = json.loads(manifest_path.read_text())
    if tamper == "key":
        manifest["key"] = "0" * 32
        manifest["wheels"][0]["file"] = "evil-1.0-py3-none-any.whl"
    elif tamper == "wheel-hash":
        manifest["wheels"][0]["sha256"] = "f" * 64
    manifest_path.write_text("{not json" if tamper == "garbage" else json.dumps(manifest))
    if tamper == "missing":
        manifest_path.unlink()
    assert store.load(env.key, reused=True) is None


@pytest.mark.parametrize(
    "key",
    ["../envs", "", "A" * 32, "0" * 31, "0" * 32 + "/x"],
    ids=["dots", "empty", "upper", "short", "slash"],
)
def test_load_refuses_keys_that_are_not_keys(store: EnvironmentStore, key: str) -> None:
    """load() only ever looks up 32 lowercase hex digits."""
    assert store.load(key, reused=True) is None


class CountingStore(EnvironmentStore):
    """A store whose resolution returns local wheels and counts how often it ran."""

    def __init__(self, *args: Any, wheels: list[Wheel], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wheels = wheels
        self.resolved = 0

    async def _resolve(
        self, areas: Any, requirements: Any, target: Any, constraints: Any, say: Any
    ) -> list[Wheel]:
        self.resolved += 1
        await say("resolving", "resolving")
        await asyncio.sleep(0.05)  # long enough for a second caller to queue on the lock
        return self.wheels


def counting(tmp_path: Path, *, ttl_s: float = 3600) -> CountingStore:
    made = CountingStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=ttl_s,
                         wheels=[make_wheel(tmp_path)])  # fmt: skip
    made.open()
    return made


async def test_a_request_is_answered_from_the_cache_within_its_ttl(tmp_path: Path) -> None:
    """The second ensure of the same set resolves nothing and says it reused the cache;
    ``refresh`` resolves again (to the same environment)."""
    store = counting(tmp_path)
    steps: list[str] = []
    first = await store.ensure(["tinypkg"], target=TARGET, on_progress=steps.append)
    again = await store.ensure(["tinypkg", "tinypkg"], target=TARGET)
    refreshed = await store.ensure(["tinypkg"], target=TARGET, refresh=True)
    assert (first.reused, again.reused, store.resolved) == (False, True, 2)
    assert first.key == again.key == refreshed.key
    assert steps[0] == "resolving" and any(s.startswith("unpacking") for s in steps)


async def test_a_stale_request_is_resolved_again(tmp_path: Path) -> None:
    """Past resolve_ttl_s, the request is resolved again; the environment itself is reused."""
    store = counting(tmp_path, ttl_s=0)
    first = await store.ensure(["tinypkg"], target=TARGET)
    await asyncio.sleep(0.01)
    second = await store.ensure(["tinypkg"], target=TARGET)
    assert store.resolved == 2 and second.key == first.key and second.reused is True


async def test_concurrent_requests_build_once(tmp_path: Path) -> None:
    """Eight concurrent ensures of one set: one resolution, one build, one environment."""
    store = counting(tmp_path)
    envs = await asyncio.gather(*(store.ensure(["tinypkg"], target=TARGET) for _ in range(8)))
    assert store.resolved == 1 and len({e.key for e in envs}) == 1
    assert sorted(e.reused for e in envs) == [False] + [True] * 7
    assert os.listdir(store.envs) == [envs[0].key]


def _aged(store: EnvironmentStore, key: str, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(store.directory / "used" / key, (when, when))


def test_eviction_removes_least_recently_used_first(tmp_path: Path) -> None:
    """Over max_mb, the oldest-used environments go until the rest fits; recent and held ones
    stay, and an evicted key is gone from envs/ at once."""
    store = EnvironmentStore(tmp_path / "cache", max_mb=256, resolve_ttl_s=60)
    store.open()
    big = b"x" * (30 << 20)
    envs = [build(store, [make_wheel(tmp_path, f"p{i}", files={f"p{i}/d": big + bytes([i])})])
            for i in range(4)]  # fmt: skip
    for age, env in zip((5, 4, 3, 2), envs, strict=True):
        _aged(store, env.key, HOUR_S * age)
    store.max_bytes = 64 << 20
    store.hold(envs[0].key)  # the oldest is in use by this process
    removed = store.evict()
    assert removed == [envs[1].key, envs[2].key]
    assert sorted(os.listdir(store.envs)) == sorted([envs[0].key, envs[3].key])


def test_the_cap_holds_for_recently_used_environments(tmp_path: Path) -> None:
    """A build that would pass max_mb first evicts what no sandbox holds, however recently
    it was used: the cache never holds more than its cap."""
    store = EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=60)
    store.open()
    big = b"y" * (40 << 20)
    envs = [build(store, [make_wheel(tmp_path, f"q{i}", files={f"q{i}/d": big + bytes([i])})])
            for i in range(2)]  # fmt: skip
    assert os.listdir(store.envs) == [envs[1].key]
    assert environments.tree_bytes(store.envs) <= store.max_bytes


def test_a_build_that_cannot_fit_beside_held_ones_is_refused_whole(tmp_path: Path) -> None:
    """When evicting what no sandbox holds is not enough, the build is a PackageFetchError
    naming the cap and the setting to raise; nothing of it is left in the cache."""
    store = EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=60)
    store.open()
    big = b"z" * (40 << 20)
    first = build(store, [make_wheel(tmp_path, "held", files={"held/d": big})])
    store.hold(first.key)  # a live sandbox links it
    with pytest.raises(PackageFetchError, match=r"cap is 64 MB; raise security\.sandbox\."
                       r"install_cache\.max_mb \(to at least 81\)"):  # fmt: skip
        build(store, [make_wheel(tmp_path, "late", files={"late/d": big + b"!"})])
    assert os.listdir(store.envs) == [first.key]
    assert os.listdir(store.directory / "tmp") == []


@pytest.mark.parametrize(
    ("names", "so_in", "expected"),
    [
        (["six"], None, False),
        (["numpy"], "numpy", False),
        (["numpy", "pandas"], "pandas", True),
        (["numpy", "pure"], None, False),
        (["numpy", "scipy"], "numpy", False),
        (["pandas", "tzdata"], "pandas", False),
    ],
    ids=[
        "pure",
        "numpy-alone",
        "extension-beside-numpy",
        "pure-beside-numpy",
        "only-numpy-so",
        "no-numpy",
    ],
)
def test_an_import_check_is_needed_only_for_extensions_beside_numpy(
    tmp_path: Path, names: list[str], so_in: str | None, expected: bool
) -> None:
    """Only a compiled extension other than NumPy's, in a set holding NumPy, can break on
    import; everything else skips the sandbox's import check."""
    for name in names:
        (tmp_path / "site" / name).mkdir(parents=True)
    if so_in:
        (tmp_path / "site" / so_in / "_ext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert environments.needs_import_check(tmp_path, names) is expected


def test_an_unusable_directory_is_a_config_error(tmp_path: Path) -> None:
    """A cache directory that cannot be made says which setting to change."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    from harombe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"install_cache\.directory"):
        EnvironmentStore(blocker / "cache", max_mb=64, resolve_ttl_s=60).open()


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"x": {"requirements": []}}, "at least 1 item"),
        ({"x": {"requirements": ["a"], "preimport": ["os; import evil"]}}, "not a module name"),
        ({"x": {"requirements": ["a"], "pool_size": -1}}, "greater than or equal to 0"),
        ({"Bad Name": {"requirements": ["a"]}}, "should match pattern"),
        ({"x": {"requirements": ["a"], "extra": 1}}, "unknown key '.*environments.x.extra'"),
    ],
    ids=["no-requirements", "preimport-not-a-module", "negative-pool", "bad-name", "unknown-key"],
)
def test_environment_config_is_checked(section: dict, needle: str) -> None:
    """security.sandbox.environments entries are validated with the key named."""
    from harombe.config import parse_config
    from harombe.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        parse_config({"security": {"sandbox": {"environments": section}}})


def environments_registry() -> Any:
    from harombe.config_environments import EnvironmentConfig
    from harombe.security.runtime.environment_sandboxes import Environments

    configured = {
        "data": EnvironmentConfig(requirements=["pandas"], preimport=["pandas"], pool_size=2)
    }
    return Environments(installs=None, runs=None, configured=configured)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("environment", "error", "needle"),
    [
        ("nope", "UsageError", r"no environment named 'nope'; .*\(known: data\)"),
        ([], "InvalidArgumentError", "1 to 200 requirement strings"),
        (["ok", ""], "InvalidArgumentError", "requirement strings"),
        (["ok", 3], "InvalidArgumentError", "requirement strings"),
        (["x"] * 201, "InvalidArgumentError", "1 to 200"),
    ],
    ids=["unknown-name", "empty-list", "blank-entry", "not-a-string", "too-many"],
)
def test_what_an_environment_argument_may_be(environment: Any, error: str, needle: str) -> None:
    """A name must be defined; a list must hold 1 to 200 non-empty strings."""
    from harombe import errors

    with pytest.raises(getattr(errors, error), match=needle):
        environments_registry().requirements_of(environment)


def test_a_defined_name_and_a_list_give_their_settings() -> None:
    """A configured name gives its requirements and pool settings; a list gives itself with
    no preimports and a pool of one; define() replaces or adds a name."""
    registry = environments_registry()
    assert registry.requirements_of("data")[0] == ["pandas"]
    assert registry.requirements_of("data")[1].pool_size == 2
    wanted, settings = registry.requirements_of(["toml", "six"])
    assert (wanted, settings.preimport, settings.pool_size) == (["toml", "six"], [], 1)
    registry.define("mine", ["toml"], preimport=["toml"], pool_size=0)
    assert registry.names == ["data", "mine"]
    from harombe.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="lowercase letters"):
        registry.define("../x", ["toml"])
    with pytest.raises(InvalidArgumentError, match="environment 'bad'"):
        registry.define("bad", ["toml"], preimport=["not a module"])


def test_the_modules_of_the_requested_distributions_are_recorded(
    store: EnvironmentStore, tmp_path: Path
) -> None:
    """The manifest lists the public top-level modules of the distributions asked for (from
    RECORD when there is no top_level.txt), not those of their dependencies."""
    files = {"asked_pkg/__init__.py": b"", "asked_extra.py": b"", "_private.py": b""}
    asked = make_wheel(tmp_path, "Asked_Pkg", files=files)
    dependency = make_wheel(tmp_path, "dep", files={"dep/__init__.py": b""})
    env = build(store, [asked, dependency], requirements=("asked-pkg>=1",))
    assert env.modules == ("asked_extra", "asked_pkg")

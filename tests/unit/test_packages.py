"""Dependency metadata and lockfiles: plain registry releases pass, everything else is refused
before anything of a package is fetched or run. The specs a caller gives are
``test_package_specs.py``'s."""

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harombe.errors import PackageFetchError, PackageSpecError
from harombe.security.runtime.packages import manylinux_platforms
from harombe.security.runtime.packages.fetch_runner import download_identity
from harombe.security.runtime.packages.npm import _npm_failure, check_lockfile, registry_range
from harombe.security.runtime.packages.pypi import _pip_config
from harombe.security.runtime.packages.wheels import (
    Target,
    Wheel,
    applies,
    collect_wheels,
    parse_requires,
    read_requires_dist,
    stale,
    wanted,
)


def test_manylinux_tags_cover_older_glibc() -> None:
    """A glibc 2.36 sandbox accepts manylinux wheels down to 2_5, legacy aliases included."""
    tags = manylinux_platforms("x86_64", "2.36")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert not any("2_37" in t for t in tags)


# --- dependency metadata: what is refused, what applies ----------------------------------------

URL_REQUIRES = [
    "payload @ http://127.0.0.1:8000/payload-1.0.tar.gz",
    "payload@https://example.invalid/p.whl",
    "Payload @ HTTPS://EXAMPLE.INVALID/P.TAR.GZ",
    "payload @ file:///tmp/payload-1.0.tar.gz",
    "payload @ git+https://example.invalid/p.git",
    "payload @ git+ssh://git@example.invalid/p.git@v1",
    "payload @ hg+http://example.invalid/p",
    "payload @ svn+http://example.invalid/p",
    "payload @ bzr+http://example.invalid/p",
    'payload @ http://example.invalid/p.tar.gz ; sys_platform == "win32"',
    'payload @ http://example.invalid/p.tar.gz ; extra == "x"',
    "payload[extra] @ http://example.invalid/p.tar.gz",
    "payload @ http://",  # unreadable, but unmistakably a reference
]


@pytest.mark.parametrize("line", URL_REQUIRES, ids=[f"url{i}" for i in range(len(URL_REQUIRES))])
def test_url_vcs_and_path_requirements_are_refused_whatever_their_marker(line: str) -> None:
    """Any direct reference in Requires-Dist refuses the install, naming the dist and the line."""
    with pytest.raises(PackageSpecError, match="direct URL, VCS or path reference") as caught:
        parse_requires("evil 1.0", ["six", line], "evil")
    assert "evil 1.0 depends on" in str(caught.value)
    assert line.strip() in str(caught.value)


@pytest.mark.parametrize(
    "line",
    ["not a requirement !!", "six ==", "six; python_version >>"],
    ids=["junk", "op", "marker"],
)
def test_unreadable_requirements_are_refused(line: str) -> None:
    """A Requires-Dist line harombe cannot read refuses the install rather than being skipped."""
    with pytest.raises(PackageSpecError, match="cannot read"):
        parse_requires("evil 1.0", [line], "evil")


SANDBOX = Target(python="3.11.2", machine="aarch64", glibc="2.36")
APPLIES = [
    ("six", "", True),
    ("six", "x", False),  # plain requirements are expanded once, with no extra
    ('six ; extra == "x"', "", False),
    ('six ; extra == "x"', "x", True),
    ('six ; extra == "X"', "x", True),
    ('six ; python_version < "3.8"', "", False),
    ('six ; python_version >= "3.11"', "", True),
    ('six ; python_full_version == "3.11.2"', "", True),
    ('six ; sys_platform == "win32"', "", False),
    ('six ; sys_platform == "linux"', "", True),
    ('six ; platform_machine == "aarch64"', "", True),  # the sandbox's CPU, not the host's
    ('six ; platform_machine == "x86_64"', "", False),
    ('six ; os_name == "nt"', "", False),
    ('six ; implementation_name == "pypy"', "", False),
    ('six ; platform_system == "Linux" and extra == "x"', "x", True),
]


@pytest.mark.parametrize(
    ("line", "extra", "expected"), APPLIES, ids=[f"{a[0]}|{a[1]}" for a in APPLIES]
)
def test_markers_are_judged_for_the_sandbox(line: str, extra: str, expected: bool) -> None:
    """Markers are evaluated with the sandbox's Python and platform and the requested extra."""
    assert applies(Requirement(line), SANDBOX.marker_env(), extra) is expected


def _wheel(name: str, version: str, requires: list[str]) -> Wheel:
    reqs = tuple(Requirement(r) for r in requires)
    return Wheel(name, Version(version), Path(f"{name}-{version}-py3-none-any.whl"), reqs)


def test_wanted_walks_picked_wheels_and_combines_ranges() -> None:
    """The tree is walked through picked wheels only; ranges from every edge are combined."""
    picks = {
        "evil": _wheel("evil", "1.0", ["mid>=1", "low<3", 'extra-dep ; extra == "x"']),
        "mid": _wheel("mid", "1.2", ["low>=2"]),
    }
    wants = wanted(Requirement("evil[x]==1.0"), picks, SANDBOX.marker_env())
    assert sorted(wants) == ["evil", "extra-dep", "low", "mid"]
    assert wants["low"].specifier.contains("2.5") and not wants["low"].specifier.contains("3")
    assert not wants["low"].specifier.contains("1.9")
    assert wants["low"].needed_by in ("evil 1.0", "mid 1.2")
    assert wants["extra-dep"].needed_by == "evil 1.0"
    assert sorted(w.name for w in stale(wants, picks)) == ["extra-dep", "low"]


def test_a_pick_outside_a_later_range_is_fetched_again() -> None:
    """A wheel picked before a stricter range appeared is stale and fetched again."""
    picks = {"evil": _wheel("evil", "1.0", ["mid", "low"]), "mid": _wheel("mid", "1.0", [])}
    picks["low"] = _wheel("low", "1.0", ["mid>=2"])
    wants = wanted(Requirement("evil"), picks, SANDBOX.marker_env())
    assert [w.pip_text for w in stale(wants, picks)] == ["mid>=2"]


def test_constraints_limit_the_ranges() -> None:
    """Constraint lines (numpy<2) narrow the range of the distribution they name."""
    picks = {"evil": _wheel("evil", "1.0", ["NumPy>=1.20"])}
    wants = wanted(Requirement("evil"), picks, {}, {"numpy": SpecifierSet("<2")})
    assert wants["numpy"].specifier == SpecifierSet(">=1.20,<2")


def _zip(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return buf.getvalue()


def test_requires_dist_is_read_from_the_wheel_metadata(tmp_path: Path) -> None:
    """Requires-Dist lines come from the single top-level .dist-info/METADATA."""
    meta = (
        "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\nRequires-Dist: six\n"
        "Requires-Dist: mid>=1 ; extra == 'x'\n\nbody Requires-Dist: no\n"
    )
    path = tmp_path / "evil-1.0-py3-none-any.whl"
    path.write_bytes(_zip({"evil/__init__.py": "", "evil-1.0.dist-info/METADATA": meta}))
    assert read_requires_dist(path) == ["six", "mid>=1 ; extra == 'x'"]
    assert collect_wheels(tmp_path, "evil")["evil"].requires[0].name == "six"


BAD_WHEELS = {
    "not-a-zip": b"#!/bin/sh\n",
    "no-metadata": _zip({"evil/__init__.py": ""}),
    "two-metadata": _zip({"a.dist-info/METADATA": "", "b.dist-info/METADATA": ""}),
    "nested-metadata": _zip({"x/evil-1.0.dist-info/METADATA": "Name: evil\n"}),
}


@pytest.mark.parametrize("data", BAD_WHEELS.values(), ids=BAD_WHEELS.keys())
def test_malformed_wheels_are_refused(tmp_path: Path, data: bytes) -> None:
    """A file that is not a wheel with one METADATA is refused, never guessed at."""
    path = tmp_path / "evil-1.0-py3-none-any.whl"
    path.write_bytes(data)
    with pytest.raises(PackageFetchError, match="not a valid wheel"):
        read_requires_dist(path)


@pytest.mark.parametrize(
    "name", ["evil-1.0.tar.gz", "evil-1.0.zip", "setup.py", "evil.whl"], ids=str
)
def test_anything_but_a_wheel_in_the_download_is_refused(tmp_path: Path, name: str) -> None:
    """Only wheels may come out of pip: an sdist or any other file refuses the install."""
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(PackageFetchError, match=r"not a wheel|invalid wheel name"):
        collect_wheels(tmp_path, "evil")


def test_a_linked_wheel_is_refused(tmp_path: Path) -> None:
    """A symlink in the download directory is never followed."""
    (tmp_path / "evil-1.0-py3-none-any.whl").symlink_to("/etc/passwd")
    with pytest.raises(PackageFetchError, match="not a wheel"):
        collect_wheels(tmp_path, "evil")


def test_only_download_settings_of_the_pip_configuration_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Index, certificate and proxy settings pass; build and binary settings are dropped."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("PIP_NO_BINARY", ":all:")
    monkeypatch.setenv("PIP_USE_PEP517", "1")
    monkeypatch.setenv("PIP_TARGET", "/")
    settings = _pip_config()
    assert settings["PIP_INDEX_URL"] == "http://127.0.0.1:9/simple/"
    assert settings["PIP_CERT"] == "/etc/ssl/certs/ca-certificates.crt"
    assert not {"PIP_NO_BINARY", "PIP_USE_PEP517", "PIP_TARGET"} & set(settings)


def test_downloads_never_run_as_root() -> None:
    """As root the download user is an unprivileged one; otherwise harombe's own."""
    ident = download_identity()
    if os.geteuid() == 0:
        assert ident.uid not in (None, 0) and ident.gid != 0
    else:
        assert ident.uid is None


# --- npm: lockfile and dependency ranges -----------------------------------------------------

REGISTRY_RANGES = ["", "*", "1.0.0", "^1.2", "~4.17.21", ">=1 <2", "1.x || 2.x", "latest", "next",
                   "npm:other@^1", "npm:@scope/other@1.0.0", "npm:other"]  # fmt: skip
NON_REGISTRY_RANGES = [
    "git+https://example.invalid/x.git", "git://example.invalid/x.git", "github:user/repo",
    "user/repo", "user/repo#v1", "http://example.invalid/x.tgz", "https://example.invalid/x.tgz",
    "file:../x", "file:/etc", "link:../x", "../x", "./x", "/abs/x", "~/x", "workspace:*",
    "npm:file:/etc", "npm:git+https://example.invalid/x.git", "gitlab:u/r", "bitbucket:u/r",
    "gist:abc", "1.0.0#x", 3, None,
]  # fmt: skip


@pytest.mark.parametrize("spec", REGISTRY_RANGES, ids=repr)
def test_registry_ranges_are_accepted(spec: str) -> None:
    """Versions, ranges, tags and aliases to registry packages are registry releases."""
    assert registry_range(spec)


@pytest.mark.parametrize("spec", NON_REGISTRY_RANGES, ids=repr)
def test_non_registry_ranges_are_refused(spec: object) -> None:
    """git, URL, file, link, path, workspace and shorthand specs are not registry releases."""
    assert not registry_range(spec)


def _entry(version: str | None = "1.0.0", **fields: object) -> dict[str, object]:
    entry: dict[str, object] = {"version": version, "integrity": "sha512-x", **fields}
    return {k: v for k, v in entry.items() if v is not None}


GOOD_LOCK = {
    "name": "harombe-install",
    "lockfileVersion": 3,
    "packages": {
        "": {"name": "harombe-install", "dependencies": {"debug": "^4.3.4"}},
        "node_modules/debug": _entry("4.3.4", dependencies={"ms": "2.1.2"}),
        "node_modules/ms": _entry("2.1.2"),
        "node_modules/@s/a/node_modules/b": _entry(),
        "node_modules/debug/node_modules/c": {"version": "1.0.0", "inBundle": True},
    },
}


def test_a_registry_only_lockfile_passes() -> None:
    """Registry entries (version + integrity, or bundled) with registry ranges pass."""
    assert check_lockfile(GOOD_LOCK) == 4


def _with(key: str, entry: dict[str, object]) -> dict[str, object]:
    lock: dict[str, object] = json.loads(json.dumps(GOOD_LOCK))
    packages = lock["packages"]
    assert isinstance(packages, dict)
    packages[key] = entry
    return lock


GIT = "git+https://example.invalid/q.git"
BAD_LOCKS = {
    "resolved-url": (
        _with("node_modules/p", _entry(resolved="http://127.0.0.1/p.tgz")),
        "resolved from",
    ),
    "resolved-git": (
        _with("node_modules/p", _entry(integrity=None, resolved=GIT + "#abc")),
        "resolved from",
    ),
    "link": (_with("node_modules/p", {"link": True, "resolved": "../p"}), "a link"),
    "no-integrity": (_with("node_modules/p", _entry(integrity=None)), "no registry version"),
    "no-version": (_with("node_modules/p", _entry(None)), "no registry version"),
    "outside-node-modules": (_with("../p", _entry()), "not under node_modules"),
    "dotdot-in-key": (_with("node_modules/../../p", _entry()), "not under node_modules"),
    "git-dependency": (
        _with("node_modules/p", _entry(dependencies={"q": GIT})),
        "p@1.0.0's dependency q@git+",
    ),
    "optional-url": (
        _with("node_modules/p", _entry(optionalDependencies={"q": "http://example.invalid/q"})),
        "dependency q@http",
    ),
    "peer-file": (
        _with("node_modules/p", _entry(peerDependencies={"q": "file:/etc"})),
        "dependency q@file:",
    ),
    "root-git": (
        _with("", {"dependencies": {"q": "github:u/r"}}),
        "the request's dependency q@github:u/r",
    ),
    "no-packages": ({"lockfileVersion": 3}, "cannot read"),
}


@pytest.mark.parametrize(("lock", "needle"), BAD_LOCKS.values(), ids=BAD_LOCKS.keys())
def test_lockfiles_with_non_registry_entries_are_refused(lock: object, needle: str) -> None:
    """Any entry or range that is not a registry release refuses the install, naming it."""
    with pytest.raises((PackageSpecError, PackageFetchError)) as caught:
        check_lockfile(lock)
    assert needle in str(caught.value)


def test_refused_npm_dependency_is_named_from_the_debug_log(tmp_path: Path) -> None:
    """When npm itself refuses, the offending edge is found in its debug log and named."""
    (tmp_path / "debug-0.log").write_text(
        "15 silly placeDep ROOT evil@1.0.0 OK for:  want: 1.0.0\n"
        "16 silly placeDep ROOT payload@ OK for: evil@1.0.0 want: http://127.0.0.1:9/p.tgz\n"
    )
    error = _npm_failure("evil@1.0.0", "npm error code EALLOWREMOTE\n", tmp_path)
    assert isinstance(error, PackageSpecError)
    assert "evil@1.0.0's dependency payload@http://127.0.0.1:9/p.tgz" in str(error)
    plain = _npm_failure("evil@1.0.0", "npm error code E404\n", tmp_path)
    assert isinstance(plain, PackageFetchError)


def test_pip_copy_for_the_download_user_is_readable_and_root_writable_only() -> None:
    """The fallback copy of pip is world-readable, writable by its owner alone, and complete."""
    import importlib.util
    import stat

    from harombe.security.runtime.packages.pypi import _readable_pip_copy

    spec = importlib.util.find_spec("pip")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations)))
    copy = _readable_pip_copy(source)
    assert (copy / "__init__.py").is_file()
    assert (copy / "_internal" / "commands" / "download.py").is_file()
    for path in (copy.parent, copy, *copy.rglob("*")):
        mode = path.lstat().st_mode
        assert path.lstat().st_uid == os.geteuid(), path
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), path
        assert mode & stat.S_IROTH, path

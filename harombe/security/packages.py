"""Package installation: which specs are acceptable (pure), and the host-side download.

Only plain registry specs pass: a name and optional version constraint (``requests==2.31.0``,
``pandas>=2,<3``, ``axios@1.6.0``, ``@types/node@^20``). URLs, VCS references, local paths,
npm aliases and option-looking strings are refused before anything runs.

Downloads happen on the host with the machine's own pip / npm configuration (index URLs,
proxies, CA bundles) — harombe never names a registry host — and are then copied into the
sandbox, which stays offline. No package code runs on the host: pip fetches wheels only
(``--only-binary=:all:``) and npm runs with ``--ignore-scripts``.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
from packaging.requirements import InvalidRequirement, Requirement

from harombe.errors import PackageFetchError, PackageSpecError

log = structlog.get_logger(__name__)

Registry = Literal["pypi", "npm"]
REGISTRIES: tuple[Registry, ...] = ("pypi", "npm")
NPM_NAME = re.compile(r"^(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
NPM_RANGE = re.compile(r"^[0-9A-Za-z.+\-*^~<>=| ]{1,128}$")
FETCH_TIMEOUT_S = 600


@dataclass(frozen=True)
class PackageSpec:
    """A validated spec: ``text`` is what is handed to pip / npm, unchanged."""

    registry: Registry
    name: str
    text: str


def parse_spec(package: str, registry: str = "pypi") -> PackageSpec:
    """Validate ``package`` for ``registry``; :class:`PackageSpecError` says what to write."""
    if registry not in REGISTRIES:
        raise PackageSpecError(
            f"unknown registry {registry!r}; harombe installs from 'pypi' or 'npm' only"
        )
    if not isinstance(package, str) or not package.strip():
        raise PackageSpecError("package spec is empty; give a name such as 'requests==2.31.0'")
    text = package.strip()
    if text.startswith("-") or any(c in text for c in "\n\r\t\\"):
        raise PackageSpecError(f"package spec {package!r} looks like an option; give a name")
    if registry == "pypi":
        return _parse_pypi(text)
    return _parse_npm(text)


def _parse_pypi(text: str) -> PackageSpec:
    lowered = text.lower()
    if "://" in text or lowered.startswith(("git+", "file:")) or "/" in text or " @ " in text:
        raise PackageSpecError(
            f"{text!r} is a URL or path; only PyPI names with versions are allowed "
            "(e.g. 'requests==2.31.0')"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise PackageSpecError(f"{text!r} is not a valid PyPI requirement: {exc}") from None
    if req.url:
        raise PackageSpecError(f"{text!r} names a URL; only registry packages are allowed")
    if req.marker is not None:
        raise PackageSpecError(f"{text!r} has an environment marker; drop the ';' part")
    return PackageSpec("pypi", req.name, text)


def _parse_npm(text: str) -> PackageSpec:
    scoped = text.startswith("@")
    at = text.find("@", 1 if scoped else 0)
    name, version = (text, "") if at < 0 else (text[:at], text[at + 1 :])
    slashes = name.count("/")
    if ":" in text or slashes != (1 if scoped else 0) or text.startswith((".", "~")):
        raise PackageSpecError(
            f"{text!r} is a URL, alias, git or path reference; only npm registry names with "
            "versions are allowed (e.g. 'axios@1.6.0')"
        )
    if not NPM_NAME.match(name) or len(name) > 214:
        raise PackageSpecError(f"{name!r} is not a valid npm package name")
    if at >= 0 and not NPM_RANGE.match(version):
        raise PackageSpecError(f"{version!r} is not an npm version or range")
    return PackageSpec("npm", name, text)


def manylinux_platforms(machine: str, glibc: str) -> list[str]:
    """pip ``--platform`` tags a sandbox with this CPU and glibc version can load."""
    try:
        major, minor = (int(x) for x in glibc.split(".")[:2])
    except ValueError:
        major, minor = 2, 17
    if major != 2:
        minor = 17
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for m, name in legacy.items() if m <= minor]
    return tags


async def _run(argv: list[str], *, cwd: str, env: dict[str, str] | None = None) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except FileNotFoundError:
        raise PackageFetchError(
            f"{argv[0]} is not installed on the host; harombe downloads packages with the "
            f"host's {Path(argv[0]).name} (install it, e.g. `apt-get install npm`)"
        ) from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), FETCH_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PackageFetchError(f"{argv[0]} did not finish within {FETCH_TIMEOUT_S}s") from None
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-12:])
        raise PackageFetchError(f"downloading the package failed:\n{tail}")
    return text


def _tar_dir(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
    return buf.getvalue()


async def fetch_pypi(
    spec: PackageSpec, *, python: str, machine: str, glibc: str, constraints: Sequence[str] = ()
) -> bytes:
    """Wheels for ``spec`` and its dependencies, for the sandbox's interpreter, as a tar.gz.

    ``constraints`` are pip constraint lines (``numpy<2``) applied to the resolution."""
    major_minor = "".join(python.split(".")[:2])
    with tempfile.TemporaryDirectory(prefix="harombe-wheels-") as tmp:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            "--only-binary=:all:",
            "--dest",
            tmp,
            "--implementation",
            "cp",
            "--python-version",
            major_minor,
        ]
        for tag in manylinux_platforms(machine, glibc):
            argv += ["--platform", tag]
        if constraints:
            constraint_file = Path(tmp) / "constraints.txt"
            await asyncio.to_thread(constraint_file.write_text, "\n".join(constraints) + "\n")
            argv += ["--constraint", str(constraint_file)]
        argv += ["--", spec.text]
        text = await _run(argv, cwd=tmp)
        wheels = await asyncio.to_thread(lambda: sorted(Path(tmp).glob("*.whl")))
        if not wheels:
            raise PackageFetchError(f"pip downloaded no wheel for {spec.text}:\n{text[-800:]}")
        log.debug("package.fetched", registry="pypi", spec=spec.text, files=len(wheels))
        return await asyncio.to_thread(_tar_dir, Path(tmp))


async def fetch_npm(spec: PackageSpec) -> tuple[bytes, str]:
    """``node_modules`` for ``spec`` (install scripts not run) as a tar.gz, and npm's output."""
    npm = shutil.which("npm")
    if npm is None:
        raise PackageFetchError(
            "npm is not installed on the host; harombe downloads npm packages with the host's "
            "npm (install it, e.g. `apt-get install npm`)"
        )
    with tempfile.TemporaryDirectory(prefix="harombe-npm-") as tmp:
        manifest = Path(tmp, "package.json")
        await asyncio.to_thread(manifest.write_text, '{"name":"harombe-install","private":true}')
        env = {**os.environ, "npm_config_update_notifier": "false"}
        argv = [
            npm,
            "install",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--omit=dev",
            "--no-package-lock",
            "--prefix",
            tmp,
            "--",
            spec.text,
        ]
        text = await _run(argv, cwd=tmp, env=env)
        modules = Path(tmp, "node_modules")
        if not await asyncio.to_thread(modules.is_dir):
            raise PackageFetchError(f"npm installed nothing for {spec.text}:\n{text[-800:]}")
        return await asyncio.to_thread(_tar_dir, modules), text

"""npm downloads on the host in which no package code can run and nothing but the registry is
read.

``npm install --ignore-scripts`` is not enough on its own: a git dependency anywhere in the
tree is cloned and *prepared* (its ``prepare`` script run through a nested ``npm install``), a
``file:`` dependency copies a host directory into ``node_modules``, and a URL dependency
fetches from anywhere. So the download runs in two steps, both unprivileged
(:class:`~harombe.security.runtime.packages.fetch_runner.FetchArea`) and both with npm's own
``--allow-git/--allow-remote/--allow-file/--allow-directory=none``:

1. ``npm install --package-lock-only`` resolves the tree from registry metadata alone and
   writes a lockfile, registry entries without a ``resolved`` URL;
2. harombe checks the lockfile as data (:func:`check_lockfile`): every entry must be a
   registry release (version and integrity, no ``resolved`` URL, no link) and every
   dependency range must be a registry range — else the install is refused, naming the
   package and the dependency;
3. ``npm ci`` installs exactly that lockfile, with scripts off.

npm downloads from this machine's npm configuration (root's ``~/.npmrc`` and ``npm_config_*``
variables), unless a ``registry`` is given (``security.sandbox.network.allowed_registries.npm``):
then ``--registry`` on both runs makes it npm's registry (scoped registries in the npmrc still
apply to their scopes).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from harombe.errors import PackageFetchError, PackageNotFoundError, PackageSpecError
from harombe.security.runtime.packages.fetch_runner import FetchArea, base_env, memfd_with, tail

log = structlog.get_logger(__name__)

NPM_NAME = re.compile(r"^(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$", re.IGNORECASE)
#: A semver range, version or dist-tag: no ``:`` (protocols), ``/`` (paths, GitHub
#: shorthands), ``#`` (git refs) or ``@``.
NPM_RANGE = re.compile(r"^[0-9A-Za-z.+\-*^~<>=| _]{0,256}$")
LOCK_KEY = re.compile(r"^node_modules/(?:@[^/]+/)?[^/]+(?:/node_modules/(?:@[^/]+/)?[^/]+)*$")
DEPENDENCY_FIELDS = ("dependencies", "optionalDependencies", "peerDependencies")
LOCKFILE_MAX_BYTES = 64 * 1024 * 1024
NPMRC_MAX_BYTES = 1024 * 1024
#: Flags on every npm run: no lifecycle scripts, and nothing from outside the registry.
NPM_SAFETY = (
    "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev", "--allow-git=none",
    "--allow-remote=none", "--allow-file=none", "--allow-directory=none",
    "--omit-lockfile-registry-resolved", "--update-notifier=false",
)  # fmt: skip
#: npm settings in the environment that harombe sets itself.
OWN_SETTINGS = frozenset({"userconfig", "cache", "prefix", "ignore_scripts", "ignore-scripts"})
#: What npm prints when it refuses (allow-* flags) or cannot handle a non-registry dependency.
NON_REGISTRY_SIGNS = (
    "EALLOWGIT", "EALLOWREMOTE", "EALLOWFILE", "EALLOWDIRECTORY", "EUNSUPPORTEDPROTOCOL",
    "aliases only work for registry deps",
)  # fmt: skip
#: npm's debug-log line for each dependency edge it places: name, who needs it, the range.
PLACED = re.compile(r"placeDep \S+ (\S+?)@\S* OK for: (\S*) want: (.+)$", re.MULTILINE)
LOG_MAX_BYTES = 8 * 1024 * 1024
#: How many of npm's debug log files are read (npm writes at most 5 a run).
LOG_MAX_FILES = 64


def registry_range(spec: object) -> bool:
    """Whether ``spec`` (a dependency's value in package.json) names a registry release:
    a semver range, version or tag, or an ``npm:name@range`` alias to one."""
    if not isinstance(spec, str):
        return False
    text = spec.strip()
    if text.startswith("npm:"):
        rest = text[4:]
        at = rest.find("@", 1)
        name, version = (rest, "") if at < 0 else (rest[:at], rest[at + 1 :])
        return bool(NPM_NAME.match(name)) and bool(NPM_RANGE.match(version))
    return bool(NPM_RANGE.match(text))


def _non_registry(what: str, detail: str) -> PackageSpecError:
    return PackageSpecError(
        f"{what} is not a registry release ({detail}); harombe installs npm registry packages "
        "only and never fetches git, URL, file or directory dependencies on the host. Install "
        "a version whose dependencies are all published on the registry"
    )


def check_lockfile(lock: object) -> int:
    """Refuse a lockfile with anything but registry releases in it; the number of packages.

    Pure. Each entry must have a ``node_modules/…`` key, a version and an integrity hash
    (bundled entries excepted: they come inside a registry tarball), no ``resolved`` URL and
    no ``link``; every dependency range of every entry must satisfy :func:`registry_range`."""
    packages = lock.get("packages") if isinstance(lock, dict) else None
    if not isinstance(packages, dict):
        raise PackageFetchError("npm wrote a lockfile harombe cannot read (no 'packages' map)")
    count = 0
    for key, entry in packages.items():
        if not isinstance(entry, dict):
            raise PackageFetchError(f"npm lockfile entry {key!r} is not an object")
        label = "the request" if key == "" else _entry_label(key, entry)
        if key != "":
            if not isinstance(key, str) or not LOCK_KEY.match(key) or ".." in key.split("/"):
                raise _non_registry(f"lockfile entry {key!r}", "it is not under node_modules")
            if entry.get("link"):
                raise _non_registry(label, f"a link to {entry.get('resolved')!r}")
            if "resolved" in entry:
                raise _non_registry(label, f"resolved from {entry['resolved']!r}")
            has_integrity = isinstance(entry.get("integrity"), str)
            if not isinstance(entry.get("version"), str) or not (
                has_integrity or entry.get("inBundle")
            ):
                raise _non_registry(label, "no registry version and integrity")
            count += 1
        for dep_field in DEPENDENCY_FIELDS:
            deps = entry.get(dep_field) or {}
            if not isinstance(deps, dict):
                raise PackageFetchError(f"npm lockfile entry {key!r} has malformed {dep_field}")
            for dep, spec in deps.items():
                if not registry_range(spec):
                    raise _non_registry(f"{label}'s dependency {dep}@{spec}", "not a range")
    return count


def _entry_label(key: str, entry: Mapping[str, Any]) -> str:
    name = key.rsplit("node_modules/", 1)[-1]
    version = entry.get("version")
    return f"{name}@{version}" if isinstance(version, str) else name


def _userconfig_path() -> Path:
    for key, value in os.environ.items():
        if key.lower() == "npm_config_userconfig" and value:
            return Path(value)
    return Path.home() / ".npmrc"


def _npm_env(home: Path) -> dict[str, str]:
    env = base_env(home)
    for key, value in os.environ.items():
        lowered = key.lower()
        if lowered.startswith("npm_config_") and lowered[11:] not in OWN_SETTINGS:
            env[key] = value
    return env


def npm_common_args(work: Path, registry: str | None = None) -> list[str]:
    """Arguments of both npm runs in ``work``: :data:`NPM_SAFETY`, a private cache and prefix,
    and the configured ``registry`` (``None``: the machine's npm configuration decides)."""
    args = [*NPM_SAFETY, "--cache", str(work / "home" / "cache"), "--prefix", str(work)]
    return [*args, f"--registry={registry}"] if registry else args


def _npmrc(env: dict[str, str]) -> bytes:
    """Root's ``~/.npmrc`` (registry, auth, CA), capped; the variables it refers to
    (``//host/:_authToken=${NPM_TOKEN}``) are added to ``env`` so they travel with it."""
    userconfig = _userconfig_path()
    try:
        content = userconfig.read_bytes()[:NPMRC_MAX_BYTES] if userconfig.is_file() else b""
    except OSError:
        content = b""
    for var in set(re.findall(rb"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", content)):
        name = var.decode()
        value = os.environ.get(name)
        if value is not None and not name.startswith(("NODE_", "LD_")):
            env.setdefault(name, value)
    return content


#: npm's debug-log line for each request it made: method, status, the URL answered from.
FETCHED = re.compile(r"http fetch [A-Z]+ \d+ (\S+)")


def fetched_hosts(log_text: str) -> set[str]:
    """The hosts npm's debug log says it fetched from. Pure."""
    hosts = set()
    for url in FETCHED.findall(log_text):
        try:
            hosts.add((urlsplit(url).hostname or "").lower())
        except ValueError:
            hosts.add("")
    return hosts


#: The line npm's debug log ends a run with (every line of the log starts with its number, so
#: a logged string cannot forge it).
RUN_ENDED = re.compile(r"^\d+ verbose exit 0\s*$", re.MULTILINE)


def check_fetched_hosts(
    log_text: str, allowed_hosts: Collection[str], spec_text: str, *, runs: int = 1
) -> None:
    """Every request npm made went to an allowed host; else :class:`PackageFetchError` naming
    the host. A log with no request in it cannot show that: refused too, and so is one that
    does not show each of the ``runs`` to its end (npm stops writing its log once its last
    file is full, and later requests would go unseen)."""
    hosts = fetched_hosts(log_text)
    if not hosts:
        raise PackageFetchError(
            f"npm's log does not say where the files of {spec_text} came from, so they cannot "
            "be checked against security.sandbox.network.allowed_registries.npm; remove the "
            "host names there (or let npm write its log: no logs-max=0 in the .npmrc)"
        )
    for host in sorted(hosts):
        if host not in allowed_hosts:
            raise PackageFetchError(
                f"npm downloaded files of {spec_text} from {host or 'an unnamed host'}, which "
                "is not an allowed download host: security.sandbox.network.allowed_registries"
                f".npm lists the hosts installs may download from; add {host or 'it'} there "
                "if it is a registry you trust, or point npm's configuration at an allowed one"
            )
    if len(RUN_ENDED.findall(log_text)) < runs:
        raise PackageFetchError(
            f"npm's log of {spec_text} stops before npm finished (a tree too large for npm's "
            "log files, or a logs-max that removed one), so where its files came from cannot "
            "be checked against security.sandbox.network.allowed_registries.npm; remove the "
            "host names there, or install fewer packages at once"
        )


async def fetch_tree(
    area: FetchArea,
    npm: str,
    spec_text: str,
    *,
    registry: str | None = None,
    allowed_hosts: Collection[str] = (),
) -> tuple[Path, str]:
    """Resolve, check and install ``spec_text``; the ``node_modules`` directory and npm's
    output. See the module docstring for the steps and for ``registry``. With
    ``allowed_hosts``, every request npm made must have gone to one of them (read from its
    debug log before anything reaches a sandbox)."""
    work = area.new_dir("npm")
    (work / "package.json").write_text('{"name":"harombe-install","private":true}')
    env = _npm_env(work / "home")
    common = npm_common_args(work, registry)
    # Root's ~/.npmrc is handed over in memory: the download user cannot read it on disk, and
    # no copy of it is ever written.
    fd = memfd_with(_npmrc(env), "npmrc")
    try:
        common.append(f"--userconfig=/proc/self/fd/{fd}")
        code, output = await area.run(
            [npm, "install", "--package-lock-only", *common, "--", spec_text],
            cwd=work,
            env=env,
            pass_fds=[fd],
            give=("package.json",),
        )
        if code != 0:
            raise _npm_failure(spec_text, output, work / "home" / "cache" / "_logs")
        await asyncio.to_thread(_check_lock, work / "package-lock.json", spec_text, output)
        code, output = await area.run([npm, "ci", *common], cwd=work, env=env, pass_fds=[fd])
        if code != 0:
            raise _npm_failure(spec_text, output, work / "home" / "cache" / "_logs")
    finally:
        os.close(fd)
    if allowed_hosts:
        logs = await asyncio.to_thread(_read_logs, work / "home" / "cache" / "_logs", whole=True)
        check_fetched_hosts(logs, allowed_hosts, spec_text, runs=2)
    modules = work / "node_modules"
    if modules.is_symlink() or not modules.is_dir():
        raise PackageFetchError(f"npm installed nothing for {spec_text}:\n{tail(output)}")
    return modules, output


def _check_lock(lock_path: Path, spec_text: str, output: str) -> None:
    """Refuse the lockfile npm wrote unless :func:`check_lockfile` passes, then replace it with
    the checked copy in a new file harombe owns and the download user can only read: nothing
    can edit it between the check and ``npm ci``. Blocking: run it in a thread."""
    if lock_path.is_symlink() or not lock_path.is_file():
        raise PackageFetchError(f"npm resolved nothing for {spec_text}:\n{tail(output)}")
    raw = _read_capped(lock_path, LOCKFILE_MAX_BYTES + 1)
    if len(raw) > LOCKFILE_MAX_BYTES:
        raise PackageFetchError(f"the dependency tree of {spec_text} is too large")
    try:
        lock = json.loads(raw)
    except ValueError as exc:
        raise PackageFetchError(f"npm wrote an unreadable lockfile: {exc}") from None
    count = check_lockfile(lock)
    _write_new(lock_path, json.dumps(lock).encode())
    log.debug("package.lock_checked", spec=spec_text, packages=count)


def _write_new(path: Path, data: bytes) -> None:
    """Replace ``path`` (in a directory only harombe can write) with a new 0644 file."""
    path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _read_capped(path: Path, limit: int) -> bytes:
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as handle:
        return handle.read(limit)


def _offender(output: str, logs: Path) -> str | None:
    """The non-registry dependency npm refused, from its output or its debug log."""
    refused = re.search(r'Refusing to fetch "([^"]+)"', output)
    if refused:
        return refused.group(1)
    unsupported = re.search(r"Unsupported URL Type \"[^\"]*\": (\S+)", output)
    if unsupported:
        return unsupported.group(1)
    text = _read_logs(logs)
    for found in PLACED.finditer(text):
        name, requirer, spec = found.groups()
        if not registry_range(spec):
            return f"{requirer or 'the request'}'s dependency {name}@{spec.strip()}"
    return None


def _read_logs(logs: Path, *, whole: bool = False) -> str:
    """npm's debug logs in ``logs``, a directory the download user wrote: every component is
    opened without following links and only regular files are read (capped), so a planted
    symlink (to a host secret) or FIFO is never followed or blocked on. ``whole``: a log over
    the cap (or more files than are read) is a :class:`PackageFetchError`, not read in part."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    parts = logs.parts
    texts: list[str] = []
    try:
        fd = os.open(parts[0], flags | os.O_DIRECTORY)
        for part in parts[1:]:
            fd, parent = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
    except OSError:
        return ""
    try:
        names = sorted(n for n in os.listdir(fd) if n.endswith(".log"))
        if whole and len(names) > LOG_MAX_FILES:
            raise _log_too_large(f"{len(names)} files")
        for name in names[:LOG_MAX_FILES]:
            try:
                log_fd = os.open(name, flags, dir_fd=fd)
            except OSError:
                continue
            with os.fdopen(log_fd, "rb") as handle:
                if stat.S_ISREG(os.fstat(log_fd).st_mode):
                    data = handle.read(LOG_MAX_BYTES + 1)
                    if whole and len(data) > LOG_MAX_BYTES:
                        raise _log_too_large(f"a file over {LOG_MAX_BYTES >> 20} MiB")
                    texts.append(data[:LOG_MAX_BYTES].decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return "\n".join(texts)


def _log_too_large(what: str) -> PackageFetchError:
    return PackageFetchError(
        f"npm's log of this install is too large to check whole ({what}), so where its files "
        "came from cannot be checked against security.sandbox.network.allowed_registries.npm; "
        "remove the host names there, or install fewer packages at once"
    )


def _npm_failure(spec_text: str, output: str, logs: Path) -> Exception:
    """A refusal naming the dependency when npm refused a non-registry one, else a fetch error."""
    if any(code in output for code in NON_REGISTRY_SIGNS):
        what = _offender(output, logs) or "a dependency"
        return _non_registry(f"{what} (in the tree of {spec_text})", "npm refused it")
    if "E404" in output or "ETARGET" in output:  # the registry answered: no such package/version
        return PackageNotFoundError(
            f"the npm registry has no {spec_text} (or no version matching it); check the "
            f"name and version:\n{tail(output)}"
        )
    return PackageFetchError(f"npm could not download {spec_text}:\n{tail(output)}")

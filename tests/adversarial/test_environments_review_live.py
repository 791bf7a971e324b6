"""Adversarial review of the install cache against real gVisor: hostile code in a sandbox tries
to alter the shared environments, and to break its own session or the next install through
what it plants in its user site (FIFOs, directories, climbing .pth files)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harombe.config import parse_config
from harombe.errors import HarombeError
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager

pytestmark = pytest.mark.integration

SPEC = "toml==0.10.2"
USER_SITE = "$(python3 -c 'import site; print(site.getusersitepackages())')"


@pytest.fixture(scope="module")
async def cached(
    docker_manager: DockerManager, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[SandboxManager, Path]]:
    """A manager with an install cache of its own, and that cache's directory."""
    cache = tmp_path_factory.mktemp("install-cache-review")
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 0},
        "install_cache": {"directory": str(cache)},
    }}})  # fmt: skip
    made = SandboxManager(docker_manager=docker_manager, runtime="runsc", config=config)
    await made.start()
    yield made, cache
    await made.stop()


def digest_tree(root: Path) -> str:
    """Names, modes, sizes and bytes of everything below ``root``."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)} {info.st_mode:o} {info.st_size}\n".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


async def installed_sandbox(manager: SandboxManager) -> tuple[str, str]:
    """A sandbox with SPEC installed from the cache, and the environment's .pth name."""
    sid = (await manager.create_sandbox("python")).sandbox_id
    result = await manager.install_package(sid, SPEC)
    assert result.success, result
    listing = await manager.execute(sid, f"ls {USER_SITE}", language="shell")
    names = [n for n in listing.stdout.split() if n.startswith("harombe-env-")]
    assert len(names) == 1, listing
    return sid, names[0]


HOSTILE = r"""
import ctypes, errno, glob, os
site = glob.glob('/opt/harombe/envs/*/site')[0]
init = os.path.join(site, 'toml', '__init__.py')
tries = {
    'open-rw': lambda: os.close(os.open(init, os.O_RDWR)),
    'truncate': lambda: os.truncate(init, 0),
    'utime': lambda: os.utime(init, (0, 0)),
    'chmod': lambda: os.chmod(init, 0o777),
    'rename-in': lambda: os.rename(init, init + '.x'),
    'rename-out': lambda: os.rename(init, '/tmp/stolen.py'),
    'link-in': lambda: os.link('/tmp/mine.py', site + '/evil.py'),
    'symlink-in': lambda: os.symlink('/tmp', site + '/evil'),
    'mkdir-pycache': lambda: os.mkdir(os.path.join(site, 'toml', '__pycache__', 'x')),
    'setxattr': lambda: os.setxattr(init, b'user.x', b'1'),
    'mknod-fifo': lambda: os.mkfifo(site + '/fifo'),
    'unlink-manifest': lambda: os.unlink(os.path.dirname(site) + '/manifest.json'),
    'rmdir-env': lambda: os.rmdir(os.path.dirname(site)),
}
open('/tmp/mine.py', 'w').close()
allowed = []
for name, act in tries.items():
    try:
        act()
        allowed.append(name)
    except OSError:
        pass
print(sorted(allowed))
"""


async def test_a_sandbox_cannot_alter_the_shared_cache(
    cached: tuple[SandboxManager, Path],
) -> None:
    """Writes, renames, links, xattrs, FIFOs and removals in /opt/harombe/envs all fail, and
    the host's envs/ tree is byte for byte what it was."""
    manager, cache = cached
    sid, _ = await installed_sandbox(manager)
    before = digest_tree(cache / "envs")
    probe = await manager.execute(sid, HOSTILE)
    assert probe.stdout == "[]\n", probe
    assert digest_tree(cache / "envs") == before
    await manager.destroy_sandbox(sid)


async def test_a_fifo_at_the_pth_name_is_replaced_by_the_install(
    cached: tuple[SandboxManager, Path],
) -> None:
    """A FIFO planted under the exact name the install will write is replaced, not written
    through: the install returns and the session imports the package."""
    manager, _ = cached
    first, pth = await installed_sandbox(manager)
    await manager.destroy_sandbox(first)
    sid = (await manager.create_sandbox("python")).sandbox_id
    planted = await manager.execute(sid, f"mkdir -p {USER_SITE} && mkfifo {USER_SITE}/{pth}",
                                    language="shell")  # fmt: skip
    assert planted.success, planted
    installed = await asyncio.wait_for(manager.install_package(sid, SPEC), 120)
    assert installed.success, installed
    session = await asyncio.wait_for(manager.execute(sid, "import toml\ntoml.__version__"), 120)
    assert session.result == "'0.10.2'", session
    await manager.destroy_sandbox(sid)


async def test_a_directory_at_the_pth_name_fails_the_install_cleanly(
    cached: tuple[SandboxManager, Path],
) -> None:
    """A directory planted at the .pth's name makes the install fail with a harombe error or
    a failed result, and the session still answers."""
    manager, _ = cached
    first, pth = await installed_sandbox(manager)
    await manager.destroy_sandbox(first)
    sid = (await manager.create_sandbox("python")).sandbox_id
    planted = await manager.execute(sid, f"mkdir -p {USER_SITE}/{pth}/sub", language="shell")
    assert planted.success, planted
    try:
        installed = await asyncio.wait_for(manager.install_package(sid, SPEC), 120)
        failed = not installed.success
    except HarombeError:
        failed = True
    assert failed
    answer = await asyncio.wait_for(manager.execute(sid, "6 * 7"), 120)
    assert answer.result == "42", answer
    await manager.destroy_sandbox(sid)


async def test_a_fifo_named_like_a_pth_does_not_break_the_session(
    cached: tuple[SandboxManager, Path],
) -> None:
    """Code that plants a FIFO named harombe-env-*.pth in its user site does not wedge the
    session: the next session call runs."""
    manager, _ = cached
    sid = (await manager.create_sandbox("python")).sandbox_id
    planted = await manager.execute(
        sid, "import os, site\nos.makedirs(site.getusersitepackages(), exist_ok=True)\n"
        "os.mkfifo(os.path.join(site.getusersitepackages(), 'harombe-env-fifo.pth'))",
    )  # fmt: skip
    assert planted.success, planted
    try:
        answer = await asyncio.wait_for(manager.execute(sid, "6 * 7", timeout_s=15), 90)
        result = answer.result
    except (TimeoutError, HarombeError) as exc:
        result = repr(exc)
    await manager.destroy_sandbox(sid)
    assert result == "42"


async def test_a_climbing_pth_is_not_put_on_the_session_path(
    cached: tuple[SandboxManager, Path],
) -> None:
    """A planted harombe-env .pth naming /opt/harombe/envs/../../../workspace/evil is refused
    like one naming /workspace/evil directly: its module is not importable in the session."""
    manager, _ = cached
    sid = (await manager.create_sandbox("python")).sandbox_id
    planted = await manager.execute(
        sid,
        "import os, site\nos.makedirs('/workspace/evil', exist_ok=True)\n"
        "open('/workspace/evil/evilmod.py', 'w').write('X = 1')\n"
        "os.makedirs(site.getusersitepackages(), exist_ok=True)\n"
        "open(os.path.join(site.getusersitepackages(), 'harombe-env-x.pth'), 'w')"
        ".write('/opt/harombe/envs/../../../workspace/evil\\n')",
    )
    assert planted.success, planted
    after = await manager.execute(sid, "import sys\nany('evil' in p for p in sys.path)")
    await manager.destroy_sandbox(sid)
    assert after.result == "False", after


async def test_the_cache_layout_is_private_but_envs(cached: tuple[SandboxManager, Path]) -> None:
    """Only envs/ is readable by others on the host; requests, used, locks and tmp are the
    owner's alone."""
    _, cache = cached
    modes = {name: os.stat(cache / name).st_mode & 0o777
             for name in ("envs", "requests", "used", "locks", "tmp")}  # fmt: skip
    assert modes == {"envs": 0o755, "requests": 0o700, "used": 0o700, "locks": 0o700,
                     "tmp": 0o700}  # fmt: skip

"""The install cache and dependency environments against real gVisor: a cached install in a
new sandbox is a file, not a download; environments are read-only in the sandbox; a named
environment's pool hands out sandboxes with the set imported; failures name the package."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harombe.config import parse_config
from harombe.errors import PackageNotFoundError, UsageError, WorkspacePathError
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def manager(
    docker_manager: DockerManager, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SandboxManager]:
    """A manager with an install cache of its own (starts empty), pools of one."""
    cache = tmp_path_factory.mktemp("install-cache")
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 1},
        "install_cache": {"directory": str(cache)},
    }}})  # fmt: skip
    made = SandboxManager(docker_manager=docker_manager, runtime="runsc", config=config)
    await made.start()
    yield made
    await made.stop()


async def fresh(manager: SandboxManager) -> str:
    return (await manager.create_sandbox("python")).sandbox_id


async def test_a_cached_install_in_a_new_sandbox_downloads_nothing(manager: SandboxManager) -> None:
    """The first install downloads and caches; the same install in a new sandbox is answered
    from the cache; both sandboxes import it in the session, a fresh python3 and the shell."""
    outputs = []
    for _ in range(2):
        sid = await fresh(manager)
        installed = await manager.install_package(sid, "toml==0.10.2")
        assert installed.success, installed
        outputs.append(installed.stdout)
        session = await manager.execute(sid, "import toml\ntoml.__version__")
        fresh_run = await manager.execute(sid, "import toml\nprint(toml.__file__)", fresh=True)
        shell = await manager.execute(
            sid, "python3 -c 'import toml; print(toml.__version__)'", language="shell"
        )
        assert session.result == "'0.10.2'", session
        assert fresh_run.stdout.startswith("/opt/harombe/envs/"), fresh_run
        assert shell.stdout == "0.10.2\n", shell
        await manager.destroy_sandbox(sid)
    assert outputs == [
        "Successfully installed toml-0.10.2 (downloaded, now cached)\n",
        "Successfully installed toml-0.10.2 (from the install cache)\n",
    ]


async def test_environments_are_read_only_inside_the_sandbox(manager: SandboxManager) -> None:
    """Code in a sandbox cannot change, add to or plant links in the shared environments."""
    sid = await fresh(manager)
    assert (await manager.install_package(sid, "toml==0.10.2")).success
    probe = await manager.execute(
        sid,
        "cd /opt/harombe/envs && for op in 'touch new' 'ln -s / link' 'mkdir d' "
        "'sh -c \"echo x >> */site/toml/__init__.py\"' 'rm -rf */site/toml' "
        "'chmod 777 */site'; do if $op 2>/dev/null; then echo \"ALLOWED: $op\"; fi; done; "
        "python3 -c 'import toml; print(toml.__version__)'",
        language="shell",
    )
    assert probe.stdout == "0.10.2\n", probe
    await manager.destroy_sandbox(sid)


async def test_only_environment_paths_are_added_from_pth_files(manager: SandboxManager) -> None:
    """A harombe-env .pth planted by code that names a directory outside the environments is
    not put on the session's sys.path."""
    sid = await fresh(manager)
    planted = await manager.execute(
        sid,
        "import os, site, sys\nos.makedirs('/workspace/evil', exist_ok=True)\n"
        "open('/workspace/evil/evilmod.py', 'w').write('X = 1')\n"
        "os.makedirs(site.getusersitepackages(), exist_ok=True)\n"
        "open(os.path.join(site.getusersitepackages(), 'harombe-env-x.pth'), 'w')"
        ".write('/workspace/evil\\n')",
    )
    assert planted.success, planted
    after = await manager.execute(sid, "import sys\n'/workspace/evil' in sys.path")
    assert after.result == "False", after
    await manager.destroy_sandbox(sid)


async def test_concurrent_installs_of_a_new_set_share_one_build(manager: SandboxManager) -> None:
    """Two sandboxes installing the same uncached package at once both succeed, with one
    environment between them."""
    sids = [await fresh(manager), await fresh(manager)]
    results = await asyncio.gather(*(manager.install_package(s, "idna==3.7") for s in sids))
    assert all(r.success for r in results), results
    assert sorted(r.stdout for r in results) == [  # one built it, the other waited and reused
        "Successfully installed idna-3.7 (downloaded, now cached)\n",
        "Successfully installed idna-3.7 (from the install cache)\n",
    ]
    store = manager.installs.store
    assert store is not None
    with_idna = [p for p in store.envs.iterdir() if (p / "site" / "idna").is_dir()]
    assert len(with_idna) == 1
    for sid in sids:
        used = await manager.execute(sid, "import idna\nidna.__version__")
        assert used.result == "'3.7'", used
        await manager.destroy_sandbox(sid)


async def test_a_named_environment_comes_from_its_own_pool_preimported(
    manager: SandboxManager,
) -> None:
    """prepare_environment reports each step and fills the environment's pool; a sandbox
    created with it has the set imported before any code ran, and two such sandboxes do not
    share state."""
    steps: list[str] = []
    manager.define_environment("tiny", ["toml==0.10.2", "six==1.16.0"], preimport=["toml"])
    env = await manager.prepare_environment("tiny", on_progress=steps.append)
    assert set(env.wheels) == {"toml-0.10.2", "six-1.16.0"}
    assert steps and steps[0] == "resolving toml==0.10.2"
    await manager.wait_pool_settled()
    first = await manager.create_sandbox("python", environment="tiny")
    check = await manager.execute(
        first.sandbox_id, "import sys\nmarked = 1\n('toml' in sys.modules, 'six' in sys.modules)"
    )
    assert check.result == "(True, False)", check
    assert first.environment == env.key
    second = await manager.create_sandbox("python", environment="tiny")
    other = await manager.execute(second.sandbox_id, "'marked' in globals()")
    assert other.result == "False", other
    for box in (first, second):
        await manager.destroy_sandbox(box.sandbox_id)


async def test_a_list_of_requirements_is_an_environment_too(manager: SandboxManager) -> None:
    """create_sandbox(environment=[...]) gives a sandbox with those packages importable."""
    box = await manager.create_sandbox("python", environment=["toml==0.10.2"])
    used = await manager.execute(box.sandbox_id, "import toml\ntoml.__version__")
    assert used.result == "'0.10.2'", used
    await manager.destroy_sandbox(box.sandbox_id)


@pytest.mark.parametrize(
    ("environment", "error", "needle"),
    [
        ("no-such-env", UsageError, "no environment named 'no-such-env'"),
        (["harombe-no-such-package-zz==0.0.1"], PackageNotFoundError,
         "harombe-no-such-package-zz"),
        (["git+https://example.invalid/x"], Exception, "URL or path"),
    ],
    ids=["unknown-name", "missing-package", "url"],
)  # fmt: skip
async def test_a_failing_environment_names_what_failed(
    manager: SandboxManager, environment: object, error: type[Exception], needle: str
) -> None:
    """An unknown name, a package the index does not have, or a URL fails with an error that
    names it, and no sandbox is left behind."""
    before = set(manager.sandboxes)
    with pytest.raises(error, match=needle.replace("+", r"\+")):
        await manager.create_sandbox("python", environment=environment)  # type: ignore[arg-type]
    assert set(manager.sandboxes) == before


async def test_an_environment_needs_python(manager: SandboxManager) -> None:
    """Asking for an environment in a JavaScript sandbox is a usage error saying so."""
    with pytest.raises(UsageError, match="language='python'"):
        await manager.create_sandbox("javascript", environment=["toml"])


async def test_a_planted_link_in_the_user_site_is_refused(manager: SandboxManager) -> None:
    """A user site that code replaced by a symlink out is never written through: the install
    fails with the path named and the link's target is untouched."""
    sid = await fresh(manager)
    planted = await manager.execute(
        sid,
        "mkdir -p ~/.local/lib/python3.11 /tmp/elsewhere && "
        "ln -s /tmp/elsewhere ~/.local/lib/python3.11/site-packages",
        language="shell",
    )
    assert planted.success, planted
    with pytest.raises(WorkspacePathError, match=r"site-packages.*/tmp/elsewhere"):
        await manager.install_package(sid, "toml==0.10.2")
    listing = await manager.execute(sid, "ls -A /tmp/elsewhere", language="shell")
    assert listing.stdout == "", listing
    await manager.destroy_sandbox(sid)


async def test_install_cache_can_be_switched_off(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """With install_cache.enabled false, installs use the sandbox's pip and sandboxes get no
    environments mount; environments are refused with the setting to change."""
    config = parse_config({"security": {"sandbox": {"install_cache": {"enabled": False},
                                                     "pool": {"size": 0}}}})  # fmt: skip
    manager = SandboxManager(docker_manager=docker_manager, runtime="runsc", config=config)
    await manager.start()
    try:
        sid = await fresh(manager)
        installed = await manager.install_package(sid, "toml==0.10.2")
        assert installed.success and "Successfully installed toml-0.10.2" in installed.stdout
        assert "cache" not in installed.stdout
        mounted = await manager.execute(sid, "test -e /opt/harombe/envs && echo yes || echo no",
                                        language="shell")  # fmt: skip
        assert mounted.stdout == "no\n", mounted
        with pytest.raises(UsageError, match=r"install_cache\.enabled"):
            await manager.create_sandbox("python", environment=["toml"])
    finally:
        await manager.stop()


async def test_code_execute_takes_an_environment_for_a_new_sandbox(
    manager: SandboxManager,
) -> None:
    """code_execute(environment=name) runs in a new sandbox of that environment; with a
    sandbox_id, an unknown name, or JavaScript, it is a failed result naming the problem."""
    from harombe.tools.code_execution import CodeExecutionTools

    tools = CodeExecutionTools(sandbox_manager=manager, hitl_gate=None)
    manager.define_environment("tools-env", ["toml==0.10.2"], preimport=["toml"])
    ran = await tools.code_execute(
        language="python", code="import sys\n'toml' in sys.modules", environment="tools-env"
    )
    assert ran["success"] and ran["result"] == "True", ran
    refusals = [
        ({"sandbox_id": ran["sandbox_id"], "environment": "tools-env"}, "leave it out"),
        ({"environment": "nope"}, "no environment named 'nope'"),
        ({"environment": "tools-env", "language": "javascript"}, "language 'python'"),
        ({"environment": "../x"}, "environment must be"),
    ]
    for extra, needle in refusals:
        call = {"language": "python", "code": "1", **extra}
        refused = await tools.code_execute(**call)
        assert not refused["success"] and needle in refused["error"], (extra, refused)
    await tools.code_destroy_sandbox(ran["sandbox_id"])

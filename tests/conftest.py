"""Fixtures that drive real gVisor containers. No Docker → these tests fail, never skip.

A test that uses ``docker_manager`` (directly or through another fixture) is marked
``integration``; everything else must run without Docker (``scripts/test.sh --unit``)."""

from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_docker = "docker_manager" in getattr(item, "fixturenames", ())
        if uses_docker and "tests/unit/" in str(item.fspath):
            # Marked integration, it would be deselected by `scripts/test.sh --unit` in silence.
            raise pytest.UsageError(
                f"{item.nodeid} uses Docker, but tests/unit needs none; move it to "
                "tests/integration or use harombe.testing.FakeDocker"
            )
        if uses_docker or "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _keep_the_log_configuration() -> Iterator[None]:
    """A test that runs a CLI command in-process configures logging for the process (quiet
    unless -v); later tests read harombe's events, so each test's configuration is undone."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
async def docker_manager() -> AsyncIterator[DockerManager]:
    manager = DockerManager()
    await manager.start()  # raises DockerUnavailableError when there is no daemon: a failure
    yield manager
    await manager.stop()


@pytest.fixture(scope="session")
async def sandbox_manager(docker_manager: DockerManager) -> AsyncIterator[SandboxManager]:
    manager = SandboxManager(docker_manager=docker_manager, runtime="runsc")
    await manager.start()
    yield manager
    await manager.stop()


@pytest.fixture(scope="session")
async def tools(sandbox_manager: SandboxManager) -> CodeExecutionTools:
    return CodeExecutionTools(sandbox_manager=sandbox_manager, hitl_gate=None)


@pytest.fixture(scope="session")
async def sandbox_id(tools: CodeExecutionTools) -> str:
    """One shared Python sandbox for tests that do not change its state in lasting ways."""
    result = await tools.code_execute(language="python", code="print('ready')")
    assert result["success"], result
    return str(result["sandbox_id"])


@pytest.fixture
async def fresh_sandbox(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A sandbox of its own, destroyed after the test."""
    result = await tools.code_execute(language="python", code="pass")
    assert result["success"], result
    yield str(result["sandbox_id"])
    await tools.code_destroy_sandbox(result["sandbox_id"])

"""The usage guide's examples, run as written (registry hosts read from this machine's config)."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

REPO = Path(__file__).resolve().parents[2]


def _pypi_hosts() -> list[str]:
    from pip._internal.models.index import PyPI

    return [PyPI.netloc, urlparse(PyPI.file_storage_domain).netloc or PyPI.file_storage_domain]


def _npm_hosts() -> list[str]:
    url = subprocess.run(
        ["npm", "config", "get", "registry"], capture_output=True, text=True
    ).stdout
    return [urlparse(url.strip()).netloc]


def test_quick_start_runs_unchanged() -> None:
    """docs/examples/quick_start.py (the guide's Quick Start verbatim) prints its greeting."""
    out = subprocess.run(
        [sys.executable, str(REPO / "docs/examples/quick_start.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Success: True" in out.stdout
    assert "Hello from gVisor sandbox!" in out.stdout
    assert "Sandbox ID: sandbox-" in out.stdout


async def test_language_examples(tools: CodeExecutionTools) -> None:
    """The guide's Python, JavaScript and shell examples produce their output."""
    py = await tools.code_execute(
        language="python",
        code="""
import math
result = math.sqrt(144)
print(f"Square root of 144 is {result}")
""",
    )
    assert py["stdout"] == "Square root of 144 is 12.0\n"
    js = await tools.code_execute(
        language="javascript",
        code="""
const data = [1, 2, 3, 4, 5];
const sum = data.reduce((a, b) => a + b, 0);
console.log(`Sum: ${sum}`);
""",
    )
    assert js["stdout"] == "Sum: 15\n"
    sh = await tools.code_execute(
        language="shell",
        code="""
echo "Shell: $BASH_VERSION"
ls -la /workspace
""",
    )
    assert sh["stdout"].startswith("Shell: 5.2") and sh["success"]
    for r in (py, js, sh):
        await tools.code_destroy_sandbox(r["sandbox_id"])


async def test_install_examples(docker_manager: DockerManager) -> None:
    """The guide's requests==2.31.0 and axios@1.6.0 install-then-use examples."""
    sandbox_manager = SandboxManager(docker_manager=docker_manager, runtime="runsc")
    await sandbox_manager.start()
    tools = CodeExecutionTools(sandbox_manager=sandbox_manager, hitl_gate=None)
    try:
        result = await tools.code_execute(
            language="python",
            code="print('Setting up sandbox')",
            network_enabled=True,
            allowed_domains=_pypi_hosts(),
        )
        sandbox_id = result["sandbox_id"]
        install_result = await tools.code_install_package(
            sandbox_id=sandbox_id,
            package="requests==2.31.0",
            registry="pypi",
        )
        assert install_result["success"], install_result
        assert install_result["package"] == "requests==2.31.0"
        exec_result = await tools.code_execute(
            language="python",
            sandbox_id=sandbox_id,
            code="""
import requests
print(f"Requests version: {requests.__version__}")
""",
        )
        assert exec_result["stdout"] == "Requests version: 2.31.0\n"

        result = await tools.code_execute(
            language="javascript",
            code="console.log('Setup')",
            network_enabled=True,
            allowed_domains=_npm_hosts(),
        )
        installed = await tools.code_install_package(
            sandbox_id=result["sandbox_id"],
            package="axios@1.6.0",
            registry="npm",
        )
        assert installed["success"], installed
        used = await tools.code_execute(
            language="javascript",
            sandbox_id=result["sandbox_id"],
            code="""
const axios = require('axios');
console.log('Axios loaded');
""",
        )
        assert used["stdout"] == "Axios loaded\n", used
    finally:
        await sandbox_manager.stop()


def test_data_processing_pipeline_runs_end_to_end() -> None:
    """docs/examples/data_pipeline.py: pandas installed, CSV processed, results read back."""
    # Its first call asks for network, which is CRITICAL: the default policy asks a person,
    # and nobody is at this test's terminal, so CRITICAL runs unasked here.
    unattended = {**os.environ, "HAROMBE__SECURITY__HITL__AUTO_APPROVE_UP_TO": "critical"}
    out = subprocess.run(
        [sys.executable, str(REPO / "docs/examples/data_pipeline.py")],
        env=unattended,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for line in (
        "Output: Processing complete!",
        "Total Sales: $625",
        "Average Sale: $156.25",
        " Gadget: $325",
        " Widget: $300",
        "Files created: ['data', 'results.txt']",
    ):
        assert line in out.stdout, out.stdout  # fmt: skip


async def test_custom_limits_with_a_per_execution_override(docker_manager: DockerManager) -> None:
    """The guide's Custom Limits (max_execution_time=60), then timeout=120 for one execution:
    the call gets its 120 s, not the default."""
    sandbox_manager = SandboxManager(
        docker_manager=docker_manager,
        runtime="runsc",
        max_memory_mb=1024,  # 1GB RAM
        max_cpu_cores=1.0,  # 1 full CPU core
        max_disk_mb=2048,  # 2GB disk
        max_execution_time=60,  # 60 seconds
    )
    await sandbox_manager.start()
    tools = CodeExecutionTools(sandbox_manager=sandbox_manager, hitl_gate=None)
    try:
        result = await tools.code_execute(
            language="python",
            code="# ... long-running task ...",
            timeout=120,  # 2 minutes for this execution
        )
        assert result["success"], result
        assert result["timeout_s"] == 120 and result["warnings"] == []
    finally:
        await sandbox_manager.stop()

"""The usage guide's Quick Start, unchanged."""

import asyncio

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


async def main():
    # Create managers
    docker_manager = DockerManager()
    await docker_manager.start()
    sandbox_manager = SandboxManager(
        docker_manager=docker_manager,
        runtime="runsc",  # gVisor runtime
    )
    await sandbox_manager.start()
    # Create code execution tools
    tools = CodeExecutionTools(sandbox_manager=sandbox_manager)
    try:
        # Execute Python code (creates new sandbox automatically)
        result = await tools.code_execute(
            language="python",
            code="""
import sys
print(f"Python {sys.version}")
print("Hello from gVisor sandbox!")
""",
        )
        print(f"Success: {result['success']}")
        print(f"Sandbox ID: {result['sandbox_id']}")
        print(f"Output:\\n{result['stdout']}")
        # Cleanup
        await tools.code_destroy_sandbox(result["sandbox_id"])
    finally:
        await sandbox_manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    asyncio.run(main())

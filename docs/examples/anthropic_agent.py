"""An agent loop with Anthropic-style tool use over harombe's six tools.

``client`` is an ``anthropic.AsyncAnthropic`` (or any client with the same Messages API).
Run it with ``ANTHROPIC_API_KEY`` set: ``python docs/examples/anthropic_agent.py "your task"``.
"""

import asyncio
import sys

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools import anthropic_tool_result, anthropic_tools, dispatch
from harombe.tools.code_execution import CodeExecutionTools


async def run_agent(client, tools, task, *, model="claude-sonnet-4-5", max_turns=20):
    """Let the model use the tools until it answers in text; return that answer."""
    messages = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        response = await client.messages.create(
            model=model, max_tokens=4096, messages=messages, tools=anthropic_tools(),
            system="Use the code tools to compute answers. Destroy sandboxes you no longer need.",
        )
        uses = [block for block in response.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in response.content if block.type == "text")
        messages.append({"role": "assistant", "content": response.content})
        # Every tool_use gets its tool_result in the next user message; images a call
        # displayed go back as image blocks the model can see.
        results = [
            anthropic_tool_result(use.id, await dispatch(tools, use.name, use.input))
            for use in uses
        ]
        messages.append({"role": "user", "content": results})
    return "(stopped after max_turns tool calls)"


async def main(task):
    from anthropic import AsyncAnthropic

    docker_manager = DockerManager()
    await docker_manager.start()
    sandbox_manager = SandboxManager(docker_manager=docker_manager, runtime="runsc")
    await sandbox_manager.start()
    try:
        tools = CodeExecutionTools(sandbox_manager=sandbox_manager)
        print(await run_agent(AsyncAnthropic(), tools, task))
    finally:
        await sandbox_manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is the 30th Fibonacci number?"))

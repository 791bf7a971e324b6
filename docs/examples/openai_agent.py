"""An agent loop with OpenAI-style function calling over harombe's six tools.

``client`` is an ``openai.AsyncOpenAI`` (or any client with the same chat-completions API).
Run it with ``OPENAI_API_KEY`` set: ``python docs/examples/openai_agent.py "your task"``.
"""

import asyncio
import sys

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools import dispatch, openai_tool_message, openai_tools
from harombe.tools.code_execution import CodeExecutionTools


async def run_agent(client, tools, task, *, model="gpt-4.1", max_turns=20):
    """Let the model call the tools until it answers in text; return that answer."""
    messages = [
        {"role": "system", "content": "Use the code tools to compute answers. Destroy "
         "sandboxes you no longer need."},
        {"role": "user", "content": task},
    ]
    for _ in range(max_turns):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=openai_tools()
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append({
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}
                for call in message.tool_calls
            ],
        })
        for call in message.tool_calls:
            # dispatch validates the JSON arguments; a bad call comes back as an error the
            # model can read and correct, never as an exception.
            result = await dispatch(tools, call.function.name, call.function.arguments)
            messages.append(openai_tool_message(call.id, result))
    return "(stopped after max_turns tool calls)"


async def main(task):
    from openai import AsyncOpenAI

    docker_manager = DockerManager()
    await docker_manager.start()
    sandbox_manager = SandboxManager(docker_manager=docker_manager, runtime="runsc")
    await sandbox_manager.start()
    try:
        tools = CodeExecutionTools(sandbox_manager=sandbox_manager)
        print(await run_agent(AsyncOpenAI(), tools, task))
    finally:
        await sandbox_manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is the 30th Fibonacci number?"))

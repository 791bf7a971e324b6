"""docs/examples/openai_agent.py and anthropic_agent.py run as written, against real gVisor, with
a scripted client shaped like each SDK's (objects with the SDKs' attribute names)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from types import SimpleNamespace as NS
from typing import Any

import pytest

from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
FIB = "a, b = 0, 1\nfor _ in range(30):\n    a, b = b, a + b\na"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedOpenAI:
    """``client.chat.completions.create`` answering with a tool call, then (after reading the
    tool's answer) with text; records what it was sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.chat = NS(completions=NS(create=self.create))

    async def create(self, **request: Any) -> Any:
        self.requests.append(json.loads(json.dumps(request)))
        last = request["messages"][-1]
        if last["role"] == "user":
            call = NS(
                id="call_1",
                type="function",
                function=NS(
                    name="code_execute",
                    arguments=json.dumps({"language": "python", "code": FIB}),
                ),
            )
            message = NS(content=None, tool_calls=[call])
        elif last["role"] == "tool" and "result" in json.loads(last["content"]):
            sid = self.sid = json.loads(last["content"])["sandbox_id"]
            result = json.loads(last["content"])["result"]
            self.answer = f"It is {result}."
            call = NS(
                id="call_2",
                type="function",
                function=NS(name="code_destroy_sandbox", arguments=json.dumps({"sandbox_id": sid})),
            )
            message = NS(content=None, tool_calls=[call])
        else:
            message = NS(content=self.answer, tool_calls=None)
        return NS(choices=[NS(message=message)])


class ScriptedAnthropic:
    """``client.messages.create`` answering with tool_use blocks, then text."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.messages = NS(create=self.create)

    async def create(self, **request: Any) -> Any:
        self.requests.append(request)
        last = request["messages"][-1]
        if isinstance(last["content"], str):
            use = NS(type="tool_use", id="toolu_1", name="code_execute",
                     input={"language": "python", "code": FIB})  # fmt: skip
            return NS(content=[NS(type="text", text="Computing."), use], stop_reason="tool_use")
        answer = json.loads(last["content"][0]["content"][0]["text"])
        if answer.get("result"):
            self.answer = f"It is {answer['result']}."
            self.sid = answer["sandbox_id"]
            use = NS(type="tool_use", id="toolu_2", name="code_destroy_sandbox",
                     input={"sandbox_id": answer["sandbox_id"]})  # fmt: skip
            return NS(content=[use], stop_reason="tool_use")
        return NS(content=[NS(type="text", text=self.answer)], stop_reason="end_turn")


async def test_the_openai_example_loop_answers(tools: CodeExecutionTools) -> None:
    """The OpenAI example offers the six tools, runs the model's calls, returns its answer."""
    client = ScriptedOpenAI()
    answer = await example("openai_agent").run_agent(client, tools, "fib 30")
    assert answer == "It is 832040."
    assert len(client.requests) == 3
    assert len(client.requests[0]["tools"]) == 6
    assert client.sid.startswith("sandbox-")  # its sandbox is gone; others may live on
    assert client.sid not in tools.sandbox_manager.sandboxes


async def test_the_anthropic_example_loop_answers(tools: CodeExecutionTools) -> None:
    """The Anthropic example offers the six tools, answers each tool_use, returns the text."""
    client = ScriptedAnthropic()
    answer = await example("anthropic_agent").run_agent(client, tools, "fib 30")
    assert answer == "It is 832040."
    assert len(client.requests) == 3
    assert client.requests[0]["tools"][0]["name"] == "code_execute"
    assert client.sid.startswith("sandbox-")  # its sandbox is gone; others may live on
    assert client.sid not in tools.sandbox_manager.sandboxes


async def test_a_loop_that_never_ends_is_stopped(tools: CodeExecutionTools) -> None:
    """A model that keeps calling tools is stopped after max_turns."""

    class Forever(ScriptedOpenAI):
        async def create(self, **request: Any) -> Any:
            self.requests.append(request)
            call = NS(id="c", type="function", function=NS(name="nope", arguments="{}"))
            return NS(choices=[NS(message=NS(content=None, tool_calls=[call]))])

    client = Forever()
    answer = await example("openai_agent").run_agent(client, tools, "loop", max_turns=3)
    assert "max_turns" in answer and len(client.requests) == 3

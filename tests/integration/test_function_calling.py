"""A scripted "model" drives the six tools through OpenAI- and Anthropic-style tool-calling loops,
against real gVisor sandboxes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from harombe.tools import (
    anthropic_tool_result,
    anthropic_tools,
    dispatch,
    openai_tool_message,
    openai_tools,
)
from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

#: One turn of the scripted model: given the last tool result (None at the start), the tool
#: call it makes next (name, arguments), or None when it is done.
Turn = Callable[[dict[str, Any] | None], tuple[str, dict[str, Any]] | None]


def script() -> list[Turn]:
    """A task a model would do in five calls, each reading the previous result as a model does:
    run code, write a file with the sandbox id it got back, run code on that file, read the
    file the code wrote, list, destroy."""
    seen: dict[str, Any] = {}

    def run(_: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        return "code_execute", {"language": "python", "code": "total = sum(range(10))\ntotal"}

    def write(last: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        assert last is not None and last["result"] == "45", last
        seen["sid"] = last["sandbox_id"]
        return "code_write_file", {
            "sandbox_id": seen["sid"],
            "file_path": "data/nums.txt",
            "content": "1\n2\n3\n",
        }

    def compute(last: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        assert last is not None and last["success"], last
        code = (
            "nums = [int(x) for x in open('data/nums.txt')]\n"
            "open('out.txt', 'w').write(str(total + sum(nums)))\n"
            "print('wrote', total + sum(nums))"
        )
        return "code_execute", {"language": "python", "code": code, "sandbox_id": seen["sid"]}

    def read(last: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        assert last is not None and last["stdout"] == "wrote 51\n", last
        return "code_read_file", {"sandbox_id": seen["sid"], "file_path": "out.txt"}

    def listing(last: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        assert last is not None and last["content"] == "51", last
        return "code_list_files", {"sandbox_id": seen["sid"]}

    def destroy(last: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        assert last is not None and {"data", "out.txt"} <= set(last["files"]), last
        return "code_destroy_sandbox", {"sandbox_id": seen["sid"]}

    def done(last: dict[str, Any] | None) -> None:
        assert last is not None and last["success"], last
        return None

    return [run, write, compute, read, listing, destroy, done]


def check_against(schemas: dict[str, dict[str, Any]], name: str, args: dict[str, Any]) -> None:
    """A model only sends arguments that fit the schema it was given."""
    jsonschema.Draft202012Validator(schemas[name]).validate(args)


async def test_an_openai_style_loop_runs_a_task(tools: CodeExecutionTools) -> None:
    """Assistant messages with tool_calls (JSON text arguments) and tool messages back, turn
    by turn, until the model stops calling tools; the sandbox is gone at the end."""
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in openai_tools()}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "sum things"}]
    last: dict[str, Any] | None = None
    made: set[str] = set()  # the sandboxes the loop's calls ran in
    for number, turn in enumerate(script()):
        call = turn(last)
        if call is None:
            messages.append({"role": "assistant", "content": "The answer is 51."})
            break
        name, args = call
        check_against(offered, name, args)
        call_id = f"call_{number}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        # What a loop does with the model's message: the arguments arrive as JSON text.
        sent = messages[-1]["tool_calls"][0]
        last = await dispatch(tools, sent["function"]["name"], sent["function"]["arguments"])
        made.add(last["sandbox_id"])
        messages.append(openai_tool_message(call_id, last))
        assert json.loads(messages[-1]["content"])["success"] == last["success"]
    assert messages[-1]["content"] == "The answer is 51."
    assert sum(m["role"] == "tool" for m in messages) == 6
    # The model's one sandbox is gone (other tests' sandboxes may be alive: shared tools).
    assert len(made) == 1 and made.isdisjoint(tools.sandbox_manager.sandboxes)


async def test_an_anthropic_style_loop_runs_a_task(tools: CodeExecutionTools) -> None:
    """Assistant tool_use blocks (input objects) and user tool_result blocks back, until the
    model answers in text; the sandbox is gone at the end."""
    offered = {t["name"]: t["input_schema"] for t in anthropic_tools()}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "sum things"}]
    last: dict[str, Any] | None = None
    made: set[str] = set()  # the sandboxes the loop's calls ran in
    for number, turn in enumerate(script()):
        call = turn(last)
        if call is None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "51"}]})
            break
        name, args = call
        check_against(offered, name, args)
        block = {"type": "tool_use", "id": f"toolu_{number}", "name": name, "input": args}
        messages.append({"role": "assistant", "content": [block]})
        last = await dispatch(tools, block["name"], block["input"])
        made.add(last["sandbox_id"])
        messages.append({"role": "user", "content": [anthropic_tool_result(block["id"], last)]})
        answer = messages[-1]["content"][0]
        assert answer["tool_use_id"] == block["id"] and "is_error" not in answer
    assert messages[-1]["content"][0]["text"] == "51"
    assert sum(m["role"] == "user" for m in messages) == 7
    # The model's one sandbox is gone (other tests' sandboxes may be alive: shared tools).
    assert len(made) == 1 and made.isdisjoint(tools.sandbox_manager.sandboxes)


async def test_a_model_mistake_is_an_answer_it_can_recover_from(tools: CodeExecutionTools) -> None:
    """A wrong call (a made-up tool, then a missing parameter) comes back as an error text the
    loop sends to the model, and the corrected call runs."""
    wrong = await dispatch(tools, "python", '{"code": "print(1)"}')
    assert wrong["success"] is False and "code_execute" in wrong["error"]
    missing = await dispatch(tools, "code_execute", '{"code": "print(1)"}')
    assert missing["success"] is False and "language is required" in missing["error"]
    block = anthropic_tool_result("toolu_x", missing)
    assert block["is_error"] is True and "language is required" in block["content"][0]["text"]
    fixed = await dispatch(tools, "code_execute", '{"language": "python", "code": "print(1)"}')
    assert fixed["stdout"] == "1\n"
    await tools.code_destroy_sandbox(fixed["sandbox_id"])


async def test_streamed_output_reaches_the_loop_as_it_is_printed(
    tools: CodeExecutionTools,
) -> None:
    """dispatch's on_output gets each line of a slow program before the call returns."""
    chunks: list[bytes] = []
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)"
    result = await dispatch(
        tools,
        "code_execute",
        {"language": "python", "code": code},
        on_output=lambda stream, data: chunks.append(data),
    )
    assert result["stdout"] == "0\n1\n2\n"
    assert len(chunks) >= 2 and b"".join(chunks) == b"0\n1\n2\n"
    await tools.code_destroy_sandbox(result["sandbox_id"])

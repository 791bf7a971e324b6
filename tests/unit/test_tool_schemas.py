"""Tool schemas in both function-calling formats, and dispatch of a model's calls (no Docker)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from harombe.errors import UnknownToolError
from harombe.testing import capture_events
from harombe.tools import (
    TOOL_NAMES,
    anthropic_tool_result,
    anthropic_tools,
    dispatch,
    input_schema,
    openai_tool_message,
    openai_tools,
    tool_result_text,
)
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.params import TOOL_ARGS
from tests.unit.fake_manager import running

SIX = (
    "code_execute",
    "code_install_package",
    "code_write_file",
    "code_read_file",
    "code_list_files",
    "code_destroy_sandbox",
)


def _walk(node: Any) -> list[Any]:
    found = [node]
    if isinstance(node, dict):
        for value in node.values():
            found += _walk(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk(value)
    return found


def test_the_six_tools_are_offered_in_both_formats() -> None:
    """openai_tools and anthropic_tools name the six tools, in the same order."""
    assert TOOL_NAMES == SIX
    assert [t["function"]["name"] for t in openai_tools()] == list(SIX)
    assert [t["name"] for t in anthropic_tools()] == list(SIX)
    assert all(t["type"] == "function" for t in openai_tools())


@pytest.mark.parametrize("name", SIX)
def test_a_schema_is_its_model_rendered(name: str) -> None:
    """Each schema's properties and required list are the pydantic model's, not a second copy."""
    model = TOOL_ARGS[name]
    schema = input_schema(name)
    assert set(schema["properties"]) == set(model.model_fields)
    required = {k for k, f in model.model_fields.items() if f.is_required()}
    assert set(schema.get("required", [])) == required
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    generated = model.model_json_schema()["properties"]
    for key, prop in schema["properties"].items():
        assert prop["description"] == generated[key]["description"]


@pytest.mark.parametrize("name", SIX)
def test_a_schema_is_valid_json_schema_with_every_parameter_described(name: str) -> None:
    """Every schema is valid JSON Schema, every parameter has a description, no titles."""
    schema = input_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert all(p.get("description") for p in schema["properties"].values())
    assert not any(isinstance(n, dict) and "title" in n for n in _walk(schema))
    json.dumps(schema)


def test_both_formats_carry_the_same_schema_and_description() -> None:
    """The OpenAI parameters and the Anthropic input_schema of a tool are equal."""
    for oa, an in zip(openai_tools(), anthropic_tools(), strict=True):
        assert oa["function"]["parameters"] == an["input_schema"]
        assert oa["function"]["description"] == an["description"]
        assert len(an["description"]) > 60


def test_a_schema_is_a_copy_the_caller_may_change() -> None:
    """Changing a returned schema does not change the next one."""
    input_schema("code_execute")["properties"].clear()
    assert "code" in input_schema("code_execute")["properties"]


def test_an_unknown_tool_has_no_schema() -> None:
    """input_schema of a name that is not a tool raises UnknownToolError listing the tools."""
    with pytest.raises(UnknownToolError, match="code_execute"):
        input_schema("rm_rf")


# What the schema accepts, the model accepts, and the other way round (a few table cases).
AGREEMENT = [
    ("code_execute", {"language": "python", "code": "1"}, True),
    ("code_execute", {"language": "ruby", "code": "1"}, False),
    ("code_execute", {"code": "1"}, False),
    ("code_execute", {"language": "python", "code": "1", "bogus": 1}, False),
    ("code_execute", {"language": "python", "code": "1", "timeout": 0}, False),
    ("code_execute", {"language": "python", "code": "1", "fresh": "true"}, False),
    ("code_read_file", {"sandbox_id": "sandbox-0123456789ab", "file_path": "a.txt"}, True),
    ("code_list_files", {"sandbox_id": "sandbox-0123456789ab"}, True),
    ("code_install_package", {"sandbox_id": "sandbox-0123456789ab", "package": "six"}, True),
    ("code_destroy_sandbox", {}, False),
]


@pytest.mark.parametrize(
    ("name", "arguments", "accepted"),
    AGREEMENT,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(AGREEMENT)],
)
def test_the_schema_and_the_model_agree(
    name: str, arguments: dict[str, Any], accepted: bool
) -> None:
    """A table of arguments the JSON schema and the tool's model both accept or both refuse."""
    valid = jsonschema.Draft202012Validator(input_schema(name)).is_valid(arguments)
    assert valid is accepted
    try:
        TOOL_ARGS[name].model_validate(arguments)
        parsed = True
    except Exception:  # noqa: BLE001 - any refusal counts
        parsed = False
    assert parsed is accepted


REFUSED = [
    ("unknown-tool", "rm_rf", {}, "UnknownToolError", "code_execute"),
    ("stream-is-not-offered", "code_execute_stream", {}, "UnknownToolError", "code_execute"),
    ("name-not-text", 7, {}, "UnknownToolError", "must be text"),
    ("not-json", "code_execute", "{language: python", "InvalidArgumentError", "not valid JSON"),
    ("json-list", "code_execute", "[1, 2]", "InvalidArgumentError", "one JSON object"),
    ("list", "code_execute", ["python"], "InvalidArgumentError", "one JSON object"),
    ("unknown-param", "code_list_files", {"sandbox_id": "sandbox-0123456789ab", "rm": 1},
     "InvalidArgumentError", "unknown parameter"),
    ("missing-param", "code_execute", {"language": "python"}, "InvalidArgumentError",
     "code is required"),
    ("on-output-not-injectable", "code_execute",
     {"language": "python", "code": "1", "on_output": "print"}, "InvalidArgumentError",
     "unknown parameter"),
    ("deep-json", "code_execute", "[" * 100_000, "InvalidArgumentError", "JSON"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "arguments", "kind", "says"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_dispatch_refuses_what_is_not_a_tool_call(
    name: Any, arguments: Any, kind: str, says: str
) -> None:
    """A bad call comes back as success False with an error naming the fix; nothing runs."""
    async with running() as (docker, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        with capture_events() as events:
            result = await dispatch(tools, name, arguments)
        assert result["success"] is False
        assert result["error"].startswith(f"{kind}: ") and says in result["error"]
        assert not manager.sandboxes and not docker.containers
        assert [e["event"] for e in events if e["event"].startswith("tool.")] in (
            ["tool.dispatch_refused"],
            [],
        )


async def test_dispatch_runs_json_text_arguments_and_streams_output() -> None:
    """OpenAI-style JSON text arguments run the tool; on_output receives the printed text."""
    async with running() as (_, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        seen: list[tuple[str, bytes]] = []
        result = await dispatch(
            tools,
            "code_execute",
            json.dumps({"language": "python", "code": "print('hi')"}),
            on_output=lambda stream, text: seen.append((stream, text)),
        )
        assert result["success"] is True, result
        assert b"".join(t for s, t in seen if s == "stdout").decode() == result["stdout"]
        listed = await dispatch(tools, "code_list_files", {"sandbox_id": result["sandbox_id"]})
        assert listed["success"] is True
        gone = await dispatch(tools, "code_destroy_sandbox", {"sandbox_id": result["sandbox_id"]})
        assert gone["success"] is True and not manager.sandboxes


async def test_dispatch_goes_through_the_tool_so_its_validation_applies() -> None:
    """A value the tool refuses (the string 'false' for a flag) is refused by dispatch too."""
    async with running() as (_, manager):
        tools = CodeExecutionTools(manager, hitl_gate=None)
        result = await dispatch(
            tools, "code_execute", {"language": "python", "code": "1", "fresh": "false"}
        )
        assert result["success"] is False and "fresh" in result["error"]
        assert not manager.sandboxes


IMAGE = {"kind": "image", "mime_type": "image/png", "data": "iVBORw0KGgo=", "source": "figure 1"}


def test_result_text_leaves_image_data_out() -> None:
    """The text given to a model names each image but does not carry its base64 data."""
    text = tool_result_text({"success": True, "stdout": "x", "artifacts": [IMAGE]})
    assert "iVBORw0KGgo=" not in text
    assert json.loads(text)["artifacts"][0]["source"] == "figure 1"


def test_openai_tool_message_answers_the_call() -> None:
    """The OpenAI tool message names the call id and holds the result as JSON text."""
    message = openai_tool_message("call_1", {"success": True, "stdout": "hi\n"})
    assert message["role"] == "tool" and message["tool_call_id"] == "call_1"
    assert json.loads(message["content"])["stdout"] == "hi\n"


@pytest.mark.parametrize(
    ("result", "blocks", "is_error"),
    [
        ({"success": True, "artifacts": [IMAGE]}, ["text", "image"], False),
        ({"success": True, "artifacts": []}, ["text"], False),
        ({"success": False, "error": "X: y"}, ["text"], True),
    ],
    ids=["with-image", "no-image", "failure"],
)
def test_anthropic_tool_result_carries_images_as_blocks(
    result: dict[str, Any], blocks: list[str], is_error: bool
) -> None:
    """The tool_result block has the text, then one image block per image artifact."""
    block = anthropic_tool_result("toolu_1", result)
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_1"
    assert [c["type"] for c in block["content"]] == blocks
    assert block.get("is_error", False) is is_error
    if "image" in blocks:
        assert block["content"][1]["source"]["data"] == IMAGE["data"]

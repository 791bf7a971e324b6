"""The six tools described to an LLM, and a tool call dispatched back to them.

Each tool's parameters are its pydantic model in :mod:`harombe.tools.params` (the one
definition, also used to validate every call); this module only renders those models as JSON
schemas in the two function-calling shapes agents use, and adds what an LLM needs to pick a
tool: a description of what it does and what comes back.

- :func:`openai_tools` — ``[{"type": "function", "function": {name, description, parameters}}]``
  for OpenAI-style chat completions (and every API that copies it);
- :func:`anthropic_tools` — ``[{name, description, input_schema}]`` for Anthropic's Messages API;
- :func:`dispatch` — a model's tool call (name plus arguments, as a dict or as the JSON text
  OpenAI-style APIs send) run on a :class:`CodeExecutionTools`: the result dict of the tool,
  or ``success: False`` with an error naming the fix when the call names no tool, its
  arguments are not a JSON object, or they do not fit the tool. It never raises for anything a
  model can send;
- :func:`tool_result_text`, :func:`openai_tool_message` and :func:`anthropic_tool_result` —
  a result as the message that goes back to the model (images as image blocks where the format
  has them, never as base64 inside the text).
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import structlog

from harombe.errors import HarombeError, InvalidArgumentError, UnknownToolError
from harombe.host_paths import scrub_host_paths
from harombe.security.runtime.artifacts import utf8_text
from harombe.security.runtime.channel import OutputCallback
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.params import TOOL_ARGS, ToolArgs, parse_args
from harombe.tools.shapes import TEMPLATES, shaped

log = structlog.get_logger(__name__)

#: What each tool does and returns, for the model choosing one. Its parameters are described
#: field by field in the schema.
DESCRIPTIONS: dict[str, str] = {
    "code_execute": (
        "Run Python, JavaScript (Node.js) or shell (bash) code in an isolated gVisor sandbox "
        "with no network unless asked for. Leave sandbox_id out to start a new sandbox; pass "
        "the sandbox_id from an earlier result to run in the same one, keeping its files in "
        "/workspace and, for Python and JavaScript, its variables and imports. Returns "
        "success, stdout, stderr, exit_code, result (the repr of a final bare expression), "
        "error, sandbox_id and execution_time; changed_files lists files the code created or "
        "changed, and artifacts holds images the code displayed (PNG)."
    ),
    "code_install_package": (
        "Install one package into an existing sandbox, from PyPI (registry 'pypi', for "
        "Python) or npm (registry 'npm', for JavaScript). The package is downloaded outside "
        "the sandbox, which stays offline. Returns success, package, registry and error."
    ),
    "code_write_file": (
        "Write a text file into an existing sandbox's /workspace, replacing it if it exists "
        "and creating parent directories. Returns success, file_path (the normalised path) and "
        "error."
    ),
    "code_read_file": (
        "Read a file from an existing sandbox's /workspace: its text, or its bytes as base64 "
        "with encoding='base64'. Returns success, content, file_path and error."
    ),
    "code_list_files": (
        "List a directory of an existing sandbox's /workspace. Returns success, files (the "
        "names), entries (name, type, size of each) and error."
    ),
    "code_destroy_sandbox": (
        "Destroy a sandbox and everything in it (files, processes, state) when the work in it "
        "is done. Returns success and error."
    ),
}

#: The tools, in the order they are offered.
TOOL_NAMES: tuple[str, ...] = tuple(DESCRIPTIONS)

#: Schema keys that only repeat the field or class name: noise in a model's context.
_DROPPED_KEYS = frozenset({"title"})


def _model(name: str) -> type[ToolArgs]:
    if name not in DESCRIPTIONS:
        raise UnknownToolError(f"no tool named {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    return TOOL_ARGS[name]


def _clean(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _clean(v) for k, v in node.items() if k not in _DROPPED_KEYS}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    schema = _clean(_model(name).model_json_schema())
    schema.pop("description", None)  # the tool's description says it, for the model
    return {"type": "object", **schema}


def input_schema(name: str) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of tool ``name``'s arguments, generated from its model;
    a fresh copy the caller may change. :class:`UnknownToolError` for a name that is not a
    tool."""
    return copy.deepcopy(_schema(name))


def description(name: str) -> str:
    """What tool ``name`` does and returns, written for a model choosing a tool."""
    _model(name)
    return DESCRIPTIONS[name]


def openai_tools() -> list[dict[str, Any]]:
    """The six tools in OpenAI's function-calling shape (``tools=`` of a chat completion)."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": DESCRIPTIONS[name],
                "parameters": input_schema(name),
            },
        }
        for name in TOOL_NAMES
    ]


def anthropic_tools() -> list[dict[str, Any]]:
    """The six tools in Anthropic's tool-use shape (``tools=`` of a Messages request)."""
    return [
        {"name": name, "description": DESCRIPTIONS[name], "input_schema": input_schema(name)}
        for name in TOOL_NAMES
    ]


def _arguments(name: str, arguments: object) -> dict[str, Any]:
    """``arguments`` as keyword arguments of tool ``name``; the error that names the fix."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            raise InvalidArgumentError(
                f"the arguments of {name} are not valid JSON; send one JSON object such as "
                '{"language": "python", "code": "print(1)"}'
            ) from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        raise InvalidArgumentError(
            f"the arguments of {name} must be one JSON object of named parameters, got "
            f"{type(arguments).__name__}"
        )
    model = _model(name)
    given = dict(arguments)
    unknown = [key for key in given if key not in model.model_fields]
    missing = [
        key for key, field in model.model_fields.items() if field.is_required() and key not in given
    ]
    if unknown or missing:
        # The model's own error names every unknown and missing parameter and the fix.
        parse_args(model, given)
        raise InvalidArgumentError(f"the arguments of {name} do not fit its parameters")
    return given


async def dispatch(
    tools: CodeExecutionTools,
    name: object,
    arguments: object,
    *,
    on_output: OutputCallback | None = None,
) -> dict[str, Any]:
    """Run a model's call of tool ``name`` with ``arguments`` (a mapping, or its JSON text)
    on ``tools``, and return the tool's result dict.

    Everything goes through the tool method, so validation, the HITL gate and the audit event
    are exactly those of a direct call. A call that names no tool, or whose arguments are not
    one object of the tool's parameters, returns ``success: False`` with an ``error``
    (``UnknownToolError: …`` / ``InvalidArgumentError: …``) the model can act on, and runs
    nothing. ``on_output(stream, data)`` receives ``code_execute``'s output (bytes) as it is
    printed (other tools print nothing)."""
    shown = name if isinstance(name, str) and len(name) <= 64 else None
    try:
        if not isinstance(name, str):
            raise UnknownToolError(
                f"a tool name must be text, got {type(name).__name__}; the tools are "
                f"{', '.join(TOOL_NAMES)}"
            )
        _model(name)
        kwargs = _arguments(name, arguments)
    except HarombeError as err:
        log.info("tool.dispatch_refused", tool=shown, error_kind=err.kind)
        refused = {"success": False, "error": scrub_host_paths(f"{err.kind}: {err}")}
        if shown is not None and shown in TEMPLATES:  # a known tool: its result's full shape
            return shaped(shown, refused)
        return {"success": False, "tool": shown, "error": refused["error"]}
    if name == "code_execute" and on_output is not None:
        kwargs["on_output"] = on_output
    if name == "code_install_package" and on_output is not None:  # its steps, as lines
        kwargs["on_progress"] = lambda event: on_output("stderr", f"{event['message']}\n".encode())
    method = getattr(tools, name)
    result: dict[str, Any] = await method(**kwargs)
    return result


#: Image types the model APIs render; an artifact of another type is not sent as an image.
IMAGE_MIME_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def is_image(item: object) -> bool:
    """Whether a result's artifact ``item`` is an image to send as an image block."""
    return (
        isinstance(item, Mapping)
        and item.get("kind") == "image"
        and isinstance(item.get("data"), str)
        and item.get("mime_type") in IMAGE_MIME_TYPES
    )


def plain_json(value: Any) -> Any:
    """``value`` as strict JSON that encodes as UTF-8: non-finite floats become their repr, a
    lone surrogate (which UTF-8 cannot hold) its ``\\udcff`` escape, keys text, anything else
    its string. A result is plain data already; this keeps one stray value (a sandbox's note,
    say) from failing the whole message."""
    if isinstance(value, str):
        return value if value.isascii() else utf8_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {utf8_text(str(k)): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    if value is None or isinstance(value, int | float | bool):
        return value
    return utf8_text(str(value))


def _without_image_data(result: Mapping[str, Any]) -> dict[str, Any]:
    shown = dict(result)
    artifacts = result.get("artifacts")
    if isinstance(artifacts, list) and artifacts:
        shown["artifacts"] = [
            {k: v for k, v in item.items() if k != "data"} | {"data": "(sent as an image)"}
            if is_image(item)
            else item
            for item in artifacts
        ]
    return shown


def tool_result_text(result: Mapping[str, Any]) -> str:
    """A result as compact, strict JSON text for the model (see :func:`plain_json`); an image
    artifact's base64 data is left out of the text (send it as an image block, as
    :func:`anthropic_tool_result` does)."""
    return json.dumps(plain_json(_without_image_data(result)), ensure_ascii=False)


def openai_tool_message(tool_call_id: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The ``{"role": "tool", ...}`` message answering OpenAI-style tool call
    ``tool_call_id`` with ``result``."""
    return {"role": "tool", "tool_call_id": tool_call_id, "content": tool_result_text(result)}


def anthropic_tool_result(tool_use_id: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tool_result`` content block answering Anthropic-style ``tool_use`` block
    ``tool_use_id``: the result as text, and each image artifact as an image block."""
    content: list[dict[str, Any]] = [{"type": "text", "text": tool_result_text(result)}]
    artifacts = result.get("artifacts")
    for item in artifacts if isinstance(artifacts, list) else ():
        if is_image(item):
            content.append(
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": item["mime_type"],
                        "data": item["data"],
                    },
                }
            )
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if result.get("success") is False:
        block["is_error"] = True
    return block

"""How a tool's result dict becomes an MCP tool result (pure: no I/O, no SDK session).

* The result goes out as one JSON text block (what every MCP client shows the model) and, the
  same object, as ``structuredContent``.
* Each image artifact (``result["artifacts"]`` items with ``kind: "image"``) goes out as an
  MCP image block after the text. Its base64 ``data`` is left out of the JSON (the image is
  not sent twice); the artifact there says which content block holds it (``content_index``).
* ``isError`` is true exactly when the result's ``success`` is not true: a refusal, an argument
  the tool could not read, code that failed. The model sees the ``error`` and can correct it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from harombe.host_paths import scrub_host_paths
from harombe.tools import schemas
from harombe.tools.shapes import TEMPLATES, shaped

#: Image types an MCP client is expected to render; other artifacts stay in the JSON only.
IMAGE_MIME_TYPES = schemas.IMAGE_MIME_TYPES

#: ``value`` as strict JSON that encodes as UTF-8 (a lone surrogate in a result would fail
#: the transport's encoding: the response lost, over stdio the server ended).
_plain = schemas.plain_json
_is_image = schemas.is_image


def split_images(result: Mapping[str, Any]) -> tuple[dict[str, Any], list[types.ImageContent]]:
    """``result`` without the images' base64 data, and the images as MCP image blocks
    (numbered from content block 1: block 0 is the JSON text)."""
    shown = dict(result)
    images: list[types.ImageContent] = []
    artifacts = result.get("artifacts")
    if isinstance(artifacts, list):
        listed: list[Any] = []
        for item in artifacts:
            if _is_image(item):
                images.append(types.ImageContent(data=item["data"], mime_type=item["mime_type"]))
                item = {k: v for k, v in item.items() if k != "data"}
                item["content_index"] = len(images)
            listed.append(item)
        shown["artifacts"] = listed
    return shown, images


def to_call_result(result: Mapping[str, Any]) -> types.CallToolResult:
    """The MCP tool result for a tool's ``result`` dict; see the module docstring."""
    shown, images = split_images(result)
    plain = _plain(shown)
    text = json.dumps(plain, ensure_ascii=False)
    content: list[types.ContentBlock] = [types.TextContent(text=text), *images]
    return types.CallToolResult(
        content=content,
        structured_content=plain,
        is_error=result.get("success") is not True,
    )


def error_result(kind: str, message: str, tool: object = None) -> types.CallToolResult:
    """A tool error in the shape of a tool result (``success: false``, ``error``; every key
    of ``tool``'s result when it names a tool), for calls refused before any tool ran."""
    refused = {"success": False, "error": scrub_host_paths(f"{kind}: {message}")}
    known = isinstance(tool, str) and tool in TEMPLATES
    return to_call_result(shaped(str(tool), refused) if known else refused)

"""How a tool result becomes MCP content, and how an elicitation answer becomes an approval;
pure, no Docker."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest

from harombe.security.approval.gate import ApprovalRequest, Operation, RiskLevel
from harombe.service.mcp import _joined
from harombe.service.mcp_approval import answer_of, can_elicit, prompt
from harombe.service.mcp_content import error_result, to_call_result

PNG = "iVBORw0KGgo="


def test_a_result_is_json_text_and_structured_content() -> None:
    """The result goes out once as JSON text and once as structuredContent, not an error."""
    result = {"success": True, "stdout": "hé\n", "exit_code": 0}
    mapped = to_call_result(result)
    assert len(mapped.content) == 1 and isinstance(mapped.content[0], types.TextContent)
    assert json.loads(mapped.content[0].text) == result == mapped.structured_content
    assert "hé" in mapped.content[0].text and mapped.is_error is False


@pytest.mark.parametrize(
    ("success", "is_error"),
    [(True, False), (False, True), (None, True), ("yes", True)],
    ids=["true", "false", "missing", "truthy-text"],
)
def test_is_error_is_exactly_not_success(success: Any, is_error: bool) -> None:
    """isError is false only for success: true."""
    result = {} if success is None else {"success": success}
    assert to_call_result(result).is_error is is_error


def test_image_artifacts_become_image_blocks_without_their_data_in_the_json() -> None:
    """An image artifact is an image block; the JSON keeps its metadata and the block's
    index, not the base64; other artifacts stay as they are."""
    other = {"kind": "file", "path": "a.csv"}
    result = {
        "success": True,
        "artifacts": [
            {"kind": "image", "mime_type": "image/png", "data": PNG, "source": "figure 1"},
            other,
        ],
    }
    mapped = to_call_result(result)
    image = mapped.content[1]
    assert isinstance(image, types.ImageContent)
    assert (image.data, image.mime_type) == (PNG, "image/png") and len(mapped.content) == 2
    shown = mapped.structured_content["artifacts"]
    assert shown[0] == {"kind": "image", "mime_type": "image/png", "source": "figure 1",
                        "content_index": 1}  # fmt: skip
    assert shown[1] == other and PNG not in mapped.content[0].text  # type: ignore[union-attr]


def test_values_json_cannot_hold_are_made_plain() -> None:
    """NaN and objects JSON has no form for become text, so the result still goes out."""
    mapped = to_call_result({"success": True, "cpu_s": float("nan"), "when": object})
    assert mapped.structured_content["cpu_s"] == "nan"
    assert isinstance(mapped.structured_content["when"], str)


def test_an_error_result_has_the_tools_shape() -> None:
    """A refusal before any tool ran reads like a tool's own failure."""
    mapped = error_result("Forbidden", "no")
    assert mapped.is_error and mapped.structured_content == {
        "success": False, "error": "Forbidden: no"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("action", "content", "approved", "scope"),
    [
        ("accept", {"decision": "approve"}, True, "once"),
        ("accept", {"decision": "approve_sandbox"}, True, "sandbox"),
        ("accept", {"decision": "deny"}, False, "once"),
        ("accept", {"decision": "APPROVE"}, False, "once"),
        ("accept", {}, False, "once"),
        ("accept", None, False, "once"),
        ("decline", {"decision": "approve"}, False, "once"),
        ("cancel", None, False, "once"),
    ],
    ids=[
        "approve",
        "approve-sandbox",
        "deny",
        "wrong-case",
        "no-decision",
        "no-content",
        "declined",
        "dismissed",
    ],
)
def test_only_an_accepted_approval_approves(
    action: Any, content: Any, approved: bool, scope: str
) -> None:
    """accept + approve / approve_sandbox approves; anything else denies."""
    answer = answer_of(types.ElicitResult(action=action, content=content))
    assert answer.approved is approved and answer.scope == scope
    assert answer.approver == "mcp_elicitation"


def _session(elicitation: Any, *, can_send: bool = True) -> SimpleNamespace:
    caps = types.ClientCapabilities(elicitation=elicitation)
    return SimpleNamespace(client_capabilities=caps, can_send_request=can_send)


@pytest.mark.parametrize(
    ("session", "expected"),
    [
        (_session(types.ElicitationCapability()), True),
        (_session(types.ElicitationCapability(form=types.FormElicitationCapability())), True),
        (_session(types.ElicitationCapability(url=types.UrlElicitationCapability())), False),
        (_session(None), False),
        (_session(types.ElicitationCapability(), can_send=False), False),
        (SimpleNamespace(client_capabilities=None, can_send_request=True), False),
    ],
    ids=["empty-means-form", "form", "url-only", "none", "no-back-channel", "no-capabilities"],
)
def test_who_can_be_asked(session: Any, expected: bool) -> None:
    """Only a client that declared form elicitation, on a channel that can carry a request."""
    assert can_elicit(session) is expected


def test_the_prompt_shows_the_code_and_the_deadline() -> None:
    """The form's text has the tool, risk, numbered code and the timeout."""
    op = Operation("code_execute", {"language": "python", "code": "import os\nos.remove('x')"})
    text = prompt(ApprovalRequest(op, RiskLevel.HIGH, (), 60.0))
    assert "code_execute" in text and "HIGH" in text.upper()
    assert "2 │ os.remove('x')" in text and "within 60 s" in text


def test_output_pieces_of_one_stream_are_joined_in_order() -> None:
    """Queued pieces join per run of one stream; the order across streams is kept."""
    pieces = [("stdout", "a"), ("stdout", "b"), ("stderr", "c"), ("stdout", "d")]
    assert _joined(pieces) == [("stdout", "ab"), ("stderr", "c"), ("stdout", "d")]

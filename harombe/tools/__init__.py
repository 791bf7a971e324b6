"""Agent-facing tools built on the sandbox manager.

``CodeExecutionTools`` (:mod:`harombe.tools.code_execution`) holds the six tools; their
function-calling schemas and a model's tool call dispatched to them are in
:mod:`harombe.tools.schemas`, also importable from here (imported on first use)::

    from harombe.tools import anthropic_tools, dispatch, openai_tools
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CodeExecutionTools": "harombe.tools.code_execution",
    "TOOL_NAMES": "harombe.tools.schemas",
    "anthropic_tool_result": "harombe.tools.schemas",
    "anthropic_tools": "harombe.tools.schemas",
    "description": "harombe.tools.schemas",
    "dispatch": "harombe.tools.schemas",
    "input_schema": "harombe.tools.schemas",
    "openai_tool_message": "harombe.tools.schemas",
    "openai_tools": "harombe.tools.schemas",
    "tool_result_text": "harombe.tools.schemas",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Imported on first use: importing harombe.tools.params (as the rooms below do through
    # the package) must not pull in the sandbox manager.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harombe.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

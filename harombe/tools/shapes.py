"""The shape of each tool's result: one template per tool, holding every key its successful
result has, each with the value a call reports when it did not get that far.

:func:`shaped` lays a tool's result over its template at the edge (every return of
:class:`~harombe.tools.code_execution.CodeExecutionTools`), so a call refused before it ran —
invalid arguments, an approval denied, an unknown sandbox, a profile's scan, Docker failing —
has the keys of a success: the usage guide's ``print(result["stdout"])`` prints ``""`` rather
than raising ``KeyError``. The blanks: text ``""``; lists ``[]``; flags ``False``; sizes,
times and counts of a run that did not happen ``0``; what only a run, a read or a decision can
tell (an exit code, a status, a file's content, ``approval`` without a gate) ``None``.

``code_execute``'s template is :class:`~harombe.security.runtime.sandbox.ExecutionResult`'s
fields (their defaults, and :data:`_EXECUTE_REQUIRED` for the fields without one), plus the
scan's ``violations`` and ``approval``; a new field there is a new key here.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from harombe.security.runtime.sandbox import ExecutionResult

#: Every tool's result carries the gate's decision: ``None`` when no gate decided.
_COMMON: dict[str, Any] = {"approval": None}

#: The blanks of ExecutionResult's fields that have no default.
_EXECUTE_REQUIRED: dict[str, Any] = {
    "success": False, "sandbox_id": None, "stdout": "", "stderr": "", "exit_code": None,
    "execution_time": 0.0, "error": None, "status": None, "language": None, "runtime": None,
}  # fmt: skip


def _execute_template() -> dict[str, Any]:
    template: dict[str, Any] = {}
    for field in dataclasses.fields(ExecutionResult):
        if field.default is not dataclasses.MISSING:
            template[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            template[field.name] = field.default_factory()
        else:  # a KeyError here, at import, names a new required field without a blank
            template[field.name] = _EXECUTE_REQUIRED[field.name]
    return {**template, "violations": [], **_COMMON}


#: Each tool's result keys, in order, with the value of a call that did not get that far.
TEMPLATES: dict[str, Mapping[str, Any]] = {
    "code_execute": _execute_template(),
    "code_install_package": {
        "success": False, "sandbox_id": None, "package": None, "registry": None,
        "stdout": "", "stderr": "", "error": None, "warnings": [], "replaced_sandbox_id": None,
        **_COMMON,
    },
    "code_write_file": {
        "success": False, "sandbox_id": None, "file_path": None, "written_bytes": 0,
        "error": None, **_COMMON,
    },
    "code_read_file": {
        "success": False, "sandbox_id": None, "file_path": None, "content": None,
        "encoding": None, "read_bytes": 0, "size_bytes": 0, "mime_type": None, "error": None,
        **_COMMON,
    },
    "code_list_files": {
        "success": False, "sandbox_id": None, "path": None, "files": [], "entries": [],
        "total": 0, "truncated": False, "warnings": [], "error": None, **_COMMON,
    },
    "code_destroy_sandbox": {"success": False, "sandbox_id": None, "error": None, **_COMMON},
}  # fmt: skip


def shaped(tool: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """``result`` over ``tool``'s template: every key of the tool's successful result, in the
    template's order, with ``result``'s values where it has them (and any key it adds)."""
    return {**copy.deepcopy(dict(TEMPLATES[tool])), **result}


def keys_of(tool: str) -> frozenset[str]:
    """The keys every result of ``tool`` has."""
    return frozenset(TEMPLATES[tool])

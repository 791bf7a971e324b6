"""Review of what a call leaves behind (changed files, images) and of the ``llm`` output mode,
without Docker: the host's reading of a ``done`` reply whose text fields carry what hostile code
put there, and the supervisor's workspace walk (its guest code run on the host).

Each test states what should hold; a failing one is a finding."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harombe.config import Limits
from harombe.security.guest import load
from harombe.security.runtime.results import result_from_reply
from harombe.service.mcp_content import to_call_result

SUPERVISOR = load(
    ("wire.py", "supervisor_io.py", "supervisor_procs.py", "supervisor_paths.py",
     "supervisor_files.py", "supervisor_artifacts.py", "supervisor_workers.py"),
    "harombe_supervisor_artifacts_review",
)  # fmt: skip
BOX = SimpleNamespace(sandbox_id="sandbox-0123456789ab", runtime="runsc")
PNG = b"\x89PNG\r\n\x1a\n" + b"body"
LONE = "\ud800"  # what the sandbox's JSON may carry as "\ud800": no UTF-8 encoding exists


def done(**fields: Any) -> dict[str, Any]:
    base = {
        "op": "done", "id": 1, "status": "ok", "exit_code": 0, "signal": None,
        "stdout_len": 0, "stderr_len": 0, "stdout_total": 0, "stderr_total": 0,
        "artifacts": [], "changed_files": [],
    }  # fmt: skip
    return {**base, **fields}


def mapped(reply: dict[str, Any], blob: bytes = b"") -> dict[str, Any]:
    result = result_from_reply(
        BOX, reply, blob, language="python", timeout_s=5.0, elapsed_s=0.5,  # type: ignore[arg-type]
        limits=Limits(),
    )  # fmt: skip
    return result.to_dict()


LLM_FIELD = {"head_bytes": 4, "lines": 0, "path": None, "saved_bytes": 0}
SURROGATE_REPLIES = [
    # A final expression whose __repr__ returns a lone surrogate (Python session).
    (done(result="r" + LONE), b""),
    # An image that failed to render with an exception message the user wrote: the worker's
    # note becomes a warning.
    (done(warnings=["matplotlib figure 1 was not sent: (ValueError: " + LONE + ")"]), b""),
    # A worker reply forged by user code names its image's source.
    (done(artifacts=[["fig " + LONE, len(PNG)]]), PNG),
    # A changed file's path (the supervisor escapes names, but the host must not rely on it).
    (done(changed_files=[["a" + LONE, 1, "created"]]), b""),
    # The reason the full stdout could not be saved.
    (done(stdout_len=8, stdout_total=20, stdout_llm={**LLM_FIELD, "error": "E: " + LONE}),
     b"abcdwxyz"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "blob"),
    SURROGATE_REPLIES,
    ids=["result-repr", "image-note-warning", "image-source", "changed-path", "llm-error"],
)
def test_text_from_the_sandbox_leaves_the_result_encodable(
    reply: dict[str, Any], blob: bytes
) -> None:
    """A lone surrogate from the sandbox is escaped, so the result encodes as UTF-8 (HTTP
    service, MCP) instead of failing the answer."""
    result = mapped(reply, blob)
    json.dumps(result, ensure_ascii=False).encode("utf-8")
    to_call_result(result).model_dump_json()  # what the MCP server sends
    assert "\\ud800" in json.dumps(result, ensure_ascii=False)  # shown, not dropped


def test_a_tree_deeper_than_a_path_can_be_says_the_list_is_incomplete(tmp_path: Path) -> None:
    """Files under directories whose path is too long to open are not silently missed: the
    walk says it is incomplete."""
    name = "d" * 200
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(25):  # 25 x 201 bytes: past PATH_MAX, built relative to a descriptor
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("deep.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    files, cut = SUPERVISOR.scan_workspace(str(tmp_path))
    assert not any(p.endswith("deep.txt") for p in files)  # not reachable by path
    assert cut is True


def test_an_unreadable_directory_is_skipped_quietly(tmp_path: Path) -> None:
    """A directory the walk cannot open for another reason than its path's length is skipped
    (the user's choice), without marking the whole list incomplete."""
    (tmp_path / "a.txt").write_text("a")
    gone = SUPERVISOR.os.scandir

    def refusing(path: Any) -> Any:
        if str(path).endswith("/locked"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return gone(path)

    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "b.txt").write_text("b")
    SUPERVISOR.os.scandir = refusing
    try:
        files, cut = SUPERVISOR.scan_workspace(str(tmp_path))
    finally:
        SUPERVISOR.os.scandir = gone
    assert (sorted(files), cut) == (["a.txt"], False)

"""Attacks on the file API (read, write, list) from code in the sandbox and from odd requests.

Each probe prepares the workspace as hostile code would (symlinks out, loops, FIFOs, sockets,
unreadable entries, odd names, processes racing the operation), makes the call, and asserts the
attack is held: the call is refused (or confined to /workspace), nothing outside /workspace
changes or is revealed, no call blocks, and the sandbox answers the next call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from tests.integration.test_files import background

#: A generous bound for a call that must come back at all (a blocked supervisor never does).
ANSWER_TIMEOUT_S = 60
RACE_ROUNDS = 50


@pytest.fixture(scope="module")
async def arena(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A sandbox for this module's probes; each works in /workspace/<probe id> and /tmp/<id>."""
    result = await tools.code_execute(language="shell", code="true")
    assert result["success"], result
    yield str(result["sandbox_id"])
    await tools.code_destroy_sandbox(result["sandbox_id"])


async def sh(tools: CodeExecutionTools, sid: str, code: str) -> dict[str, Any]:
    result: dict[str, Any] = await tools.code_execute(language="shell", code=code, sandbox_id=sid)
    return result


async def file_call(
    tools: CodeExecutionTools, sid: str, op: str, path: str, content: str = "pwned"
) -> dict[str, Any]:
    if op == "read":
        call = tools.code_read_file(sandbox_id=sid, file_path=path)
    elif op == "write":
        call = tools.code_write_file(sandbox_id=sid, file_path=path, content=content)
    else:
        call = tools.code_list_files(sandbox_id=sid, path=path)
    result: dict[str, Any] = await asyncio.wait_for(call, ANSWER_TIMEOUT_S)
    return result


async def prepare(tools: CodeExecutionTools, sid: str, probe: str, setup: str) -> None:
    made = await sh(
        tools,
        sid,
        f"mkdir -p /workspace/{probe} /tmp/{probe} && echo orig > /tmp/{probe}/v && "
        f"cd /workspace/{probe} && {setup}",
    )
    assert made["exit_code"] == 0, made


async def outside_untouched(tools: CodeExecutionTools, sid: str, probe: str) -> None:
    """Nothing was written to /tmp/<probe> or /etc, and the sandbox answers."""
    seen = await sh(tools, sid, f"ls -A /tmp/{probe}; cat /tmp/{probe}/v; head -c 5 /etc/passwd")
    assert seen["stdout"] == "v\norig\nroot:", seen


# (id, setup in /workspace/<id>, op, path under /workspace/<id>, error the call must fail with)
STATIC = [
    ("read-link-to-etc-passwd", "ln -s /etc/passwd f", "read", "f", "WorkspacePathError"),
    ("write-link-to-outside-file", "ln -s /tmp/{id}/v f", "write", "f", "WorkspacePathError"),
    ("write-into-linked-dir-out", "ln -s /tmp/{id} d", "write", "d/new", "WorkspacePathError"),
    ("write-dangling-link-out", "ln -s /tmp/{id}/new f", "write", "f", "WorkspacePathError"),
    ("list-link-to-root", "ln -s / r", "list", "r", "WorkspacePathError"),
    (
        "read-relative-dotdot-link",
        "mkdir s && ln -s ../../../etc s/up",
        "read",
        "s/up/passwd",
        "WorkspacePathError",
    ),
    (
        "read-dotdot-after-link",
        "mkdir -p real/x && ln -s real/x l && ln -s l/../../../../etc e",
        "read",
        "e/passwd",
        "WorkspacePathError",
    ),
    (
        "read-absolute-link-dotdot",
        "ln -s /workspace/../etc e",
        "read",
        "e/passwd",
        "WorkspacePathError",
    ),
    (
        "read-link-chain-out",
        "ln -s b a && ln -s c b && ln -s /etc c",
        "read",
        "a/passwd",
        "WorkspacePathError",
    ),
    ("read-link-loop", "ln -s b a && ln -s a b", "read", "a", "WorkspacePathError"),
    (
        "read-self-link-41-times",
        "ln -s . s",
        "read",
        "/".join(["s"] * 41) + "/f",
        "WorkspacePathError",
    ),
    (
        "read-proc-self-root",
        "ln -s /proc/self/root r",
        "read",
        "r/etc/passwd",
        "WorkspacePathError",
    ),
    ("write-supervisor-stdout", "ln -s /proc/1/fd/1 f", "write", "f", "WorkspacePathError"),
    ("read-supervisor-stdin", "ln -s /proc/1/fd/0 f", "read", "f", "WorkspacePathError"),
    ("read-dev-zero-link", "ln -s /dev/zero z", "read", "z", "WorkspacePathError"),
    ("read-fifo", "mkfifo p", "read", "p", "NotARegularFileError"),
    ("write-fifo", "mkfifo p", "write", "p", "NotARegularFileError"),
    ("read-through-fifo", "mkfifo p", "read", "p/x", "NotADirectoryError"),
    ("list-fifo", "mkfifo p", "list", "p", "NotADirectoryError"),
    (
        "read-socket",
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('s')\"",
        "read",
        "s",
        "NotARegularFileError",
    ),
    ("read-directory", "mkdir d", "read", "d", "IsADirectoryError"),
    ("write-over-directory", "mkdir -p d/keep", "write", "d", "IsADirectoryError"),
    ("read-mode-000-file", "echo s > f && chmod 000 f", "read", "f", "PermissionError"),
    ("list-mode-000-dir", "mkdir d && chmod 000 d", "list", "d", "PermissionError"),
    (
        "read-in-mode-000-dir",
        "mkdir d && echo x > d/f && chmod 000 d",
        "read",
        "d/f",
        "PermissionError",
    ),
    ("read-over-max-file-bytes", "truncate -s 67108865 big", "read", "big", "FileTooLargeError"),
]


@pytest.mark.parametrize(
    ("probe", "setup", "op", "path", "error"), STATIC, ids=[p[0] for p in STATIC]
)
async def test_static_attack_is_held(
    tools: CodeExecutionTools, arena: str, probe: str, setup: str, op: str, path: str, error: str
) -> None:
    """The call fails with the expected error, at once, and nothing outside changes."""
    await prepare(tools, arena, probe, setup.replace("{id}", probe))
    result = await file_call(tools, arena, op, f"{probe}/{path}")
    assert result["success"] is False, result
    assert error in result["error"], result
    assert "/etc" not in str(result.get("files")), result
    await outside_untouched(tools, arena, probe)


# (id, path as given): refused before anything reaches the sandbox, or by the supervisor.
ODD_PATHS = [
    ("nul-byte", "a\x00b"),
    ("name-300-bytes", "a" * 300),
    ("path-5000-chars", "a/" * 2500 + "f"),
    ("depth-1000", "/".join(["a"] * 1000) + "/f"),
    ("lone-surrogate", "\ud800.txt"),
    ("dotdot-out", "x/../../etc/passwd"),
]


@pytest.mark.parametrize(("probe", "path"), ODD_PATHS, ids=[p[0] for p in ODD_PATHS])
@pytest.mark.parametrize("op", ["read", "write", "list"])
async def test_odd_path_is_refused_cleanly(
    tools: CodeExecutionTools, arena: str, probe: str, path: str, op: str
) -> None:
    """A malformed path gets a clear refusal, creates nothing, and the sandbox answers."""
    result = await file_call(tools, arena, op, path)
    assert result["success"] is False and result["error"], result
    seen = await sh(tools, arena, "ls -A /workspace | grep -c '^a' || true")
    assert seen["stdout"] == "0\n", seen


async def test_undecodable_names_are_listed_as_valid_text(
    tools: CodeExecutionTools, arena: str
) -> None:
    """A name that is not UTF-8 is listed escaped (``\\xff``) and flagged, never as text that
    cannot be encoded."""
    await prepare(tools, arena, "bad-names", "python3 -c \"open(b'\\xff\\xfe.txt', 'w').close()\"")
    listing = await file_call(tools, arena, "list", "bad-names")
    assert listing["files"] == ["\\xff\\xfe.txt"], listing
    assert listing["entries"][0]["name_undecodable"] is True
    "".join(listing["files"]).encode("utf-8")


async def test_workspace_itself_cannot_be_replaced(tools: CodeExecutionTools, arena: str) -> None:
    """/workspace is a mount in a read-only root: code can neither move nor replace it with a
    symlink, so the walk's root is always the workspace."""
    tried = await sh(
        tools,
        arena,
        "mv /workspace /w2; rm -rf /workspace 2>/dev/null; ln -s /etc /workspace;"
        " test -L /workspace && echo REPLACED || echo held",
    )
    assert tried["stdout"].endswith("held\n"), tried
    await prepare(tools, arena, "root-check", "true")
    wrote = await file_call(tools, arena, "write", "root-check/f")
    assert wrote["success"], wrote
    await outside_untouched(tools, arena, "root-check")


async def test_hard_link_to_a_root_file_cannot_be_written_through(
    tools: CodeExecutionTools, arena: str
) -> None:
    """A hard link from /workspace to /etc/passwd cannot be made (another filesystem), and a
    write to that name creates a new file in the workspace."""
    await prepare(tools, arena, "hard-link", "ln /etc/passwd pw 2>/dev/null || true")
    wrote = await file_call(tools, arena, "write", "hard-link/pw", "pwned")
    assert wrote["success"], wrote
    seen = await sh(tools, arena, "head -c 5 /etc/passwd; stat -c ' %u %h' /workspace/hard-link/pw")
    assert seen["stdout"] == "root: 1000 1\n", seen


# Processes racing the operation: (id, setup, loop body in Python run in /workspace/<id>,
# op, path). The loop runs beside the supervisor for the duration of RACE_ROUNDS calls.
RACES = [
    (
        "race-dir-swapped-for-link",
        "mkdir d",
        "os.rename('d', 'd.x'); os.symlink('/tmp/{id}', 'd'); os.unlink('d'); "
        "os.rename('d.x', 'd')",
        "write",
        "d/v",
    ),
    (
        "race-link-retargeted",
        "mkdir real && ln -s real l",
        "os.symlink('/tmp/{id}', 'n'); os.replace('n', 'l'); os.symlink('real', 'n'); "
        "os.replace('n', 'l')",
        "write",
        "l/v",
    ),
    (
        "race-final-file-swapped-for-link",
        "echo inside > v",
        "os.symlink('/tmp/{id}/v', 'n'); os.replace('n', 'v'); open('n', 'w').write('inside\\n');"
        " os.replace('n', 'v')",
        "read",
        "v",
    ),
    (
        "race-final-file-swapped-for-fifo",
        "echo inside > v",
        "os.mkfifo('n'); os.replace('n', 'v'); open('n', 'w').write('inside\\n'); "
        "os.replace('n', 'v')",
        "read",
        "v",
    ),
    (
        "race-dirs-renamed-under-write",
        "mkdir -p a/b",
        "os.rename('a', 'a.x'); os.rename('a.x', 'a'); os.rename('a/b', 'a/e'); "
        "os.rename('a/e', 'a/b')",
        "write",
        "a/b/v",
    ),
]

RACER = """
import os, shutil, time
os.chdir({cwd!r})
end = time.monotonic() + 60
rounds = 0
while time.monotonic() < end:
    rounds += 1
    if rounds == 2:
        open('ready', 'w').close()
    try:
        {body}
    except OSError:
        # A call re-created a name this loop had moved away: put the original back.
        for name in ('d', 'a'):
            if os.path.exists(name + '.x'):
                if os.path.islink(name):
                    os.unlink(name)
                elif os.path.isdir(name):
                    shutil.rmtree(name, ignore_errors=True)
                try:
                    os.rename(name + '.x', name)
                except OSError:
                    pass
"""


@pytest.mark.parametrize(("probe", "setup", "body", "op", "path"), RACES, ids=[r[0] for r in RACES])
async def test_race_is_held(
    tools: CodeExecutionTools,
    sandbox_manager: SandboxManager,
    arena: str,
    probe: str,
    setup: str,
    body: str,
    op: str,
    path: str,
) -> None:
    """50 calls while a process swaps the path's components in a tight loop: each call lands
    inside /workspace or is refused, never blocks, and nothing outside is written or read."""
    await prepare(tools, arena, probe, setup)
    racer = RACER.format(cwd=f"/workspace/{probe}", body=body.replace("{id}", probe))
    await background(tools, sandbox_manager, arena, racer, f"{probe}/ready")
    for i in range(RACE_ROUNDS):
        result = await file_call(tools, arena, op, f"{probe}/{path}", f"pwned {i}")
        if op == "read":
            assert result.get("content") in (None, "inside\n"), result
        else:
            assert result["success"] or result["error"], result
    await outside_untouched(tools, arena, probe)


# Requests the host never sends, straight to the supervisor: each gets an error reply.
BAD_REQUESTS = [
    ("no-path", {"op": "read", "root": "/workspace", "max_bytes": 10}),
    ("path-not-text", {"op": "write", "root": "/workspace", "path": 5}),
    ("absolute-path", {"op": "read", "root": "/workspace", "path": "/etc/passwd", "max_bytes": 9}),
    ("max-bytes-not-number", {"op": "read", "root": "/workspace", "path": "f", "max_bytes": "x"}),
    (
        "max-entries-not-number",
        {"op": "list", "root": "/workspace", "path": ".", "max_entries": []},
    ),
    ("root-missing", {"op": "list", "root": "/nonexistent", "path": "."}),
    ("deep-2000", {"op": "list", "root": "/workspace", "path": "/".join(["a"] * 2000)}),
]


@pytest.mark.parametrize(("probe", "msg"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
async def test_malformed_request_gets_an_error_reply(
    tools: CodeExecutionTools,
    sandbox_manager: SandboxManager,
    arena: str,
    probe: str,
    msg: dict[str, Any],
) -> None:
    """Whatever a request holds, the supervisor replies with an error and keeps serving."""
    box = sandbox_manager.get(arena)
    async with box.lock:
        reply, _ = await box.channel.request(dict(msg), b"x", timeout_s=ANSWER_TIMEOUT_S)
    assert reply["ok"] is False and reply["error"], reply
    alive = await sh(tools, arena, "echo alive")
    assert alive["stdout"] == "alive\n"

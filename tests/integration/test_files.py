"""Workspace files: round trips, listing, refusal of every way out of /workspace, no blocking
on special files, no check-then-open race, atomic writes, capped listings and deep paths."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import docker
import pytest

from harombe.security.runtime.files import MAX_LIST_ENTRIES, MAX_PATH_DEPTH
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

#: A generous bound for a call that must come back at all (a blocked supervisor never does).
ANSWER_TIMEOUT_S = 60
#: How long a background process may take to start: READY_POLLS × READY_POLL_S.
READY_POLLS = 240
READY_POLL_S = 0.25


async def sh(tools: CodeExecutionTools, sid: str, code: str) -> dict[str, Any]:
    result: dict[str, Any] = await tools.code_execute(language="shell", code=code, sandbox_id=sid)
    return result


async def background(
    tools: CodeExecutionTools, manager: SandboxManager, sid: str, code: str, ready: str
) -> None:
    """Start ``code`` (Python) in the sandbox beside the supervisor, as ``docker exec`` does (a
    process that runs while file operations are served, as one left over from a call would),
    and return once it has created /workspace/``ready``, which it does when its loop runs."""
    container_id = manager.get(sid).container_id
    await tools.code_write_file(sandbox_id=sid, file_path=ready, content="")  # parent dirs
    await tools.code_execute(language="shell", sandbox_id=sid, code=f"rm -f '/workspace/{ready}'")

    def start() -> None:
        client = docker.from_env()
        try:
            container = client.containers.get(container_id)
            container.exec_run(["python3", "-c", code], user="1000:1000", detach=True)
        finally:
            client.close()

    await asyncio.to_thread(start)
    for _ in range(READY_POLLS):
        if (await tools.code_read_file(sandbox_id=sid, file_path=ready))["success"]:
            return
        await asyncio.sleep(READY_POLL_S)
    raise AssertionError(f"the background process never started ({ready} missing)")


async def as_root(manager: SandboxManager, sid: str, command: str) -> str:
    """Run ``command`` as root in the sandbox (test setup only) and return its output."""
    container_id = manager.get(sid).container_id

    def run() -> str:
        client = docker.from_env()
        try:
            result = client.containers.get(container_id).exec_run(["sh", "-c", command], user="0")
            output = result.output
            assert isinstance(output, bytes)
            return output.decode()
        finally:
            client.close()

    return await asyncio.to_thread(run)


async def test_guide_file_flow(tools: CodeExecutionTools, fresh_sandbox: str) -> None:
    """Write config and data, use them from code, read output back, list the workspace."""
    await tools.code_write_file(
        sandbox_id=fresh_sandbox,
        file_path="config.json",
        content='{"api_url": "https://api.example.com", "timeout": 30}',
    )
    wrote = await tools.code_write_file(
        sandbox_id=fresh_sandbox, file_path="data/input.csv", content="name,age\nAlice,30\nBob,25"
    )
    assert wrote["success"] is True
    code = (
        "import json\nconfig = json.load(open('config.json'))\nprint(config['api_url'])\n"
        "with open('/workspace/output.txt', 'w') as f:\n    f.write(f'Results: {6 * 7}\\n')"
    )
    result = await tools.code_execute(language="python", code=code, sandbox_id=fresh_sandbox)
    assert result["stdout"] == "https://api.example.com\n"
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path="output.txt")
    assert read["content"] == "Results: 42\n"
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path=".")
    assert listing["files"] == ["config.json", "data", "output.txt"]
    sub = await tools.code_list_files(sandbox_id=fresh_sandbox, path="data")
    assert sub["files"] == ["input.csv"]


async def test_files_written_are_owned_by_the_sandbox_user(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Code can modify files the tools wrote (same non-root owner)."""
    await tools.code_write_file(sandbox_id=sandbox_id, file_path="owned.txt", content="x")
    result = await sh(
        tools, sandbox_id, "stat -c %u owned.txt && echo y >> owned.txt && cat owned.txt"
    )
    assert result["stdout"] == "1000\nxy\n"


async def test_large_unicode_text_round_trips_exactly(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Several MB of mixed-script text come back byte for byte, and code sees the same text."""
    text = ("héllo wörld ✓ 日本語 😀 \r\n\t" * 200_000)[:3_000_000]
    wrote = await tools.code_write_file(
        sandbox_id=sandbox_id, file_path="big/text.txt", content=text
    )
    assert wrote["written_bytes"] == len(text.encode())
    read = await tools.code_read_file(sandbox_id=sandbox_id, file_path="big/text.txt")
    assert read["content"] == text
    digest = await tools.code_execute(
        language="python",
        sandbox_id=sandbox_id,
        code="import hashlib\nprint(hashlib.sha256(open('big/text.txt','rb').read()).hexdigest())",
    )
    assert digest["stdout"].strip() == hashlib.sha256(text.encode()).hexdigest()


ESCAPES = [
    ("../etc/passwd", "WorkspacePathError"),
    ("/etc/passwd", "WorkspacePathError"),
    ("data/../../etc/passwd", "WorkspacePathError"),
    ("link_out/passwd", "WorkspacePathError"),
    ("link_file", "WorkspacePathError"),
    ("link_rel/etc/passwd", "WorkspacePathError"),
    ("link_proc/1/environ", "WorkspacePathError"),
]


@pytest.mark.parametrize(("path", "kind"), ESCAPES, ids=[p for p, _ in ESCAPES])
async def test_every_way_out_is_refused(
    tools: CodeExecutionTools, sandbox_id: str, path: str, kind: str
) -> None:
    """'..', absolute paths and symlinks planted by code that lead out are all refused."""
    plant = (
        "ln -sfn /etc link_out; ln -sfn /etc/passwd link_file; ln -sfn / link_rel; "
        "ln -sfn /proc link_proc"
    )
    planted = await sh(tools, sandbox_id, plant)
    assert planted["success"], planted
    for op in ("read", "write", "list"):
        if op == "read":
            result = await tools.code_read_file(sandbox_id=sandbox_id, file_path=path)
        elif op == "write":
            result = await tools.code_write_file(sandbox_id=sandbox_id, file_path=path, content="x")
        else:
            result = await tools.code_list_files(sandbox_id=sandbox_id, path=path)
        assert result["success"] is False, (op, result)
        assert result["error"].startswith(kind), (op, result)
    unchanged = await sh(tools, sandbox_id, "head -c 4 /etc/passwd")
    assert unchanged["stdout"] == "root"


async def test_symlinks_are_never_followed_even_inside_the_workspace(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """A symlink anywhere in a path (relative, absolute, chained, to a directory or a file,
    inside /workspace) is refused for read, write and list, naming its target: the path a gate
    judged is always the file touched, so a link named ``notes`` cannot hand out ``.env``."""
    await sh(
        tools,
        sandbox_id,
        "mkdir -p real/sub && echo inside > real/f.txt && echo SECRET=1 > .env && "
        "ln -sfn real alias && ln -sfn /workspace/real/f.txt abs_link && ln -sfn alias chain && "
        "ln -sfn ../f.txt real/sub/up && ln -sfn .env notes",
    )
    paths = ("alias/f.txt", "abs_link", "chain/f.txt", "real/sub/up", "chain/sub/up", "notes")
    for path in paths:
        read = await tools.code_read_file(sandbox_id=sandbox_id, file_path=path)
        assert read["success"] is False, (path, read)
        assert read["error"].startswith("WorkspacePathError") and "symbolic link" in read["error"]
        assert "SECRET" not in str(read)
    wrote = await tools.code_write_file(sandbox_id=sandbox_id, file_path="abs_link", content="new")
    assert wrote["success"] is False and "symbolic link" in wrote["error"], wrote
    seen = await sh(tools, sandbox_id, "cat real/f.txt; test -L abs_link && echo still-a-link")
    assert seen["stdout"] == "inside\nstill-a-link\n"
    listing = await tools.code_list_files(sandbox_id=sandbox_id, path="chain")
    assert listing["success"] is False and "symbolic link" in listing["error"], listing
    direct = await tools.code_read_file(sandbox_id=sandbox_id, file_path="real/f.txt")
    assert direct["content"] == "inside\n"


async def test_unicode_names_round_trip(tools: CodeExecutionTools, fresh_sandbox: str) -> None:
    """Names in other scripts are written, listed and read back as given, and code sees them."""
    path = "données/日本語 ✓.txt"
    wrote = await tools.code_write_file(sandbox_id=fresh_sandbox, file_path=path, content="ok")
    assert wrote["success"], wrote
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path="données")
    assert listing["files"] == ["日本語 ✓.txt"]
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=path)
    assert read["content"] == "ok"
    seen = await sh(tools, fresh_sandbox, "cat 'données/日本語 ✓.txt'")
    assert seen["stdout"] == "ok"


async def test_missing_file_and_binary_file_are_clear_errors(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """Reading a missing file or a non-UTF-8 file fails with a reason, not an exception."""
    missing = await tools.code_read_file(sandbox_id=sandbox_id, file_path="nope.txt")
    assert missing["success"] is False and "No such file" in missing["error"]
    await tools.code_execute(
        language="python",
        sandbox_id=sandbox_id,
        code="open('bin.dat','wb').write(bytes(range(256)))",
    )
    binary = await tools.code_read_file(sandbox_id=sandbox_id, file_path="bin.dat")
    assert binary["success"] is False and binary["error"].startswith("UnicodeDecodeError")


async def test_workspace_is_limited_by_max_disk_mb(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Filling /workspace past max_disk_mb fails with 'No space left on device'."""
    result = await sh(
        tools,
        fresh_sandbox,
        "dd if=/dev/zero of=/workspace/fill bs=1M count=1100 2>&1 | head -n 1; rm -f fill",
    )
    assert "No space left on device" in result["stdout"]


# --- special files: nothing blocks -------------------------------------------------------------

SPECIAL = (
    "mkfifo sp/fifo && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sp/sock')\""
)


@pytest.mark.parametrize("name", ["fifo", "sock"], ids=["fifo", "socket"])
async def test_reading_a_special_file_is_refused_without_blocking(
    tools: CodeExecutionTools, sandbox_id: str, name: str
) -> None:
    """A FIFO or socket in the workspace is refused at once (a FIFO without writer used to
    block the supervisor until the sandbox was lost), and the sandbox answers the next call."""
    await sh(tools, sandbox_id, f"rm -rf sp && mkdir sp && {SPECIAL}")
    read = await asyncio.wait_for(
        tools.code_read_file(sandbox_id=sandbox_id, file_path=f"sp/{name}"), ANSWER_TIMEOUT_S
    )
    assert read["success"] is False, read
    assert "NotARegularFileError" in read["error"], read
    after = await sh(tools, sandbox_id, "echo alive")
    assert after["stdout"] == "alive\n"


@pytest.mark.parametrize(
    ("name", "error"),
    [("fifo", "NotARegularFileError"), ("sock", "NotARegularFileError"), ("dir", "IsADirectory")],
    ids=["fifo", "socket", "directory"],
)
async def test_writing_over_a_special_file_is_refused(
    tools: CodeExecutionTools, sandbox_id: str, name: str, error: str
) -> None:
    """A write whose target is a FIFO, socket or directory is refused and changes nothing."""
    await sh(tools, sandbox_id, f"rm -rf sp && mkdir -p sp/dir/keep && {SPECIAL}")
    wrote = await asyncio.wait_for(
        tools.code_write_file(sandbox_id=sandbox_id, file_path=f"sp/{name}", content="x"),
        ANSWER_TIMEOUT_S,
    )
    assert wrote["success"] is False and error in wrote["error"], wrote
    kinds = await sh(tools, sandbox_id, "stat -c %F sp/fifo sp/sock sp/dir; ls -A sp/dir")
    assert kinds["stdout"] == "fifo\nsocket\ndirectory\nkeep\n"


# --- races: nothing outside /workspace is ever touched -----------------------------------------

FLIPPER = """
import os, shutil, time
os.chdir("/workspace")
end = time.monotonic() + 90
rounds = 0
while time.monotonic() < end and not os.path.exists("stop"):
    rounds += 1
    if rounds == 2:
        open("flip.ready", "w").close()
    # 'flip' points inside, then outside; 'swap' is a directory, then a symlink out.
    for target in ("/workspace/real", "/tmp/outside"):
        try:
            os.symlink(target, "flip.new")
            os.replace("flip.new", "flip")
        except OSError:
            pass
    for step in (
        lambda: os.rename("swap", "swap.dir"),
        lambda: os.symlink("/tmp/outside", "swap"),
        lambda: os.unlink("swap") if os.path.islink("swap") else shutil.rmtree("swap"),
        lambda: os.rename("swap.dir", "swap"),
    ):
        try:
            step()
        except OSError:
            pass  # a write re-created 'swap' as a directory meanwhile: the next round heals it
"""

RACE_SETUP = (
    "mkdir -p /tmp/outside real swap && echo original > /tmp/outside/victim.txt && "
    "echo SECRET > /tmp/outside/secret.txt && echo inside > real/secret.txt && "
    "echo inside > swap/secret.txt && ln -sfn /workspace/real flip"
)


async def test_a_symlink_flipped_during_writes_never_redirects_them(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """While a process flips symlinks and swaps a directory for a symlink out, in a tight loop,
    200 writes and 100 reads through those names never touch or reveal a file outside
    /workspace: each either lands inside or is refused, and the sandbox keeps answering."""
    assert (await sh(tools, fresh_sandbox, RACE_SETUP))["success"]
    await background(tools, sandbox_manager, fresh_sandbox, FLIPPER, "flip.ready")
    outcomes: dict[str, int] = {}
    for i in range(200):
        path = ("flip", "swap")[i % 2] + "/victim.txt"
        wrote = await tools.code_write_file(
            sandbox_id=fresh_sandbox, file_path=path, content=f"pwned {i}\n"
        )
        kind = "ok" if wrote["success"] else wrote["error"].split(":")[0]
        outcomes[kind] = outcomes.get(kind, 0) + 1
    written = await sh(tools, fresh_sandbox, "ls -A /tmp/outside; cat /tmp/outside/victim.txt")
    assert written["stdout"] == "secret.txt\nvictim.txt\noriginal\n", (written, outcomes)
    # That shell call's end stopped every process: start the flipper again.
    await background(tools, sandbox_manager, fresh_sandbox, FLIPPER, "flip.ready")
    for i in range(100):
        path = ("flip", "swap")[i % 2] + "/secret.txt"
        read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=path)
        assert read.get("content") in (None, "inside\n"), read
    await tools.code_write_file(sandbox_id=fresh_sandbox, file_path="stop", content="")
    assert set(outcomes) <= {"ok", "WorkspacePathError", "FileError"}, outcomes
    assert outcomes.get("ok", 0) > 0, outcomes


ATOMIC_READER = """
import os, time
end = time.monotonic() + 90
bad = 0
open("/workspace/reader.ready", "w").close()
while time.monotonic() < end and not os.path.exists("/workspace/stop"):
    try:
        with open("/workspace/atomic.txt", "rb") as f:
            data = f.read()
    except OSError:
        continue
    if data not in (b"A" * 1_000_000, b"B" * 1_000_000):  # empty is torn too
        bad += 1
        with open("/tmp/torn", "wb") as f:
            f.write(b"%d %d" % (bad, len(data)))
"""


async def test_writes_are_atomic_for_a_concurrent_reader(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """A process reading a file in a loop while it is rewritten 100 times never sees half of
    one version: the file is replaced by a rename, not rewritten in place."""
    await tools.code_write_file(
        sandbox_id=fresh_sandbox, file_path="atomic.txt", content="A" * 1_000_000
    )
    await background(tools, sandbox_manager, fresh_sandbox, ATOMIC_READER, "reader.ready")
    for i in range(100):
        content = ("A", "B")[i % 2] * 1_000_000
        wrote = await tools.code_write_file(
            sandbox_id=fresh_sandbox, file_path="atomic.txt", content=content
        )
        assert wrote["success"], wrote
    await tools.code_write_file(sandbox_id=fresh_sandbox, file_path="stop", content="")
    torn = await sh(tools, fresh_sandbox, "cat /tmp/torn 2>/dev/null || echo none; ls -A")
    assert ".harombe" not in torn["stdout"], torn  # no temporary file left behind
    assert torn["stdout"].split("\n")[0] == "none", torn


async def test_a_write_keeps_the_mode_and_replaces_a_hard_link(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Rewriting an executable script keeps its mode; writing to one name of a hard link
    replaces that name and leaves the other file as it was (nothing is written through)."""
    await sh(
        tools,
        fresh_sandbox,
        "printf 'echo v1' > run.sh && chmod 750 run.sh && echo a > a && ln a b",
    )
    await tools.code_write_file(sandbox_id=fresh_sandbox, file_path="run.sh", content="echo v2")
    await tools.code_write_file(sandbox_id=fresh_sandbox, file_path="b", content="changed")
    seen = await sh(tools, fresh_sandbox, "stat -c %a run.sh; cat run.sh; echo; cat a b")
    assert seen["stdout"] == "750\necho v2\na\nchanged", seen


async def test_hard_links_out_of_the_workspace_cannot_be_made(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """/workspace is a filesystem of its own: a hard link to /etc/passwd (or to /tmp) fails
    with EXDEV, so no file outside can be reached through a name inside."""
    result = await sh(
        tools, fresh_sandbox, "ln /etc/passwd pw; touch /tmp/t && ln /tmp/t t; ls -A; echo end"
    )
    assert "Invalid cross-device link" in result["stderr"], result
    assert result["stdout"] == "end\n", result


async def test_file_operations_carry_no_group_of_root(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """The supervisor keeps no supplementary groups, so a file readable only by group root is
    refused to file operations as it is to user code."""
    await sh(tools, fresh_sandbox, "mkdir -m 777 shared")
    made = await as_root(
        sandbox_manager,
        fresh_sandbox,
        "echo root-group-only > /workspace/shared/g0 && chmod 040 /workspace/shared/g0 && "
        "stat -c '%u:%g %a' /workspace/shared/g0 && grep Groups /proc/1/status",
    )
    assert made.split() == ["0:0", "40", "Groups:"], made
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path="shared/g0")
    assert read["success"] is False and "PermissionError" in read["error"], read


# --- size caps --------------------------------------------------------------------------------


async def test_a_huge_directory_listing_is_capped_and_says_so(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """25,000 files: the listing holds the first 10,000 by name, says it was truncated and
    counts all of them, and the sandbox answers the next call."""
    made = await tools.code_execute(
        language="python",
        sandbox_id=fresh_sandbox,
        code="import os\nos.mkdir('many')\nfor i in range(25000):\n"
        "    open('many/f%05d' % i, 'w').close()",
        timeout=300,  # about 30 s under gVisor here, more on a busy machine
    )
    assert made["success"], made
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path="many")
    assert listing["success"], {k: v for k, v in listing.items() if k != "files"}
    assert len(listing["files"]) == MAX_LIST_ENTRIES
    assert listing["files"][:2] == ["f00000", "f00001"]
    assert listing["files"][-1] == f"f{MAX_LIST_ENTRIES - 1:05d}"
    assert listing["truncated"] is True and listing["total"] == 25000
    small = await tools.code_list_files(sandbox_id=fresh_sandbox, path=".")
    assert small["files"] == ["many"] and small["truncated"] is False and small["total"] == 1


async def test_listing_reports_symlinks_and_special_files_without_following(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A symlink is listed as a symlink with its target (never followed, even out of the
    workspace), and FIFOs and sockets by their own type."""
    await sh(
        tools,
        fresh_sandbox,
        f"mkdir sp && {SPECIAL} && ln -s /etc sp/etc && ln -s nowhere sp/dangling",
    )
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path="sp")
    entries = {e["name"]: e for e in listing["entries"]}
    assert entries["etc"]["type"] == "symlink" and entries["etc"]["target"] == "/etc"
    assert entries["dangling"]["target"] == "nowhere"
    assert entries["fifo"]["type"] == "fifo" and entries["sock"]["type"] == "socket"


async def test_a_file_over_max_file_bytes_is_refused_with_how_to_read_it(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """Reading a file larger than max_file_bytes fails at once, says how to read it instead."""
    over = sandbox_manager.limits.max_file_bytes + 1
    await sh(tools, fresh_sandbox, f"truncate -s {over} big.bin")
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path="big.bin")
    assert read["success"] is False, read
    assert "FileTooLargeError" in read["error"] and "max_file_bytes" in read["error"], read
    assert "head -c" in read["error"], read


# --- deep paths ---------------------------------------------------------------------------------


async def test_a_thousand_level_path_is_refused_and_the_sandbox_lives(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """A 1000-level path is refused on the host, and if sent to the supervisor anyway it is
    refused there too (it used to crash it with RecursionError, losing the sandbox)."""
    deep = "/".join(["a"] * 1000) + "/f.txt"
    for result in (
        await tools.code_write_file(sandbox_id=fresh_sandbox, file_path=deep, content="x"),
        await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=deep),
        await tools.code_list_files(sandbox_id=fresh_sandbox, path=deep),
    ):
        assert result["success"] is False and "WorkspacePathError" in result["error"], result
    box = sandbox_manager.get(fresh_sandbox)
    for op in ("write", "read", "list"):
        msg = {"op": op, "root": "/workspace", "path": deep, "max_bytes": 10}
        async with box.lock:
            reply, _ = await box.channel.request(msg, b"x", timeout_s=ANSWER_TIMEOUT_S)
        assert reply["ok"] is False and reply["error"] == "WorkspacePathError", reply
    after = await sh(tools, fresh_sandbox, "echo alive")
    assert after["stdout"] == "alive\n"


async def test_a_real_deep_tree_works_to_the_cap_and_is_refused_past_it(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A tree that code made 200 levels deep is readable down to the depth cap and refused
    below it with a clear error; a symlink into it is refused as a link."""
    made = await tools.code_execute(
        language="python",
        sandbox_id=fresh_sandbox,
        code="import os\nfor _ in range(200):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('f', 'w').write('deep')\nos.chdir('/workspace')\n"
        f"os.symlink('/workspace/' + '/'.join(['d'] * {MAX_PATH_DEPTH - 2}), 'shortcut')",
    )
    assert made["success"], made
    ok_path = "/".join(["d"] * (MAX_PATH_DEPTH - 1)) + "/x.txt"
    wrote = await tools.code_write_file(sandbox_id=fresh_sandbox, file_path=ok_path, content="y")
    assert wrote["success"], wrote
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=ok_path)
    assert read["content"] == "y"
    too_deep = "/".join(["d"] * 200) + "/f"
    refused = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=too_deep)
    assert refused["success"] is False and "deep" in refused["error"], refused
    through_link = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path="shortcut/d/d/f")
    assert through_link["success"] is False, through_link
    assert "symbolic link" in through_link["error"], through_link
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path="shortcut")
    assert listing["success"] is False and "symbolic link" in listing["error"], listing

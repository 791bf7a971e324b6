"""Workspace files: round trips, listing, and refusal of every way out of /workspace."""

import pytest

from harombe.tools.code_execution import CodeExecutionTools


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
    result = await tools.code_execute(
        language="shell",
        sandbox_id=sandbox_id,
        code="stat -c %u owned.txt && echo y >> owned.txt && cat owned.txt",
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
    import hashlib

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
    planted = await tools.code_execute(language="shell", code=plant, sandbox_id=sandbox_id)
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
    unchanged = await tools.code_execute(
        language="shell", code="head -c 4 /etc/passwd", sandbox_id=sandbox_id
    )
    assert unchanged["stdout"] == "root"


async def test_symlink_inside_workspace_is_followed(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """A symlink that stays inside /workspace works like the file it points to."""
    await tools.code_execute(
        language="shell",
        sandbox_id=sandbox_id,
        code="mkdir -p real && echo inside > real/f.txt && ln -sfn real alias",
    )
    read = await tools.code_read_file(sandbox_id=sandbox_id, file_path="alias/f.txt")
    assert read["content"] == "inside\n"


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
    result = await tools.code_execute(
        language="shell",
        sandbox_id=fresh_sandbox,
        code="dd if=/dev/zero of=/workspace/fill bs=1M count=1100 2>&1 | head -n 1; rm -f fill",
    )
    assert "No space left on device" in result["stdout"]

"""Output mode ``llm`` against real gVisor: a long stream comes back as head, marker and tail,
the full text is saved in the sandbox (by the sandbox user, against the workspace's size) and
an agent pages it with ``code_read_file`` or ``sed -n``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.config import parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

LINES = 100_000
FULL = "".join(f"line {i}\n" for i in range(1, LINES + 1))
MARKER = re.compile(
    r"\[harombe: ([\d,]+) bytes \(([\d,]+) lines\) of (stdout|stderr) cut here; the full "
    r"\3 \(([\d,]+) bytes, ([\d,]+) lines\) is saved in /workspace/(\S+?):"
)
PRINT_LINES = {
    "python": f"for i in range(1, {LINES} + 1):\n    print(f'line {{i}}')",
    "javascript": (
        f"for (let i = 1; i <= {LINES}; i += 1000) {{\n"
        "  const chunk = [];\n"
        f"  for (let j = i; j < i + 1000 && j <= {LINES}; j++) chunk.push('line ' + j);\n"
        "  console.log(chunk.join('\\n'));\n"
        "}"
    ),
    "shell": f"seq 1 {LINES} | sed 's/^/line /'",
}
MULTIBYTE = "é€😀" * 20_000  # 2-, 3- and 4-byte characters, no newline


def split(text: str) -> tuple[str, re.Match[str], str]:
    """Head, the marker's match and tail of an llm-shaped stream."""
    found = MARKER.search(text)
    assert found is not None, text[:300]
    end = text.index("\n", found.start())
    return text[: found.start()], found, text[end + 1 :]


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
async def llm_tools(docker_manager: DockerManager) -> AsyncIterator[CodeExecutionTools]:
    """Tools over a manager whose config makes llm the default, with a 16 MB workspace."""
    config = parse_config({"security": {"sandbox": {
        "output_mode": "llm", "pool": {"size": 0}, "limits": {"max_disk_mb": 16},
    }}})  # fmt: skip
    manager = SandboxManager(docker_manager, config=config)
    await manager.start()
    yield CodeExecutionTools(manager, hitl_gate=None)
    await manager.stop()


@pytest.mark.parametrize("language", ["python", "javascript", "shell"])
async def test_a_long_stream_comes_back_as_head_marker_and_tail(
    tools: CodeExecutionTools, language: str
) -> None:
    """100,000 numbered lines: line 1 in the head, the last line in the tail, the marker names
    the bytes and lines cut and the saved file, which code_read_file returns whole."""
    result = await tools.code_execute(
        language=language, code=PRINT_LINES[language], output_mode="llm"
    )
    sid = result["sandbox_id"]
    try:
        assert result["success"], result["error"]
        head, marker, tail = split(result["stdout"])
        assert head.startswith("line 1\nline 2\n") and tail.endswith(f"line {LINES}\n")
        assert FULL.startswith(head) and FULL.endswith(tail)  # whole lines, in order
        path = marker.group(6)
        assert re.fullmatch(r"\.harombe/output/call-\d+\.stdout", path)
        assert result["output_files"] == {"stdout": path}
        assert result["stdout_truncated"] and result["stdout_bytes"] == len(FULL)
        assert number(marker.group(1)) == len(FULL) - len(head) - len(tail)
        assert number(marker.group(2)) == LINES - head.count("\n") - tail.count("\n")
        assert (number(marker.group(4)), number(marker.group(5))) == (len(FULL), LINES)
        assert len(result["stdout"].encode()) < 4096 + 4096 + 600
        read = await tools.code_read_file(sandbox_id=sid, file_path=path)
        assert read["success"], read["error"]
        assert read["content"] == FULL
        # The same file, paged with code_execute as the marker suggests.
        paged = await tools.code_execute(
            language="shell", sandbox_id=sid, code=f"sed -n '50000,50002p' {path}"
        )
        assert paged["stdout"] == "line 50000\nline 50001\nline 50002\n"
    finally:
        await tools.code_destroy_sandbox(sandbox_id=sid)


async def test_the_saved_file_belongs_to_the_sandbox_user(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """The supervisor saves the full text as the sandbox user (1000:1000), mode 644, so user
    code can read and remove it."""
    result = await tools.code_execute(
        language="shell", sandbox_id=fresh_sandbox, code="seq 1 20000", output_mode="llm"
    )
    path = result["output_files"]["stdout"]
    owner = await tools.code_execute(
        language="shell", sandbox_id=fresh_sandbox,
        code=f"stat -c '%u:%g %a' .harombe .harombe/output {path} && rm {path} && echo removed",
    )  # fmt: skip
    assert owner["stdout"] == "1000:1000 755\n1000:1000 755\n1000:1000 644\nremoved\n"


async def test_multibyte_text_is_cut_on_character_boundaries(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A long line of 2-, 3- and 4-byte characters is cut without splitting one; stderr is
    shaped and saved as stdout is."""
    code = f"import sys\nsys.stderr.write({MULTIBYTE!r})"
    result = await tools.code_execute(
        language="python", sandbox_id=fresh_sandbox, code=code, output_mode="llm"
    )
    head, marker, tail = split(result["stderr"])
    assert marker.group(3) == "stderr" and "\ufffd" not in head + tail
    assert head and tail and MULTIBYTE.startswith(head.rstrip("\n")) and MULTIBYTE.endswith(tail)
    assert result["output_files"] == {"stderr": marker.group(6)}
    read = await tools.code_read_file(sandbox_id=fresh_sandbox, file_path=marker.group(6))
    assert read["content"] == MULTIBYTE


async def test_short_output_is_unchanged(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """Output that fits in head + tail comes back whole, with no output_files."""
    result = await tools.code_execute(
        language="python", sandbox_id=sandbox_id, code="print('x' * 8000)", output_mode="llm"
    )
    assert result["stdout"] == "x" * 8000 + "\n" and result["output_files"] == {}
    assert not result["stdout_truncated"]


@pytest.mark.parametrize("value", ["LLM", 1, True, "short"], ids=["upper", "int", "bool", "word"])
async def test_bad_modes_are_refused(tools: CodeExecutionTools, value: Any) -> None:
    """A mode other than 'full' or 'llm' is refused before anything runs, saying which are
    accepted."""
    result = await tools.code_execute(language="python", code="print(1)", output_mode=value)
    assert result["success"] is False and result.get("sandbox_id") is None
    assert result["error"].startswith("InvalidArgumentError: output_mode must be 'full'")


async def test_the_config_default_applies_when_the_mode_is_left_out(
    llm_tools: CodeExecutionTools,
) -> None:
    """security.sandbox.output_mode: llm shapes a call that names no mode (None too);
    output_mode='full' still returns everything."""
    code = "seq 1 20000"  # 108,894 bytes: over head + tail, under max_output_bytes
    left_out = await llm_tools.code_execute(language="shell", code=code)
    sid = left_out["sandbox_id"]
    assert set(left_out["output_files"]) == {"stdout"}
    none = await llm_tools.code_execute(
        language="shell", sandbox_id=sid, code=code, output_mode=None
    )
    assert set(none["output_files"]) == {"stdout"}
    full = await llm_tools.code_execute(
        language="shell", sandbox_id=sid, code=code, output_mode="full"
    )
    assert full["stdout"] == "".join(f"{i}\n" for i in range(1, 20001))
    assert full["output_files"] == {}


async def test_a_full_disk_does_not_fail_the_call(llm_tools: CodeExecutionTools) -> None:
    """With the 16 MB workspace nearly full, the copy stops where the disk does: the call
    succeeds, the marker says the saved file is incomplete, and the file holds a prefix."""
    fill = (
        "dd if=/dev/zero of=fill bs=1M count=32 2>/dev/null; "
        "truncate -s -200K fill && df -k /workspace | tail -n 1"
    )
    first = await llm_tools.code_execute(language="shell", code=fill, output_mode="full")
    sid = first["sandbox_id"]
    result = await llm_tools.code_execute(
        language="python", sandbox_id=sid, code=PRINT_LINES["python"]
    )
    assert result["success"], result["error"]
    assert result["stdout"].startswith("line 1\n") and result["stdout"].endswith(f"line {LINES}\n")
    found = re.search(
        r"only the first ([\d,]+) bytes of the full stdout \(([\d,]+) bytes, [\d,]+ lines\) were "
        r"saved, in /workspace/(\S+) \((.*)\); the saved file is incomplete\]",
        result["stdout"],
    )
    assert found is not None, result["stdout"][:9000]
    saved_bytes, path = number(found.group(1)), found.group(3)
    assert 0 < saved_bytes < len(FULL) and "No space left on device" in found.group(4)
    assert result["output_files"] == {"stdout": path}
    read = await llm_tools.code_read_file(sandbox_id=sid, file_path=path)
    assert len(read["content"].encode()) == saved_bytes and FULL.startswith(read["content"])


async def test_the_stream_shows_everything_and_the_result_is_shaped(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """code_execute_stream in llm mode streams the output as the full mode does, up to
    max_output_bytes (1 MiB: FULL is 1,088,895 bytes); only the final result holds head,
    marker and tail, and names the file that holds all of it."""
    streamed: list[str] = []
    final: dict[str, Any] = {}
    async for item in tools.code_execute_stream(
        language="shell", sandbox_id=sandbox_id, code=PRINT_LINES["shell"], output_mode="llm"
    ):
        if item["type"] == "stdout":
            streamed.append(item["text"])
        elif item["type"] == "result":
            final = item
    assert "".join(streamed) == FULL[:1_048_576]
    assert len(FULL) > 1_048_576 and final["stdout_bytes"] == len(FULL)
    head, _, tail = split(final["stdout"])
    assert head.startswith("line 1\n") and tail.endswith(f"line {LINES}\n")


async def test_only_the_last_calls_files_are_kept(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Seven cut calls leave the saved files of the last five."""
    paths = []
    for _ in range(7):
        result = await tools.code_execute(
            language="shell", sandbox_id=fresh_sandbox, code="seq 1 5000", output_mode="llm"
        )
        paths.append(result["output_files"]["stdout"])
    listing = await tools.code_list_files(sandbox_id=fresh_sandbox, path=".harombe/output")
    assert sorted(listing["files"]) == sorted(p.rsplit("/", 1)[1] for p in paths[-5:])

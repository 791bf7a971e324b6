"""What a call leaves behind, against real gVisor: the files it created or changed under
/workspace (``changed_files``), the images its Python code displayed (``artifacts``, with
matplotlib installed by ``code_install_package``), and binary reads with ``code_read_file``."""

import base64
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harombe.tools.code_execution import CodeExecutionTools

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, after decoding it: every chunk's CRC checks out and the
    image data inflates to exactly the rows the header announces."""
    assert data.startswith(PNG_SIGNATURE)
    at, chunks = len(PNG_SIGNATURE), {}  # type: ignore[var-annotated]
    idat = b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.setdefault(kind, body)
        idat += body if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    row_bytes = 1 + (width * CHANNELS[colour] * depth + 7) // 8
    assert len(zlib.decompress(idat)) == height * row_bytes
    return width, height


def images(result: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(source, size) of each artifact, every one a PNG image."""
    out = []
    for item in result["artifacts"]:
        assert (item["kind"], item["mime_type"]) == ("image", "image/png")
        out.append((item["source"], png_size(base64.b64decode(item["data"]))))
    return out


@pytest.fixture(scope="module")
async def plot_sandbox(tools: CodeExecutionTools) -> AsyncIterator[str]:
    """A sandbox with matplotlib (and pillow, its dependency) installed by
    code_install_package: the image's Debian Python has neither."""
    created = await tools.code_execute(
        language="python", code="import importlib.util as u\n[u.find_spec(m) for m in "
        "('matplotlib', 'PIL')]"
    )  # fmt: skip
    assert created["result"] == "[None, None]", created
    sid = created["sandbox_id"]
    installed = await tools.code_install_package(sid, "matplotlib", "pypi")
    assert installed["success"], installed
    yield sid
    await tools.code_destroy_sandbox(sid)


async def run(tools: CodeExecutionTools, sid: str, code: str, language: str = "python") -> Any:
    result = await tools.code_execute(language=language, code=code, sandbox_id=sid)
    assert result["success"], result
    return result


async def test_a_figure_left_open_comes_back_as_one_png(
    tools: CodeExecutionTools, plot_sandbox: str
) -> None:
    """A figure still open when the call ends is one PNG of the figure's size in pixels."""
    result = await run(tools, plot_sandbox, (
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(4, 3), dpi=50)\n"
        "plt.plot([1, 3, 2])\n"
    ))  # fmt: skip
    assert images(result) == [("matplotlib figure 1", (200, 150))]
    again = await run(tools, plot_sandbox, "plt.get_fignums()")
    assert (again["result"], again["artifacts"]) == ("[]", [])


async def test_two_shows_send_two_images_once(tools: CodeExecutionTools, plot_sandbox: str) -> None:
    """plt.show() twice sends two images, each figure closed once shown: the next call sends
    nothing again. The backend is Agg unless the user says otherwise."""
    result = await run(tools, plot_sandbox, (
        "import os, matplotlib\nimport matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(2, 2), dpi=40); plt.plot([1, 2]); plt.show()\n"
        "plt.figure(figsize=(3, 1), dpi=40); plt.bar([1, 2], [3, 4]); plt.show()\n"
        "(os.environ['MPLBACKEND'], matplotlib.get_backend().lower())\n"
    ))  # fmt: skip
    assert images(result) == [
        ("matplotlib figure 1", (80, 80)),
        ("matplotlib figure 1", (120, 40)),
    ]
    assert result["result"] == "('Agg', 'agg')"
    nothing = await run(tools, plot_sandbox, "plt.show()\n1 + 1")
    assert (nothing["result"], nothing["artifacts"]) == ("2", [])


async def test_a_pil_image_as_the_final_expression_comes_back_as_png(
    tools: CodeExecutionTools, plot_sandbox: str
) -> None:
    """A PIL image as the final expression is sent as PNG, its repr kept in result; a CMYK
    image (which PNG cannot hold) is converted."""
    result = await run(
        tools, plot_sandbox, "from PIL import Image\nImage.new('RGB', (7, 5), 'red')"
    )
    assert images(result) == [("final expression", (7, 5))]
    assert result["result"].startswith("<PIL.Image.Image image mode=RGB size=7x5")
    cmyk = await run(tools, plot_sandbox, "Image.new('CMYK', (3, 2))")
    assert images(cmyk) == [("final expression", (3, 2))]


async def test_images_over_the_cap_are_dropped_with_a_warning(
    tools: CodeExecutionTools, plot_sandbox: str
) -> None:
    """A call's images may hold 10 MiB: one larger is not sent, and a warning says why."""
    result = await run(tools, plot_sandbox, (
        "import os\nfrom PIL import Image\n"
        "Image.frombytes('RGB', (2000, 2000), os.urandom(12_000_000))"
    ))  # fmt: skip
    assert result["artifacts"] == []
    assert any("final expression was not sent" in w for w in result["warnings"]), result


async def test_a_saved_plot_is_a_changed_file_read_back_as_base64(
    tools: CodeExecutionTools, plot_sandbox: str
) -> None:
    """A plot saved to a file (and closed) is a changed file, image/png, not an artifact; a
    base64 read returns its bytes."""
    result = await run(tools, plot_sandbox, (
        "plt.figure(figsize=(1, 1), dpi=30); plt.plot([0, 1])\n"
        "plt.savefig('plots/p.png') if os.makedirs('plots', exist_ok=True) is None else 0\n"
        "plt.close('all')\n"
    ))  # fmt: skip
    assert result["artifacts"] == []
    [changed] = result["changed_files"]
    assert (changed["path"], changed["mime_type"], changed["change"]) == (
        "plots/p.png", "image/png", "created")  # fmt: skip
    read = await tools.code_read_file(plot_sandbox, "plots/p.png", encoding="base64")
    data = base64.b64decode(read["content"])
    assert png_size(data) == (30, 30)
    assert (read["size_bytes"], read["mime_type"]) == (changed["size_bytes"], "image/png")


async def test_python_without_matplotlib_imports_none_of_it(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Code that draws nothing pays nothing: neither matplotlib nor PIL is imported."""
    result = await run(tools, fresh_sandbox, "import sys\n[m for m in sys.modules if "
                       "m.startswith(('matplotlib', 'PIL'))]")  # fmt: skip
    assert (result["result"], result["artifacts"]) == ("[]", [])


WRITES = {
    "python": "open('kept.txt', 'a').write('more')\nopen('new.py', 'w').write('x = 1')",
    "javascript": "const fs = require('fs'); fs.appendFileSync('kept.txt', 'more'); "
    "fs.writeFileSync('new.py', 'x = 1');",
    "shell": "printf more >> kept.txt; printf 'x = 1' > new.py",
}


@pytest.mark.parametrize("language", list(WRITES), ids=list(WRITES))
async def test_changed_files_lists_what_a_call_created_or_modified(
    tools: CodeExecutionTools, language: str
) -> None:
    """Files a call creates or modifies are listed with size and media type; files it leaves
    alone are not; JavaScript and shell calls have no artifacts."""
    first = await tools.code_execute(language=language, code="true" if language == "shell"
                                     else "0")  # fmt: skip
    sid = first["sandbox_id"]
    try:
        for name in ("kept.txt", "untouched.csv"):
            assert (await tools.code_write_file(sid, name, "old"))["success"]
        result = await run(tools, sid, WRITES[language], language)
        assert result["changed_files"] == [
            {"path": "kept.txt", "size_bytes": 7, "mime_type": "text/plain", "change": "modified"},
            {"path": "new.py", "size_bytes": 5, "mime_type": "text/x-python", "change": "created"},
        ]
        assert (result["changed_files_truncated"], result["artifacts"]) == (False, [])
        quiet = await run(tools, sid, "true" if language == "shell" else "0", language)
        assert quiet["changed_files"] == []
    finally:
        await tools.code_destroy_sandbox(sid)


async def test_symlinks_fifos_and_sockets_do_not_stall_the_scan(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A symlink (to a directory outside, and a loop), a FIFO and a socket made by user code
    are not followed or opened: the call completes and lists only the regular file."""
    result = await run(tools, fresh_sandbox, (
        "mkdir d && ln -s / d/root && ln -s loop d/loop && mkfifo d/fifo && "
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('d/sock')\" && "
        "printf 1 > d/file"
    ), "shell")  # fmt: skip
    assert [f["path"] for f in result["changed_files"]] == ["d/file"]
    assert result["changed_files_truncated"] is False


async def test_a_workspace_of_more_than_10000_entries_is_capped(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Past 10,000 entries the walk stops and past 200 files the list does: the result says
    it is incomplete, and a later call that changes nothing lists nothing."""
    many = await run(tools, fresh_sandbox, "mkdir many && cd many && seq 1 10100 | xargs touch",
                     "shell")  # fmt: skip
    assert len(many["changed_files"]) == 200
    assert many["changed_files_truncated"] is True
    assert any("changed_files is incomplete" in w for w in many["warnings"])
    quiet = await run(tools, fresh_sandbox, "true", "shell")
    assert (quiet["changed_files"], quiet["changed_files_truncated"]) == ([], True)


async def test_a_binary_read_round_trips_every_byte(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """encoding='base64' returns bytes 0..255 exactly, with size and media type; a UTF-8 read
    of the same file still fails."""
    await run(tools, fresh_sandbox, "open('all.bin', 'wb').write(bytes(range(256)))")
    read = await tools.code_read_file(fresh_sandbox, "all.bin", encoding="base64")
    assert read["success"], read
    assert base64.b64decode(read["content"]) == bytes(range(256))
    assert (read["encoding"], read["size_bytes"], read["mime_type"]) == (
        "base64", 256, "application/octet-stream")  # fmt: skip
    text = await tools.code_read_file(fresh_sandbox, "all.bin")
    assert text["success"] is False and "UnicodeDecodeError" in text["error"]
    assert "encoding='base64'" in text["error"]  # the error names the way to read bytes

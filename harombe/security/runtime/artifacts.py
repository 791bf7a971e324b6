"""What a call left behind, from its ``done`` reply: the files it created or changed under
``/workspace`` (``changed_files``) and the images its Python code displayed (``artifacts``).

Pure: no I/O. The supervisor walks the workspace and the Python worker renders the images,
inside the sandbox (``guest/supervisor_artifacts.py``, ``guest/pyworker_artifacts.py``); the
host checks what they send, names each file's media type from its name alone (Python's built-in
table, the same on every machine; nothing looks at a file's content), and encodes the images as
base64. A reply that breaks the protocol raises ``ValueError`` / ``TypeError`` (the caller
treats the sandbox as broken).
"""

from __future__ import annotations

import base64
import mimetypes
from typing import Any

from harombe.security.guest.wire import MAX_ARTIFACT_BYTES

#: As many changed files as the supervisor lists (``MAX_CHANGED_FILES`` there).
MAX_CHANGED_FILES = 200
MAX_IMAGES = 64
CHANGES = ("created", "modified")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Most pixels an image artifact may have (Pillow's own decompression-bomb limit is 89.5 M);
#: a 3000 x 3000 figure at 300 dpi is 9 M.
MAX_IMAGE_PIXELS = 40_000_000
UNKNOWN_MIME = "application/octet-stream"
#: Python's built-in table only (a new ``MimeTypes`` reads no system file): the same answer
#: on every host.
_MIME = mimetypes.MimeTypes()


def utf8_text(text: str) -> str:
    """``text`` from the sandbox as valid Unicode: a lone surrogate (JSON may carry one as
    ``\\ud800``; user code chooses reprs, exception messages and names) becomes its escape, so
    the result always encodes as UTF-8 (the HTTP service, MCP)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def mime_type(path: str) -> str:
    """The media type of a file named ``path``, from its name; ``application/octet-stream``
    when the name says nothing."""
    return _MIME.guess_type(path, strict=False)[0] or UNKNOWN_MIME


def changed_files(reply: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The reply's changed files as result items, and whether the list is incomplete."""
    listed = reply.get("changed_files", [])
    if not isinstance(listed, list) or len(listed) > MAX_CHANGED_FILES:
        raise ValueError("a done reply whose changed_files is not a list within the cap")
    files = []
    for item in listed:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
            or item[1] < 0
            or item[2] not in CHANGES
        ):
            raise ValueError(f"a done reply with a malformed changed file {str(item)[:80]!r}")
        path, size, change = utf8_text(item[0]), item[1], item[2]
        files.append(
            {"path": path, "size_bytes": size, "mime_type": mime_type(path), "change": change}
        )
    return files, bool(reply.get("changed_files_truncated", False))


def oversized(png: bytes) -> str | None:
    """Why a PNG must not be passed on (a header that is not IHDR, or more pixels than
    :data:`MAX_IMAGE_PIXELS`: a small file can decode to gigabytes in the client that shows
    it), else ``None``."""
    if len(png) < 24 or png[12:16] != b"IHDR":
        return "its header is not a PNG image header"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    if not 0 < width * height <= MAX_IMAGE_PIXELS:
        return f"{width}x{height} pixels is more than {MAX_IMAGE_PIXELS:,}"
    return None


def split_images(
    reply: dict[str, Any], blob: bytes, output_bytes: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The images that follow the first ``output_bytes`` of ``blob`` (the output streams), as
    result items, and warnings about any dropped. Their sizes must fill the rest exactly."""
    listed = reply.get("artifacts", [])
    if not isinstance(listed, list) or len(listed) > MAX_IMAGES:
        raise ValueError("a done reply whose artifacts is not a list within the cap")
    images: list[dict[str, Any]] = []
    warnings: list[str] = []
    at = output_bytes
    for item in listed:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
            or not 0 < item[1] <= MAX_ARTIFACT_BYTES
        ):
            raise ValueError(f"a done reply with a malformed artifact {str(item)[:80]!r}")
        source, size = utf8_text(item[0][:64]), item[1]
        data = blob[at : at + size]
        at += size
        if not data.startswith(PNG_SIGNATURE):
            warnings.append(f"an image from {source!r} was dropped: it is not a PNG")
            continue
        too_big = oversized(data)
        if too_big:
            warnings.append(f"an image from {source!r} was dropped: {too_big}")
            continue
        images.append(
            {
                "kind": "image",
                "mime_type": "image/png",
                "data": base64.b64encode(data).decode("ascii"),
                "source": source,
            }
        )
    if at != len(blob) or at - output_bytes > MAX_ARTIFACT_BYTES:
        raise ValueError("a done reply whose artifacts do not match its blob")
    return images, warnings


def left_behind(
    reply: dict[str, Any], blob: bytes, stdout_len: int
) -> tuple[bytes, dict[str, Any], list[str]]:
    """From a ``done`` reply: the blob without the images (both output streams), the
    result's ``changed_files``, ``changed_files_truncated`` and ``artifacts``, and warnings.

    A reply without ``artifacts`` carries no images: its blob is all output."""
    kept = stdout_len + int(reply["stderr_len"]) if "artifacts" in reply else len(blob)
    images, warnings = split_images(reply, blob, kept)
    files, cut = changed_files(reply)
    fields = {"changed_files": files, "changed_files_truncated": cut, "artifacts": images}
    return blob[:kept], fields, warnings


def binary_content(path: str, data: bytes) -> dict[str, Any]:
    """A binary read's result fields: the bytes of the file ``path`` as base64, their count,
    and the media type its name says."""
    return {
        "content": base64.b64encode(data).decode("ascii"),
        "encoding": "base64",
        "size_bytes": len(data),
        "mime_type": mime_type(path),
    }

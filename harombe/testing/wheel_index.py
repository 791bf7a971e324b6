"""A PEP 503 package index on the loopback interface, serving wheels made here: installs in
tests that never reach a real registry.

Example::

    from harombe.testing.wheel_index import WheelIndex, make_wheel

    with WheelIndex() as index:
        index.publish(make_wheel("tinypkg", "1.0"))
        with index.as_pip_config():  # PIP_INDEX_URL points at it for this block
            ...  # manager.install_package(sid, "tinypkg==1.0")

The index pages are served at ``http://127.0.0.1:<port>/simple/``; the files they link to at
``files_host`` (``127.0.0.1`` unless told, e.g. ``localhost``: another host name on the same
loopback server, to test which hosts downloads may come from). ``chunk_delay_s`` slows file
downloads down (64 KiB, then a pause), so a test can watch an install in progress.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


@dataclass(frozen=True)
class BuiltWheel:
    """A wheel file's name and bytes."""

    filename: str
    data: bytes

    @property
    def project(self) -> str:
        return self.filename.split("-")[0].lower().replace("_", "-")


def make_wheel(
    name: str,
    version: str,
    *,
    requires: Sequence[str] = (),
    files: Mapping[str, bytes] | None = None,
    padding_bytes: int = 0,
) -> BuiltWheel:
    """A valid pure-Python wheel (``RECORD`` holds every file's hash) whose ``METADATA``
    declares ``requires``; ``padding_bytes`` adds an incompressible data file of that size."""
    module = name.replace("-", "_")
    content = dict(files or {f"{module}/__init__.py": f"VERSION = {version!r}\n".encode()})
    if padding_bytes:
        content[f"{module}/padding.bin"] = os.urandom(padding_bytes)
    info = f"{module}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    content[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    content[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: harombe-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    content[f"{info}/top_level.txt"] = f"{module}\n".encode()
    lines = [f"{path},{_record_hash(data)},{len(data)}" for path, data in content.items()]
    content[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in content.items():
            archive.writestr(member, data)
    return BuiltWheel(f"{module}-{version}-py3-none-any.whl", buf.getvalue())


@dataclass
class WheelIndex:
    """A loopback PEP 503 index (see the module docstring); a context manager."""

    files_host: str = "127.0.0.1"
    chunk_delay_s: float = 0.0
    wheels: dict[str, BuiltWheel] = field(default_factory=dict)
    requested: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "use the index as a context manager"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The index URL pip is given."""
        return f"http://127.0.0.1:{self.port}/simple/"

    def publish(self, *wheels: BuiltWheel) -> None:
        for wheel in wheels:
            self.wheels[wheel.filename] = wheel

    def _page(self, project: str) -> bytes | None:
        links = [
            f'<a href="http://{self.files_host}:{self.port}/files/{w.filename}'
            f'#sha256={hashlib.sha256(w.data).hexdigest()}">{w.filename}</a>'
            for w in self.wheels.values()
            if w.project == project
        ]
        if not links:
            return None
        return ("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n").encode()

    def __enter__(self) -> WheelIndex:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                index.requested.append(path)
                body, kind = None, "text/html"
                if path.startswith("/simple/"):
                    body = index._page(path[len("/simple/") :].strip("/").lower())
                elif path.startswith("/files/"):
                    wheel = index.wheels.get(path[len("/files/") :])
                    body, kind = (wheel.data, "application/zip") if wheel else (None, kind)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                step = 65536
                for start in range(0, len(body), step):
                    self.wfile.write(body[start : start + step])
                    if index.chunk_delay_s and kind == "application/zip":
                        time.sleep(index.chunk_delay_s)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @contextlib.contextmanager
    def as_pip_config(self) -> Iterator[None]:
        """This process's pip configuration points at the index (and nothing else) inside the
        block: ``PIP_INDEX_URL`` set, other ``PIP_*`` sources and proxies unset."""
        saved = {
            k: v for k, v in os.environ.items() if k.startswith("PIP_") or "proxy" in k.lower()
        }
        for key in saved:
            del os.environ[key]
        os.environ.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=self.url)
        os.environ["NO_PROXY"] = "127.0.0.1,localhost"
        try:
            yield
        finally:
            for key in [k for k in os.environ if k.startswith("PIP_") or k == "NO_PROXY"]:
                del os.environ[key]
            os.environ.update(saved)

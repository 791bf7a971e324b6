"""Property-based fuzzing of the live service with schemathesis: whatever a client sends to any
operation of /openapi.json, the answer is never a server error."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import re
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from harombe.security.runtime.docker import DockerManager
from tests.integration.service_support import client, live_service, service_config

TOKEN = "fuzz-token-0123456789abcdef"


@contextlib.contextmanager
def empty_index() -> Iterator[str]:
    """A package index on loopback that has nothing (404 for every path): fuzzed package names
    never leave this machine, and the index answers, as a real one does for unknown names."""

    class Nothing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Nothing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


async def fuzz(docker_manager: DockerManager, index: str, report: Path) -> tuple[str, int]:
    """Run schemathesis against a live service whose installs use ``index``; its output and
    exit status."""
    config = service_config(
        {
            "service": {"tokens": [{"name": "fuzz", "token": TOKEN, "max_sandboxes": 6}]},
            "security": {"sandbox": {"network": {
                "allowed_registries": {"pypi": [index + "simple"], "npm": [index]}}}},
        }
    )  # fmt: skip
    async with live_service(docker_manager, config) as (_, base_url):
        st = Path(sys.executable).parent / "st"
        process = await asyncio.create_subprocess_exec(
            str(st), "run", f"{base_url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", "10", "--seed", "11", "--workers", "2",
            "--request-timeout", "90", "--max-time", "240",
            "--header", f"Authorization: Bearer {TOKEN}",
            "--report", "junit", "--report-junit-path", str(report),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
        async with client(base_url, TOKEN) as http_client:  # and the service is still well
            assert (await http_client.get("/v1/health")).json()["status"] == "ok"
    return output.decode(errors="replace"), int(process.returncode or 0)


async def test_no_server_errors_under_fuzzing(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """schemathesis finds 0 server errors across every operation (its counts are printed)."""
    report = tmp_path / "junit.xml"
    with empty_index() as index:
        text, returncode = await fuzz(docker_manager, index, report)
    print(text[-3000:])
    cases = list(ET.parse(report).getroot().iter("testcase"))
    failures = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failures == [], text[-6000:]
    assert returncode == 0, text[-6000:]
    assert len(cases) >= 20, [c.get("name") for c in cases]  # every operation was exercised
    generated = re.search(r"(\d+) generated", text)
    assert generated is not None and int(generated.group(1)) >= 500, text[-3000:]

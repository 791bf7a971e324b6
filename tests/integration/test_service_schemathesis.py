"""Property-based fuzzing of the live service with schemathesis: whatever a client sends to any
operation of /openapi.json, the answer is never a server error. The install route is left out:
its index is a closed port here, so it answers 502 by design (test_service_v1 covers its 4xx)."""

from __future__ import annotations

import asyncio
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harombe.security.runtime.docker import DockerManager
from tests.integration.service_support import client, live_service, service_config

TOKEN = "fuzz-token-0123456789abcdef"
#: Installs go to a closed loopback port: fuzzed package names never leave this machine.
CLOSED = "http://127.0.0.1:9/"


async def test_no_server_errors_under_fuzzing(
    docker_manager: DockerManager, tmp_path: Path
) -> None:
    """schemathesis finds 0 server errors across every operation (its counts are printed)."""
    config = service_config(
        {
            "service": {"tokens": [{"name": "fuzz", "token": TOKEN, "max_sandboxes": 6}]},
            "security": {"sandbox": {"network": {
                "allowed_registries": {"pypi": [CLOSED + "simple"], "npm": [CLOSED]}}}},
        }
    )  # fmt: skip
    report = tmp_path / "junit.xml"
    async with live_service(docker_manager, config) as (_, base_url):
        st = Path(sys.executable).parent / "st"
        process = await asyncio.create_subprocess_exec(
            str(st), "run", f"{base_url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", "10", "--seed", "11", "--workers", "2",
            "--request-timeout", "90", "--max-time", "240",
            # Installs here go to a closed port, so each answers 502 (PackageFetchError: the
            # index cannot be reached), the designed answer for an index that is down.
            "--exclude-path", "/v1/sandboxes/{sandbox_id}/packages",
            "--header", f"Authorization: Bearer {TOKEN}",
            "--report", "junit", "--report-junit-path", str(report),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
        async with client(base_url, TOKEN) as http:  # and the service is still well
            assert (await http.get("/v1/health")).json()["status"] == "ok"
    text = output.decode(errors="replace")
    print(text[-3000:])
    cases = list(ET.parse(report).getroot().iter("testcase"))
    failures = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failures == [], text[-6000:]
    assert process.returncode == 0, text[-6000:]
    assert len(cases) >= 19  # every operation but the install route was exercised
    generated = re.search(r"(\d+) generated", text)
    assert generated is not None and int(generated.group(1)) >= 500, text[-3000:]

"""The fips-agents sidecar contract, against a live ``harombe serve`` on real gVisor."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harombe.security.runtime.docker import DockerManager
from harombe.service.state import Service
from harombe.testing import capture_events
from tests.integration.service_support import client, live_service, service_config

TUTORIAL = Path(__file__).parent / "tutorial"
#: A user profile without static scans and with the runtime layer observing only, so what a
#: request leaves behind (files, processes) can be probed.
LAB_PROFILE = """\
name: lab
description: no static scans, runtime layer observing (tests only)
extends: minimal
imports:
  additional: [os, subprocess, sys]
scan_stages:
  pre: []
  post: []
audit:
  mode: {runtime: observe}
"""
#: A user profile whose timeout_max is 1 s: it caps a request's longer timeout.
BRIEF_PROFILE = """\
name: brief
description: minimal with a 1 s ceiling (tests only)
extends: minimal
resources:
  timeout_max: 1
"""
MINIMAL_IMPORTS = sorted(
    [
        "math",
        "statistics",
        "itertools",
        "functools",
        "re",
        "datetime",
        "collections",
        "json",
        "csv",
        "string",
        "textwrap",
        "decimal",
        "fractions",
        "random",
        "operator",
        "typing",
    ]
)


@pytest.fixture(scope="module")
async def fips(
    docker_manager: DockerManager, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Service, str]]:
    profiles = tmp_path_factory.mktemp("profiles")
    (profiles / "lab.yaml").write_text(LAB_PROFILE)
    (profiles / "brief.yaml").write_text(BRIEF_PROFILE)
    config = service_config(
        {"security": {"profiles": {"directory": str(profiles)}},
         "service": {"request_profiles": ["lab", "brief"]}}
    )  # fmt: skip
    async with live_service(docker_manager, config) as running:
        yield running


async def post(base_url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with client(base_url) as http:
        response = await http.post("/execute", json=body)
    return response.status_code, response.json()


async def test_healthz(fips: tuple[Service, str]) -> None:
    """GET /healthz answers 200 {"status": "ok"}."""
    async with client(fips[1]) as http:
        response = await http.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


async def test_profile_describes_the_active_profile(fips: tuple[Service, str]) -> None:
    """GET /profile shows minimal: sorted imports, blocklist size, scan stages."""
    async with client(fips[1]) as http:
        body = (await http.get("/profile")).json()
    assert body["name"] == "minimal"
    assert set(body) == {"name", "description", "allowed_imports", "blocklist_entries",
                         "scan_stages"}  # fmt: skip
    assert body["allowed_imports"] == MINIMAL_IMPORTS
    assert body["blocklist_entries"] == 0
    assert body["scan_stages"] == {"pre": ["ast_scan", "blocklist_audit"], "post": []}


async def test_ran_code_answers_the_fips_fields_and_result(fips: tuple[Service, str]) -> None:
    """A run answers stdout, stderr, exit_code, timed_out, and the final expression's repr."""
    status, body = await post(fips[1], {"code": "import math\nprint(1)\nmath.sqrt(16)"})
    assert status == 200
    assert body == {"stdout": "1\n", "stderr": "", "exit_code": 0, "timed_out": False,
                    "result": "4.0"}  # fmt: skip


@pytest.mark.parametrize(
    ("code", "exit_code", "in_stderr"),
    [
        ("raise SystemExit(42)", 42, ""),
        ("1/0", 1, "ZeroDivisionError: division by zero"),
        ("import math\nmath.sqrt(-1)", 1, "ValueError"),
    ],
    ids=["system-exit-42", "zero-division", "math-domain-error"],
)
async def test_failing_code_is_a_200_with_its_exit_code(
    fips: tuple[Service, str], code: str, exit_code: int, in_stderr: str
) -> None:
    """Code that fails answers 200 with its exit code and traceback."""
    status, body = await post(fips[1], {"code": code})
    assert status == 200
    assert body["exit_code"] == exit_code and body["timed_out"] is False
    assert in_stderr in body["stderr"]


@pytest.mark.parametrize("code", ["", "   ", "\n\t\n"], ids=["empty", "spaces", "whitespace"])
async def test_no_code_is_400(fips: tuple[Service, str], code: str) -> None:
    """Empty or white-space code answers 400 {"error": "No code provided"}."""
    assert await post(fips[1], {"code": code}) == (400, {"error": "No code provided"})


async def test_refused_code_lists_violations_by_line(fips: tuple[Service, str]) -> None:
    """A scan refusal answers 400 with "Code validation failed" and "Line N: …" violations."""
    status, body = await post(fips[1], {"code": "x = 1\nimport os\nos.system('ls')"})
    assert status == 400
    assert body["error"] == "Code validation failed"
    assert body["violations"] and body["violations"][0].startswith("Line 2: ")
    assert "'os'" in body["violations"][0]


async def test_syntax_error_is_one_violation(fips: tuple[Service, str]) -> None:
    """A syntax error is one violation with Python's own message and line."""
    status, body = await post(fips[1], {"code": "print((1)"})
    assert (status, body["violations"]) == (
        400,
        ["SyntaxError: '(' was never closed (line 1)"],
    )


@pytest.mark.parametrize(
    "bad",
    [0, -1, 30.5, 1000, "soon", None],
    ids=["zero", "negative", "over-30", "huge", "text", "null"],
)
async def test_bad_timeouts_are_422_in_the_frameworks_shape(
    fips: tuple[Service, str], bad: object
) -> None:
    """A timeout outside 0 < t ≤ 30 answers 422 with FastAPI's validation error shape."""
    status, body = await post(fips[1], {"code": "print(1)", "timeout": bad})
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "timeout"]


async def test_timeout_kills_the_run_and_keeps_earlier_output(fips: tuple[Service, str]) -> None:
    """A run past its timeout answers exit_code -9, timed_out, the sidecar's message, and
    the output printed before."""
    code = "print('before', flush=True)\nwhile True:\n    pass"
    status, body = await post(fips[1], {"code": code, "timeout": 1})
    assert status == 200
    assert body["timed_out"] is True and body["exit_code"] == -9
    assert body["stderr"] == "Execution timed out after 1.0s"
    assert body["stdout"] == "before\n"


async def test_the_profiles_timeout_max_caps_the_requests_timeout(
    fips: tuple[Service, str],
) -> None:
    """A 10 s request under a profile whose timeout_max is 1 s is killed after 1 s."""
    code = "print('start', flush=True)\nwhile True:\n    pass"
    status, body = await post(fips[1], {"code": code, "timeout": 10, "profile": "brief"})
    assert (status, body["timed_out"], body["exit_code"]) == (200, True, -9)
    assert body["stderr"] == "Execution timed out after 1.0s" and body["stdout"] == "start\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_each_stream_is_cut_at_50_kb(fips: tuple[Service, str], stream: str) -> None:
    """Output past 50 KB (bytes) is cut there, with the sidecar's note appended."""
    target = "" if stream == "stdout" else ", file=__import__('sys').stderr"
    code = f"print('é' * 60000{target})"
    status, body = await post(fips[1], {"code": code, "profile": "lab"})
    assert status == 200
    text = body[stream]
    assert text.endswith("\n[output truncated at 50 KB]")
    kept = text[: -len("\n[output truncated at 50 KB]")]
    assert len(kept.encode()) <= 50 * 1024 and set(kept) <= {"é", "\ufffd"}


async def test_requests_are_independent(fips: tuple[Service, str]) -> None:
    """Nothing one request leaves — globals, files in /tmp, processes — is seen by the next."""
    leave = (
        "import subprocess\nsecret = 41\n"
        "subprocess.run(['sh', '-c', 'echo x > /tmp/left'], check=True)\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\nprint('left')"
    )
    first = (await post(fips[1], {"code": leave, "profile": "lab"}))[1]
    assert first["stdout"] == "left\n", first
    look = (
        "import subprocess\nprint('secret' in globals())\n"
        "shell = 'test -e /tmp/left && echo file || echo no-file; ps -eo comm | grep -cx sleep'\n"
        "print(subprocess.run(['sh', '-c', shell], capture_output=True, text=True).stdout)"
    )
    status, body = await post(fips[1], {"code": look, "profile": "lab"})
    assert (status, body["stdout"]) == (200, "False\nno-file\n0\n\n"), body


async def test_unknown_profile_is_400(fips: tuple[Service, str]) -> None:
    """A request naming a profile that does not exist answers 400 naming the known ones."""
    status, body = await post(fips[1], {"code": "print(1)", "profile": "nope"})
    assert status == 400 and "minimal" in body["error"]


async def test_a_printed_fake_audit_line_reaches_only_stdout(fips: tuple[Service, str]) -> None:
    """Code printing a forged audit record gets it back on stdout; no audit event holds it."""
    forged = json.dumps({"class_uid": 2001, "activity": "approved", "marker": "forged-7f3a"})
    with capture_events() as events:
        status, body = await post(fips[1], {"code": f"print({forged!r})"})
    assert status == 200 and "forged-7f3a" in body["stdout"]
    # Code is logged at debug only (tool.params); no event of the audit (info and above) has it.
    audit = [event for event in events if event.get("log_level") != "debug"]
    assert audit and not any("forged-7f3a" in repr(event) for event in audit)


async def test_the_tutorials_tool_works_unchanged(
    fips: tuple[Service, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent tutorial's tools/code_executor.py, unchanged, gets output and results."""
    monkeypatch.setenv("SANDBOX_URL", fips[1])
    monkeypatch.syspath_prepend(str(TUTORIAL))
    sys.modules.pop("tools.code_executor", None)
    tool = importlib.import_module("tools.code_executor")
    assert await tool.code_executor("print(2 + 2)") == "4\n"
    assert await tool.code_executor("import math\nmath.factorial(5)") == "Result: 120"
    refused = await tool.code_executor("import os")
    assert refused.startswith("Sandbox error (HTTP 400): ")
    assert "Code validation failed" in refused

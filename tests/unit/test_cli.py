"""The ``harombe`` command line without Docker: the command list, language detection, option
errors, exit codes, ``ls``'s rows and the doctor's verdicts read from fake probe outputs."""

from __future__ import annotations

import copy
import io
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harombe.cli import COMMANDS, main
from harombe.cli import doctor as doctor_module
from harombe.cli.common import Status, build_config, hitl_requested, with_limits
from harombe.cli.doctor_probes import CANARY_ENV, CHECKS, ROOT_PROBE, Verdict, evaluate
from harombe.cli.run import detect_language, exit_code_of, message_of
from harombe.cli.sandboxes import age_text, describe, remove_sandboxes, table
from harombe.config import Limits, load_config, parse_config
from harombe.errors import UsageError
from harombe.security.runtime.backend import ContainerInfo
from harombe.security.runtime.sandbox import LABEL_MANAGED, LABEL_SANDBOX, process_owner
from harombe.testing import FakeDocker


def call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str,
    stdin: str = "",
) -> tuple[int, str, str]:
    """Run the CLI as ``python -m harombe`` does: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- the command list and help ------------------------------------------------------------


def test_help_lists_every_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``harombe --help`` names every command with its one-line help."""
    code, out, _ = call(monkeypatch, capsys, "--help")
    assert code == 0
    for name, (_, _, summary) in COMMANDS.items():
        assert name in out and summary in out


OWN_COMMANDS = [["run"], ["ls"], ["rm"], ["doctor"], ["demo"], ["images", "build"], ["serve"]]


@pytest.mark.parametrize("words", OWN_COMMANDS, ids=[" ".join(w) for w in OWN_COMMANDS])
def test_each_command_has_help(
    words: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command answers --help with exit 0 and a usage line naming it."""
    code, out, _ = call(monkeypatch, capsys, *words, "--help")
    assert code == 0
    assert f"Usage: harombe {' '.join(words)}" in out


def test_run_help_documents_the_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``harombe run --help`` lists 124 (timeout) and 137 (out of memory)."""
    out = call(monkeypatch, capsys, "run", "--help")[1]
    assert "124" in out and "timeout" in out and "137" in out and "memory" in out


def test_main_returns_the_exit_code_instead_of_exiting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``main(argv)`` returns a command's exit code (``python -m harombe`` exits with it)."""
    assert main(["rm"]) == 2
    assert "name sandbox ids or --all" in capsys.readouterr().err


# ---- run: language, options, exit codes ---------------------------------------------------

LANGUAGE_CASES = [
    ("script.py", None, "python"),
    ("SCRIPT.PY", None, "python"),
    ("app.js", None, "javascript"),
    ("app.mjs", None, "javascript"),
    ("app.cjs", None, "javascript"),
    ("job.sh", None, "shell"),
    ("job.bash", None, "shell"),
    ("job.txt", "shell", "shell"),
    ("script.py", "javascript", "javascript"),
    ("-", "python", "python"),
]


@pytest.mark.parametrize(("file", "language", "expected"), LANGUAGE_CASES,
                         ids=[f"{f}-{lang}" for f, lang, _ in LANGUAGE_CASES])  # fmt: skip
def test_language_comes_from_the_extension_or_the_option(
    file: str, language: str | None, expected: str
) -> None:
    """--language wins; otherwise the extension decides."""
    assert detect_language(file, language) == expected


@pytest.mark.parametrize(("file", "says"), [("-", "needs --language"),
                                            ("notes.txt", "cannot tell the language"),
                                            ("Makefile", "cannot tell the language")],
                         ids=["stdin", "unknown-extension", "no-extension"])  # fmt: skip
def test_an_unknown_language_is_a_usage_error(file: str, says: str) -> None:
    """Without --language, stdin or an unknown extension is refused with the fix named."""
    with pytest.raises(UsageError, match=says):
        detect_language(file, None)


USAGE_ERRORS = [
    (["run", "-"], "print(1)", "harombe run: reading the program from stdin needs --language"),
    (["run", "notes.txt"], "", "harombe run: cannot tell the language of 'notes.txt'"),
    (["run", "/nonexistent/x.py"], "", "harombe run: cannot read the program"),
    (["run", "--timeout", "0", "x.py"], "", "Invalid value for '--timeout'"),
    (["run", "--timeout", "soon", "x.py"], "", "Invalid value for '--timeout'"),
    (["run", "--memory-mb", "8", "x.py"], "", "Invalid value for '--memory-mb'"),
    (["run", "--cpus", "0", "x.py"], "", "Invalid value for '--cpus'"),
    (["run", "--language", "cobol", "-"], "", "Invalid value for '-l' / '--language'"),
    (["run"], "", "Missing argument 'FILE|-'"),
    (["run", "-l", "python", "--config", "/nonexistent.yaml", "-"], "1",
     "harombe run: config file /nonexistent.yaml does not exist"),
    (["rm"], "", "harombe rm: name sandbox ids or --all"),
    (["rm", "--all", "sandbox-0123456789ab"], "", "harombe rm: name sandbox ids or --all"),
    (["rm", "not-a-sandbox"], "", "harombe rm: 'not-a-sandbox' is not a sandbox id"),
    (["rm", "sandbox-0123456789AB"], "", "is not a sandbox id"),
    (["doctor", "--config", "/nonexistent.yaml"], "", "config file /nonexistent.yaml"),
    (["ls", "--bogus"], "", "No such option '--bogus'"),
]


@pytest.mark.parametrize(("args", "stdin", "says"), USAGE_ERRORS,
                         ids=[" ".join(a)[:40] for a, _, _ in USAGE_ERRORS])  # fmt: skip
def test_bad_usage_exits_2_with_a_message(
    args: list[str], stdin: str, says: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bad options, files, ids and config paths exit 2 on stderr before Docker is touched."""
    code, out, err = call(monkeypatch, capsys, *args, stdin=stdin)
    assert code == 2 and out == ""
    assert says in err


EXIT_CASES = [
    ({"status": "ok", "exit_code": 0}, 0),
    ({"status": "error", "exit_code": 3}, 3),
    ({"status": "error", "exit_code": 255}, 255),
    ({"status": "error", "exit_code": -15}, 143),
    ({"status": "error", "exit_code": -9}, 137),
    ({"status": "error", "exit_code": 70000}, 1),
    ({"status": "timeout", "exit_code": -1}, 124),
    ({"status": "oom", "exit_code": 137}, 137),
    ({"status": "cancelled", "exit_code": -1}, 130),
    ({"status": "lost", "exit_code": -1, "error": "SandboxLostError: gone"}, 1),
    ({"success": False, "error": "ApprovalDeniedError: no"}, 1),
]


@pytest.mark.parametrize(("result", "code"), EXIT_CASES,
                         ids=[f"{r.get('status', 'refused')}-{r.get('exit_code')}"
                              for r, _ in EXIT_CASES])  # fmt: skip
def test_exit_code_mapping(result: dict[str, Any], code: int) -> None:
    """The program's exit code passes through; signals are 128+N; timeout 124, oom 137,
    Ctrl-C 130; a call harombe could not run is 1."""
    assert exit_code_of(result) == code


def test_harombe_speaks_after_a_timeout_or_a_refusal_only() -> None:
    """A program's own exit gets no harombe message; a timeout and a refusal do."""
    assert message_of({"status": "error", "exit_code": 3}) is None
    assert "timed out after 2 s (exit 124)" in str(message_of({"status": "timeout",
                                                               "timeout_s": 2.0}))  # fmt: skip
    assert message_of({"success": False, "error": "ApprovalDeniedError: no"}) == (
        "ApprovalDeniedError: no"
    )


def test_limit_options_build_the_config(tmp_path: Path) -> None:
    """A limit option replaces the configured one; the warm pool is off for one-shot runs; a
    timeout above the ceiling lifts it."""
    config = with_limits(load_config(environ={}), max_memory_mb=96, max_cpu_cores=1.5,
                         max_execution_time=900)  # fmt: skip
    limits = config.security.sandbox.limits
    assert (limits.max_memory_mb, limits.max_cpu_cores) == (96, 1.5)
    assert limits.max_execution_time == 900 and limits.max_timeout_s >= 900
    assert config.security.sandbox.pool.size == 0
    path = tmp_path / "harombe.yaml"
    path.write_text("security:\n  sandbox:\n    limits:\n      max_memory_mb: 300\n")
    assert build_config(str(path)).security.sandbox.limits.max_memory_mb == 300


GATE_CASES = [
    ({}, False),
    ({"security": {"hitl": {"enabled": True}}}, True),
    ({"security": {"hitl": {"rules": []}}}, True),
    ({"security": {"hitl": {"enabled": False}}}, False),
    ({"security": {"sandbox": {}}}, False),
]


@pytest.mark.parametrize(("data", "gated"), GATE_CASES,
                         ids=["default", "enabled", "section", "disabled", "other-section"])
def test_the_gate_asks_only_when_the_config_asks_for_it(data: dict[str, Any], gated: bool) -> None:
    """The CLI runs without the HITL gate unless the config has a hitl section leaving it on."""
    assert hitl_requested(parse_config(data)) is gated


# ---- ls and rm ----------------------------------------------------------------------------


def container(owner: str, *, created_s: float = 1000.0, sandbox: str = "sandbox-0123456789ab"
              ) -> ContainerInfo:  # fmt: skip
    labels = {LABEL_MANAGED: "1", LABEL_SANDBOX: sandbox, "harombe.owner": owner,
              "harombe.language": "shell"}  # fmt: skip
    return ContainerInfo(id="c" * 64, name="harombe-x", status="running", labels=labels,
                         image="harombe/sandbox:latest", created_s=created_s)  # fmt: skip


OWNER_CASES = [
    (process_owner(), True),
    (f"{socket.gethostname()}:{os.getpid()}:0", False),  # the pid was reused since
    ("another-machine:1:5", None),
    ("", None),
]


@pytest.mark.parametrize(
    ("owner", "alive"), OWNER_CASES, ids=["this-process", "pid-reused", "other-host", "unlabelled"]
)
def test_ls_rows_say_whether_the_owner_still_runs(owner: str, alive: bool | None) -> None:
    """A row carries id, language, image, owner pid, owner liveness, age and state."""
    row = describe(container(owner), now_s=1090.0, hostname=socket.gethostname())
    assert row["owner_alive"] is alive
    assert (row["sandbox_id"], row["language"], row["image"]) == (
        "sandbox-0123456789ab", "shell", "harombe/sandbox:latest")  # fmt: skip
    assert row["age_s"] == 90.0 and row["state"] == "running"
    text = table([row])
    assert "SANDBOX" in text and "sandbox-0123456789ab" in text and "1m" in text


@pytest.mark.parametrize(("age_s", "text"), [(None, "?"), (5, "5s"), (59.9, "59s"), (60, "1m"),
                                             (7200, "2h"), (3 * 86400, "3d")])  # fmt: skip
def test_ages_read_at_a_glance(age_s: float | None, text: str) -> None:
    """Ages are shown in their largest whole unit."""
    assert age_text(age_s) == text


async def test_rm_removes_named_sandboxes_and_reports_unknown_ones(docker: FakeDocker) -> None:
    """The named sandbox's container goes, another stays, and an unknown id is returned."""
    made = {}
    for sid in ("sandbox-aaaaaaaaaaaa", "sandbox-bbbbbbbbbbbb"):
        made[sid] = await docker.create_container(
            image="harombe/sandbox:latest", labels={LABEL_MANAGED: "1", LABEL_SANDBOX: sid})
    unknown = await remove_sandboxes(docker, ["sandbox-aaaaaaaaaaaa", "sandbox-cccccccccccc"])
    assert unknown == ["sandbox-cccccccccccc"]
    assert set(docker.containers) == {made["sandbox-bbbbbbbbbbbb"]}


# ---- doctor: verdicts from probe outputs --------------------------------------------------

CANARY = (CANARY_ENV, "f00dfeedcafe")
LIMITS = Limits(max_memory_mb=512, max_pids=128, max_disk_mb=1024)
STATUS_TEXT = ("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nCapInh:\t0000000000000000\n"
               "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
               "CapBnd:\t00000000000000e0\n")  # fmt: skip
MOUNTS_TEXT = ("none / 9p ro,trans=fd 0 0\nnone /tmp tmpfs rw,noexec,size=256m 0 0\n"
               "none /workspace tmpfs rw,noexec,size=1024m,uid=1000 0 0\n")  # fmt: skip


def ok(value: Any) -> dict[str, Any]:
    return {"ok": True, "value": value}


def refused(code: int, text: str) -> dict[str, Any]:
    return {"ok": False, "errno": code, "error": text}


def run_result(status: str, stdout: object = "") -> dict[str, Any]:
    text = stdout if isinstance(stdout, str) else json.dumps(stdout)
    return {"status": status, "stdout": text, "stderr": "", "error": None}


def passing_facts() -> dict[str, Any]:
    """What the facts probe reports in a gVisor sandbox (as measured)."""
    return {
        "dmesg": ok("[    0.000000] Starting gVisor...\n[    0.1] Consulting tar man page..."),
        "proc_version": ok("Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"),
        "interfaces": ok(["lo"]),
        "connect": refused(113, "[Errno 113] No route to host"),
        "write_root": refused(30, f"[Errno 30] Read-only file system: '{ROOT_PROBE}'"),
        "mounts": ok(MOUNTS_TEXT),
        "status": ok(STATUS_TEXT),
        "no_new_privs": ok(1),
        "ids": [1000, 1000, 1000, 1000, []],
        "environ": {"PATH": "/usr/bin:/bin", "HOME": "/home/sandbox"},
        "workspace": ok({"read_back": "probe", "size_bytes": 1024 * 1_048_576}),
    }


def passing_results() -> dict[str, dict[str, Any]]:
    return {
        "facts": run_result("ok", passing_facts()),
        "kill": run_result("ok", {"killed": False, "errno": 1, "error": "Operation not permitted"}),
        "pids": run_result("ok", {"started": 127, "error": "RuntimeError(\"can't start\")"}),
        "timeout": run_result("timeout", ""),
        "memory": run_result("oom", ""),
    }


def fact(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(results: dict[str, Any]) -> None:
        facts = json.loads(results["facts"]["stdout"])
        facts[key] = value
        results["facts"]["stdout"] = json.dumps(facts)

    return change


def probe(name: str, status: str, stdout: object = "") -> Callable[[dict[str, Any]], None]:
    def change(results: dict[str, Any]) -> None:
        results[name] = run_result(status, stdout)

    return change


#: One failing probe output per check: (check that must fail, how the output is changed).
FAILURES: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("kernel is gVisor", "host-kernel-dmesg", fact("dmesg", ok("[0.0] Linux version 6.8.0"))),
    ("kernel is gVisor", "dmesg-refused", fact("dmesg", refused(1, "Operation not permitted"))),
    ("no network", "eth0-present", fact("interfaces", ok(["eth0", "lo"]))),
    ("no network", "connect-succeeds", fact("connect", ok(None))),
    ("no network", "connect-times-out", fact("connect", refused(None, "timed out"))),
    ("read-only root", "write-succeeds", fact("write_root", ok(None))),
    ("read-only root", "write-eacces", fact("write_root", refused(13, "Permission denied"))),
    ("read-only root", "root-mounted-rw",
     fact("mounts", ok(MOUNTS_TEXT.replace("9p ro", "9p rw")))),
    ("read-only root", "probe-on-own-mount",
     fact("mounts", ok(MOUNTS_TEXT + "none /var/tmp tmpfs ro 0 0\n"))),
    ("non-root user", "uid-0", fact("ids", [0, 0, 1000, 1000, []])),
    ("non-root user", "gid-0", fact("ids", [1000, 1000, 0, 0, []])),
    ("non-root user", "group-0", fact("ids", [1000, 1000, 1000, 1000, [0]])),
    ("no capabilities", "cap-eff", fact("status", ok(STATUS_TEXT.replace(
        "CapEff:\t0000000000000000", "CapEff:\t00000000a80425fb")))),
    ("no capabilities", "cap-amb", fact("status", ok(STATUS_TEXT + "CapAmb:\t0000000000000020\n"))),
    ("no capabilities", "status-unreadable", fact("status", refused(13, "Permission denied"))),
    ("no_new_privs set", "prctl-0", fact("no_new_privs", ok(0))),
    ("no_new_privs set", "status-says-0",
     fact("status", ok(STATUS_TEXT + "NoNewPrivs:\t0\n"))),
    ("no host environment", "canary-name", fact("environ", {CANARY_ENV: "x"})),
    ("no host environment", "canary-value", fact("environ", {"LEAK": "a-f00dfeedcafe-b"})),
    ("/workspace writable, size-limited", "not-writable",
     fact("workspace", refused(30, "Read-only file system"))),
    ("/workspace writable, size-limited", "unlimited",
     fact("workspace", ok({"read_back": "probe", "size_bytes": 64 * 2**30}))),
    ("memory limit binds", "memory-survives", probe("memory", "ok", "allocated")),
    ("memory limit binds", "memory-lost", probe("memory", "lost")),
    ("pids limit binds", "no-refusal", probe("pids", "ok", {"started": 320, "error": None})),
    ("pids limit binds", "refused-too-late",
     probe("pids", "ok", {"started": 500, "error": "RuntimeError"})),
    ("timeout binds", "ran-to-the-end", probe("timeout", "ok", "slept")),
    ("supervisor cannot be killed", "killed",
     probe("kill", "ok", {"killed": True})),
    ("supervisor cannot be killed", "sandbox-lost", probe("kill", "lost")),
    ("supervisor cannot be killed", "esrch",
     probe("kill", "ok", {"killed": False, "errno": 3, "error": "No such process"})),
]


def verdicts_of(results: dict[str, Any]) -> dict[str, Verdict]:
    return {v.name: v for v in evaluate(results, limits=LIMITS, canary=CANARY)}


def test_every_check_passes_on_gvisor_output() -> None:
    """The outputs measured in a gVisor sandbox pass every isolation check."""
    verdicts = verdicts_of(passing_results())
    assert set(verdicts) == set(CHECKS)
    assert [v.name for v in verdicts.values() if not v.passed] == []


@pytest.mark.parametrize(("check", "change"), [(c, f) for c, _, f in FAILURES],
                         ids=[i for _, i, _ in FAILURES])  # fmt: skip
def test_each_check_fails_on_a_failing_probe_output(
    check: str, change: Callable[[dict[str, Any]], None]
) -> None:
    """Changed to what a broken isolation would report, exactly that check fails."""
    results = copy.deepcopy(passing_results())
    change(results)
    failed = [v.name for v in verdicts_of(results).values() if not v.passed]
    assert failed == [check]


def test_every_check_can_fail() -> None:
    """The failure table exercises every check (none of them always passes)."""
    assert {check for check, _, _ in FAILURES} == set(CHECKS)


@pytest.mark.parametrize("results", [{}, {"facts": run_result("lost", "")},
                                     {name: run_result("ok", "not json") for name in
                                      ("facts", "kill", "pids", "timeout", "memory")}],
                         ids=["nothing-ran", "facts-lost", "garbage"])  # fmt: skip
def test_missing_evidence_fails(results: dict[str, Any]) -> None:
    """A probe that did not report fails the checks that read it: silence is not a pass."""
    verdicts = verdicts_of(results)
    assert not verdicts["kernel is gVisor"].passed
    assert not verdicts["no host environment"].passed
    assert not verdicts["supervisor cannot be killed"].passed


@pytest.mark.parametrize(("verdicts", "code"), [
    ([Verdict("setup", "Docker answers", True, "ok")], 0),
    ([Verdict("setup", "Docker answers", True, "ok"),
      Verdict("isolation", "kernel is gVisor", False, "dmesg: Linux")], 1),
], ids=["all-pass", "one-fails"])  # fmt: skip
def test_doctor_exits_nonzero_on_any_failure(
    verdicts: list[Verdict], code: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The table lists every check with PASS/FAIL; --json says the same; exit 0 only if all
    pass."""

    async def diagnose(config: Any) -> list[Verdict]:
        return verdicts

    monkeypatch.setattr(doctor_module, "diagnose", diagnose)
    shown, out, _ = call(monkeypatch, capsys, "doctor")
    assert shown == code
    for v in verdicts:
        assert f"{'PASS' if v.passed else 'FAIL'}  {v.group:9}  {v.name}" in out
    as_code, as_json, _ = call(monkeypatch, capsys, "doctor", "--json")
    report = json.loads(as_json)
    assert as_code == code and report["passed"] is (code == 0)
    assert [c["name"] for c in report["checks"]] == [v.name for v in verdicts]


def test_status_lines_are_plain_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """Off a terminal, each step is one line on stderr (no spinner escape codes)."""
    with Status("first step", tty=False) as status:
        status.update("second step")
        status.echo("a result line")
    captured = capsys.readouterr()
    assert captured.err == "… first step\n… second step\n"
    assert captured.out == "a result line\n"

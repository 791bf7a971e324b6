"""The ``harombe`` command line as a process, on real gVisor: ``run`` (files, stdin, exit
codes, separate streams, timeout, Ctrl-C), ``ls``/``rm`` across processes, and ``doctor``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harombe.cli.doctor_probes import CHECKS
from harombe.security.runtime.docker import DockerManager

pytestmark = pytest.mark.integration

#: Every call gets the built-in configuration (no file, no overrides from the caller's shell).
ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}


def harombe(*args: str, stdin: str | None = None, timeout_s: float = 180,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "harombe", *args], input=stdin, capture_output=True, text=True,
        timeout=timeout_s, env=env or ENV,
    )  # fmt: skip


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harombe", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip


def sandboxes() -> list[dict[str, Any]]:
    done = harombe("ls", "--json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def sandbox_of(pid: int) -> dict[str, Any]:
    """The sandbox process ``pid`` made, once ``ls`` shows it (within 60 s)."""
    for _ in range(120):
        mine = [row for row in sandboxes() if row["owner_pid"] == pid]
        if mine:
            return mine[0]
        time.sleep(0.5)
    raise AssertionError(f"no sandbox of process {pid} appeared")


PROGRAMS = [
    ("hello.py", "import sys\nprint('py', sys.version_info[0])\n", "py 3\n"),
    ("hello.js", "console.log('js', [1, 2].length)\n", "js 2\n"),
    ("hello.mjs", "console.log('mjs', typeof process)\n", "mjs object\n"),
    ("hello.sh", "echo sh $((6 * 7))\n", "sh 42\n"),
]


@pytest.mark.parametrize(("name", "code", "expected"), PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_run_a_file_by_its_extension(tmp_path: Path, name: str, code: str, expected: str) -> None:
    """A .py/.js/.mjs/.sh file runs in its language; its output is printed; exit 0."""
    path = tmp_path / name
    path.write_text(code)
    done = harombe("run", str(path))
    assert (done.returncode, done.stdout) == (0, expected), done.stderr


def test_run_reads_the_program_from_stdin() -> None:
    """``run - --language shell`` runs what comes on stdin."""
    done = harombe("run", "-", "--language", "shell", stdin="echo from stdin; id -u\n")
    assert (done.returncode, done.stdout) == (0, "from stdin\n1000\n"), done.stderr


EXITS = [
    ("exit.py", "import sys\nsys.exit(3)\n", 3),
    ("exit.js", "process.exit(5)\n", 5),
    ("exit.sh", "exit 42\n", 42),
    ("signal.py", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", 128 + 15),
]


@pytest.mark.parametrize(("name", "code", "status"), EXITS, ids=[e[0] for e in EXITS])
def test_the_program_exit_code_is_the_cli_exit_code(
    tmp_path: Path, name: str, code: str, status: int
) -> None:
    """The CLI exits with the program's own exit code (128+N when killed by signal N)."""
    path = tmp_path / name
    path.write_text(code)
    done = harombe("run", str(path))
    assert done.returncode == status, done.stderr
    assert "harombe run:" not in done.stderr  # the program's own exit: harombe says nothing


def test_stdout_and_stderr_stay_apart(tmp_path: Path) -> None:
    """What the program writes to stderr reaches stderr only, and stdout stdout only."""
    path = tmp_path / "streams.py"
    path.write_text("import sys\nprint('to out')\nprint('to err', file=sys.stderr)\n"
                    "print('out again')\n")  # fmt: skip
    done = harombe("run", str(path))
    assert done.returncode == 0
    assert done.stdout == "to out\nout again\n"
    assert done.stderr == "to err\n"


def test_a_timeout_exits_124(tmp_path: Path) -> None:
    """A program past --timeout is killed: exit 124, its output so far kept, harombe says so."""
    path = tmp_path / "slow.py"
    path.write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    done = harombe("run", "--timeout", "2", str(path))
    assert done.returncode == 124
    assert done.stdout == "started\n"
    assert "harombe run: timed out after 2 s (exit 124)" in done.stderr


def test_a_memory_limit_option_binds(tmp_path: Path) -> None:
    """--memory-mb is the sandbox's limit: allocating past it exits 137 (out of memory)."""
    path = tmp_path / "hungry.py"
    path.write_text("chunks = []\nfor _ in range(64):\n    chunks.append(b'x' * (8 << 20))\n"
                    "print('allocated 512 MiB')\n")  # fmt: skip
    done = harombe("run", "--memory-mb", "64", str(path))
    assert done.returncode == 137, done.stderr
    assert "max_memory_mb=64" in done.stderr and "allocated" not in done.stdout


def test_output_streams_and_ctrl_c_removes_the_sandbox(tmp_path: Path) -> None:
    """Output arrives while the program still runs; Ctrl-C exits 130 and removes the sandbox."""
    path = tmp_path / "forever.sh"
    path.write_text("echo first line\nsleep 300\n")
    process = start("run", str(path))
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "first line\n"  # printed before the program ended
        sandbox = sandbox_of(process.pid)
        assert sandbox["owner_alive"] is True and sandbox["language"] == "shell"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
    finally:
        process.kill()
        process.wait()
    assert sandbox["sandbox_id"] not in {row["sandbox_id"] for row in sandboxes()}


def test_ls_and_rm_reach_another_process_sandbox(tmp_path: Path) -> None:
    """``ls`` lists a sandbox another process made (its pid, alive); ``rm`` removes it; a
    second ``rm`` of the same id is an unknown id (exit 1)."""
    path = tmp_path / "waits.py"
    path.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    process = start("run", str(path))
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "up\n"  # the program runs: its sandbox is started
        sandbox = sandbox_of(process.pid)
        assert sandbox["owner_alive"] is True and sandbox["state"] == "running"
        table = harombe("ls")
        assert sandbox["sandbox_id"] in table.stdout and str(process.pid) in table.stdout
        removed = harombe("rm", sandbox["sandbox_id"])
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout == f"removed {sandbox['sandbox_id']}\n"
        assert sandbox["sandbox_id"] not in {row["sandbox_id"] for row in sandboxes()}
        assert process.wait(timeout=60) == 1  # its sandbox was lost: a harombe error
        again = harombe("rm", sandbox["sandbox_id"])
        assert again.returncode == 1
        assert f"no sandbox {sandbox['sandbox_id']}" in again.stderr
    finally:
        process.kill()
        process.wait()


def test_doctor_passes_here_and_prints_every_check() -> None:
    """On this machine (gVisor) every setup and isolation check passes: exit 0."""
    done = harombe("doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in CHECKS:
        assert any(line.startswith("PASS") and name in line for line in done.stdout.splitlines())
    report = json.loads(harombe("doctor", "--json").stdout)
    assert report["passed"] is True
    assert {c["name"] for c in report["checks"] if c["group"] == "isolation"} == set(CHECKS)


async def test_doctor_fails_on_runc(tmp_path: Path, docker_manager: DockerManager) -> None:
    """With runc (allowed as insecure) the kernel check fails and doctor exits non-zero."""
    runtimes = await docker_manager.runtimes()
    assert "runc" in runtimes, f"this test needs runc registered: {sorted(runtimes)}"
    config = tmp_path / "runc.yaml"
    config.write_text("security:\n  sandbox:\n    runtime: runc\n"
                      "    allow_insecure_runtime: true\n")  # fmt: skip
    done = harombe("doctor", "--config", str(config))
    assert done.returncode == 1
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "kernel is gVisor" in failed[0]


def test_doctor_fails_without_the_image(tmp_path: Path) -> None:
    """A configured image that is not there fails the setup and skips isolation: exit 1."""
    config = tmp_path / "missing.yaml"
    config.write_text("security:\n  sandbox:\n    languages:\n      python:\n"
                      "        image: harombe/no-such-image:0\n")  # fmt: skip
    done = harombe("doctor", "--config", str(config))
    assert done.returncode == 1
    assert "FAIL  setup      image harombe/no-such-image:0 present" in done.stdout
    assert "FAIL  isolation  isolation self-check" in done.stdout


def test_install_shows_progress_then_runs_with_the_package(tmp_path: Path) -> None:
    """--install installs before the run, says so on stderr, and the program imports it."""
    program = tmp_path / "uses_toml.py"
    program.write_text("import toml\nprint(toml.dumps({'a': 1}), end='')\n")
    done = harombe("run", "--install", "toml==0.10.2", str(program))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a = 1\n"
    assert "installing toml==0.10.2 from pypi" in done.stderr
    assert "installed toml==0.10.2 from pypi" in done.stderr


def test_a_failed_install_exits_1_and_runs_nothing(tmp_path: Path) -> None:
    """An --install the index cannot satisfy exits 1 naming the package; the program never ran."""
    program = tmp_path / "never.py"
    program.write_text("print('ran')\n")
    done = harombe("run", "--install", "toml==0.0.0.404", str(program))
    assert done.returncode == 1 and done.stdout == ""
    assert "--install toml==0.0.0.404" in done.stderr and "PackageNotFoundError" in done.stderr

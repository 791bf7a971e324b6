"""Attacks on the command line against real gVisor: signals that used to leak a running
sandbox, a reader that leaves ``harombe run``'s pipe, output past the cap, and a hostile
program in ``harombe shell`` writing the clipboard of the terminal outside (tmux's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from tests.integration.test_cli_shell import CLI, Tmux, containers_of

pytestmark = pytest.mark.integration

ENV = {k: v for k, v in os.environ.items() if not k.startswith("HAROMBE")}
HAROMBE = [sys.executable, "-m", "harombe"]


def containers_owned_by(pid: int) -> list[str]:
    """Ids of harombe containers whose owner label names process ``pid`` here."""
    client = docker.from_env()
    try:
        # sparse: no inspect per container (another process's may be gone by then)
        found = client.containers.list(all=True, sparse=True,
                                       filters={"label": "harombe.managed=1"})  # fmt: skip
        owners = [(str(c.id), (c.attrs.get("Labels") or {}).get("harombe.owner", ""))
                  for c in found]  # fmt: skip
        return [cid for cid, owner in owners if owner.split(":")[1:2] == [str(pid)]]
    finally:
        client.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stopped_run_removes_its_sandbox(tmp_path: Path, signum: signal.Signals) -> None:
    """`timeout 5 harombe run x` (SIGTERM) or a closed window (SIGHUP): exit 128+N, and the
    sandbox, which kept running before, is removed."""
    path = tmp_path / "waits.py"
    path.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    process = subprocess.Popen([*HAROMBE, "run", str(path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV)  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"up\n"
        assert containers_owned_by(process.pid), "the run's sandbox should be up"
        process.send_signal(signum)
        assert process.wait(timeout=60) == 128 + signum
    finally:
        process.kill()
        process.wait()
    assert containers_owned_by(process.pid) == []


def test_a_reader_leaving_stops_the_run(tmp_path: Path) -> None:
    """`harombe run flood.py | head -1` ends with 141 (as SIGPIPE would), not after the
    whole 30 s timeout with a false "timed out", and leaves no container."""
    path = tmp_path / "flood.py"
    path.write_text("import time\nwhile True:\n    print('line', flush=True)\n"
                    "    time.sleep(0.01)\n")  # fmt: skip
    process = subprocess.Popen([*HAROMBE, "run", "--timeout", "120", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == b"line\n"
        process.stdout.close()  # the reader leaves
        assert process.wait(timeout=60) == 141
        assert b"Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()
    assert containers_owned_by(process.pid) == []


def test_output_past_the_cap_is_not_cut_silently(tmp_path: Path) -> None:
    """A program printing 1.2 MB: its exit code stands, and harombe says stdout was cut."""
    path = tmp_path / "big.py"
    path.write_text("import sys\nsys.stdout.write('x' * 1_200_000)\n")
    done = subprocess.run([*HAROMBE, "run", str(path)], capture_output=True, env=ENV,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0
    assert len(done.stdout) < 1_200_000
    assert b"stdout was cut at security.sandbox.limits.max_output_bytes" in done.stderr


def pid_of_harombe(term: Tmux) -> int:
    """The harombe process under the tmux pane's shell."""
    pane = subprocess.run(["tmux", "display", "-p", "-t", term.name, "#{pane_pid}"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    for _ in range(100):
        children = Path(f"/proc/{pane}/task/{pane}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise AssertionError("no harombe process under the pane")


def test_the_shell_cannot_write_the_outer_clipboard_and_sigterm_cleans_up() -> None:
    """OSC 52 printed in the sandbox never reaches tmux's clipboard (paste buffers); then
    SIGTERM restores the terminal (canonical mode and echo), removes the sandbox, exits 143."""
    mode = "stty -a | grep -o -- '-\\?icanon' | sed 's/^/MODE=/'"
    term = Tmux(f"{CLI}; status=$?; {mode}; (exit $status)")
    try:
        subprocess.run(["tmux", "set-option", "-t", term.name, "set-clipboard", "on"],
                       check=True)  # fmt: skip
        sandbox_id = term.wait_for(r"in sandbox (sandbox-[0-9a-f]{12})").group(1)
        term.wait_for(r"sandbox@sandbox:/workspace\$\s*$")
        term.run("printf '\\033]52;c;%s\\a' $(printf harombe-pwned | base64); echo sent",
                 expect=r"^sent")  # fmt: skip
        buffers = subprocess.run(["tmux", "list-buffers", "-F", "#{buffer_sample}"],
                                 capture_output=True, text=True).stdout  # fmt: skip
        assert "harombe-pwned" not in buffers
        os.kill(pid_of_harombe(term), signal.SIGTERM)
        term.wait_for(r"EXITED=143")
        assert term.wait_for(r"MODE=(-?icanon)").group(1) == "icanon"
        assert containers_of(sandbox_id) == []
    finally:
        term.kill()

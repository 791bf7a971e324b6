"""``harombe shell`` through a real terminal (tmux) against real gVisor: the prompt, line
editing, Ctrl-C for the program inside, window resizes, the exit status, the sandbox removed,
and what the shell's processes may do (no capabilities, no_new_privs, the pids limit)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = f"cd {ROOT} && {sys.executable} -m harombe shell"
WAIT_S = 90.0  # a cold sandbox on a loaded 2-core machine


class Tmux:
    """One detached tmux session running a command; keys in, the screen out."""

    def __init__(self, command: str, *, cols: int = 100, rows: int = 30) -> None:
        assert shutil.which("tmux"), "tmux is missing: scripts/setup.sh installs it"
        self.name = f"harombe-shell-{uuid.uuid4().hex[:8]}"
        # The pane outlives the command, so its exit status can be read from the screen.
        script = f"{command}; echo EXITED=$?; sleep 600"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(cols),
                        "-y", str(rows), script], check=True)  # fmt: skip

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        done = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-", "-t", self.name],
                              check=True, capture_output=True, text=True)  # fmt: skip
        return done.stdout

    def wait_for(self, pattern: str, *, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` on the screen beyond character ``after``."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = re.compile(pattern, re.M).search(self.screen(), after)
            if found:
                return found
            assert time.monotonic() < deadline, f"{pattern!r} never appeared:\n{self.screen()}"
            time.sleep(0.2)

    def run(self, *keys: str, expect: str) -> re.Match[str]:
        """Send ``keys`` then Enter; the next match of ``expect`` after what was on screen."""
        before = len(self.screen().rstrip())
        self.keys(*keys)
        self.keys("Enter")
        return self.wait_for(expect, after=before)

    def resize(self, *, cols: int, rows: int) -> None:
        subprocess.run(["tmux", "resize-window", "-t", self.name, "-x", str(cols),
                        "-y", str(rows)], check=True)  # fmt: skip

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False)


def plain(text: str) -> str:
    """``text`` without terminal control sequences (bracketed paste, colours) and CRs."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", text)


def containers_of(sandbox_id: str) -> list[str]:
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"harombe.sandbox={sandbox_id}"})
        return [c.status for c in found]
    finally:
        client.close()


@pytest.fixture(scope="module")
def bash() -> Iterator[tuple[Tmux, str]]:
    """One ``harombe shell`` in tmux for the module, and its sandbox id."""
    term = Tmux(CLI)
    try:
        sandbox_id = term.wait_for(r"in sandbox (sandbox-[0-9a-f]{12})").group(1)
        term.wait_for(r"sandbox@sandbox:/workspace\$\s*$")
        yield term, sandbox_id
    finally:
        term.kill()


PROMPT = r"\n[^\n]*\$\s*$"


@pytest.mark.parametrize(
    ("command", "expect"),
    [
        ("echo $((6*7))", r"^42\r?$"),
        ("id -u; id -g", r"^1000\n1000$"),
        ("test -t 0 && test -t 1 && echo on-a-terminal", r"^on-a-terminal$"),
        ("echo $TERM $HOME $PWD", r"^\S+ /home/sandbox /workspace$"),
        ("ulimit -u", r"^128$"),
        ("cat /proc/1/cmdline | tr '\\0' ' ' | cut -c1-20", r"^python3 -I -S -c"),
    ],
    ids=["arithmetic", "sandbox-user", "terminal", "environment", "pids-limit", "supervisor"],
)
def test_bash_runs_commands_in_the_sandbox(bash: tuple[Tmux, str], command: str,
                                           expect: str) -> None:  # fmt: skip
    """A typed command runs inside the sandbox as its user, on a terminal, under its limits."""
    term, _ = bash
    term.run(command, expect=expect)


def test_the_shell_has_no_capabilities_and_no_new_privileges(bash: tuple[Tmux, str]) -> None:
    """The exec'd shell (uid 1000) holds no capability and cannot gain any (no_new_privs)."""
    term, _ = bash
    caps = term.run("grep -E '^Cap(Inh|Prm|Eff)' /proc/self/status | sort | paste -sd' '",
                    expect=r"^CapEff:.*CapPrm:\s+[0-9a-f]+\s*$").group(0)  # fmt: skip
    assert re.findall(r"Cap\w+:\s+([0-9a-f]+)", caps) == ["0" * 16] * 3, caps
    term.run("python3 -c 'import ctypes; print(\"nnp\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'",
             expect=r"^nnp 1$")  # fmt: skip


def test_line_editing_works(bash: tuple[Tmux, str]) -> None:
    """Readline edits the typed line: Left arrow and Ctrl-A move, typed keys insert."""
    term, _ = bash
    term.keys("cho wrld", "Left", "Left", "Left", "o", "C-a", "e")
    term.run(expect=r"^world$")


def test_ctrl_c_interrupts_the_program_not_the_cli(bash: tuple[Tmux, str]) -> None:
    """Ctrl-C stops `sleep 100` inside; the shell and the CLI go on."""
    term, _ = bash
    before = len(term.screen().rstrip())
    term.keys("sleep 100", "Enter")
    term.wait_for(r"sleep 100\n", after=before)
    time.sleep(1)  # sleep has started (the line discipline signals the foreground group)
    term.keys("C-c")
    term.wait_for(r"\^C" + PROMPT, after=before)
    term.run("echo alive $?", expect=r"^alive 130$")


def test_window_resize_reaches_the_terminal_inside(bash: tuple[Tmux, str]) -> None:
    """Resizing the local window resizes the sandbox's terminal (stty size shows it)."""
    term, _ = bash
    term.resize(cols=123, rows=41)
    term.wait_for(r"\$\s*$")
    deadline = time.monotonic() + WAIT_S
    while "41 123" not in (shown := term.run("stty size", expect=r"^\d+ \d+$").group(0)):
        assert time.monotonic() < deadline, shown  # the SIGWINCH may follow the keys
        time.sleep(0.5)


def test_exit_ends_the_cli_with_its_status_and_removes_the_sandbox(bash: tuple[Tmux, str]) -> None:
    """`exit 5` ends the CLI with 5, and the sandbox it made is gone."""
    term, sandbox_id = bash
    assert containers_of(sandbox_id) == ["running"]
    term.run("exit 5", expect=r"^EXITED=5$")
    assert containers_of(sandbox_id) == []


def test_python_repl_evaluates_and_ctrl_d_leaves() -> None:
    """--language python: the REPL evaluates 6*7; Ctrl-D ends the CLI with 0."""
    term = Tmux(f"{CLI} --language python")
    try:
        sandbox_id = term.wait_for(r"in sandbox (sandbox-[0-9a-f]{12})").group(1)
        term.wait_for(r">>>\s*$")
        term.run("6*7", expect=r"^42$")
        term.run("import os; os.getuid()", expect=r"^1000$")
        term.keys("C-d")
        term.wait_for(r"^EXITED=0$")
        assert containers_of(sandbox_id) == []
    finally:
        term.kill()


def test_piped_input_runs_without_a_terminal() -> None:
    """stdin a pipe: the lines run, the end of input ends the shell, its status is the CLI's."""
    done = subprocess.run([sys.executable, "-m", "harombe", "shell"], cwd=ROOT,
                          input="echo $((6*7))\nexit 4\n", capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert re.search(r"^42\r?$", plain(done.stdout), re.M), done
    assert done.returncode == 4, done


async def test_attaching_to_a_live_sandbox_leaves_it_running(fresh_sandbox: str) -> None:
    """--sandbox ID: the shell runs in that sandbox (it sees its files) and leaves it running."""

    async def shell(*args: str, stdin: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harombe", "shell", *args, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(stdin.encode())
        return proc.returncode or 0, plain(out.decode() + err.decode())

    code, shown = await shell("--sandbox", fresh_sandbox,
                              stdin="echo marked > /workspace/mark; exit 3\n")  # fmt: skip
    assert code == 3, shown
    assert containers_of(fresh_sandbox) == ["running"]
    code, shown = await shell("--sandbox", fresh_sandbox, stdin="cat /workspace/mark\n")
    assert (code, re.search(r"^marked\r?$", shown, re.M) is not None) == (0, True), shown
    code, shown = await shell("--sandbox", "sandbox-000000000000", stdin="")
    assert code == 1 and "no live sandbox" in shown, shown


def lose(sandbox_id: str, how: str) -> None:
    """Take the sandbox away from outside, as a user would: `harombe rm` or `docker kill`."""
    if how == "harombe-rm":
        done = subprocess.run([sys.executable, "-m", "harombe", "rm", sandbox_id], cwd=ROOT,
                              capture_output=True, text=True, timeout=WAIT_S)  # fmt: skip
        assert done.returncode == 0, done
        return
    client = docker.from_env()
    try:
        (found,) = client.containers.list(filters={"label": f"harombe.sandbox={sandbox_id}"})
        found.kill()
    finally:
        client.close()


@pytest.mark.parametrize(
    ("how", "said"),
    [("harombe-rm", "was removed from outside"), ("docker-kill", "was stopped from outside")],
    ids=["harombe-rm", "docker-kill"],
)
def test_a_sandbox_lost_from_outside_ends_the_shell_with_a_line(how: str, said: str) -> None:
    """Removing or killing a live shell's sandbox ends the shell at once, saying why, exit 1;
    the terminal is usable again (not left raw)."""
    term = Tmux(CLI)
    try:
        sandbox_id = term.wait_for(r"in sandbox (sandbox-[0-9a-f]{12})").group(1)
        term.wait_for(r"sandbox@sandbox:/workspace\$\s*$")
        lose(sandbox_id, how)
        line = term.wait_for(rf"harombe shell: sandbox {sandbox_id} {said}[^\n]*\n?[^\n]*"
                             r"the session ended")  # fmt: skip
        term.wait_for(r"^EXITED=1$", after=line.start())
        deadline = time.monotonic() + WAIT_S  # a removal racing `harombe rm` may be deferred
        while (left := containers_of(sandbox_id)) != []:
            assert time.monotonic() < deadline, left
            time.sleep(0.5)
    finally:
        term.kill()

"""Runs with a host directory at /mnt, against real gVisor: what goes in, what comes back,
and what is refused."""

import asyncio
import os
import re
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from harombe.cli import main as cli_main
from harombe.mounts import run_sandboxed, run_sandboxed_async
from harombe.mounts_host import MountLimits
from harombe.security.sandbox_manager import SandboxManager

pytestmark = pytest.mark.integration


def _changes(changed: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(c["path"], c["change"]) for c in changed}


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): "/" if p.is_dir() else p.read_text()
            for p in sorted(root.rglob("*"))}  # fmt: skip


def _kinds(root: Path) -> dict[str, str]:
    """Each entry below ``root``: a plain single-link file, a directory, or what else it is."""
    found = {}
    for path in root.rglob("*"):
        st = path.lstat()
        kind = "dir" if path.is_dir() and not path.is_symlink() else "other"
        if stat.S_ISREG(st.st_mode):
            kind = "file" if st.st_nlink == 1 else "hard link"
        found[path.relative_to(root).as_posix()] = kind
    return found


# The usage examples of the sandbubble README, adapted (sync form, its own manager).


def test_a_snippet_runs_with_no_host_directory() -> None:
    """run_sandboxed(code=...) prints from the sandbox; nothing comes back."""
    res, files = run_sandboxed(code="print('hello from sandbox')", timeout=5)
    assert res["exit_code"] == 0 and res["status"] == "ok"
    assert res["stdout"] == "hello from sandbox\n" and res["stderr"] == ""
    assert files == []


def test_a_file_written_to_mnt_reaches_the_host_directory(tmp_path: Path) -> None:
    """open('/mnt/out.txt','w') in the sandbox: out.txt on the host, listed as created."""
    res, changed = run_sandboxed(code="open('/mnt/out.txt','w').write('result\\n')",
                                 mnt_dir=tmp_path, timeout=5)  # fmt: skip
    assert res["exit_code"] == 0
    assert changed == [{"path": "out.txt", "change": "created", "type": "file", "size_bytes": 7}]
    assert (tmp_path / "out.txt").read_text() == "result\n"


def test_a_script_runs_from_mnt_and_is_not_a_change(tmp_path: Path) -> None:
    """script_path='/mnt/code.py' runs the host's file; the unchanged script is not listed."""
    (tmp_path / "code.py").write_text("print('script ran')\n")
    res, changed = run_sandboxed(script_path="/mnt/code.py", mnt_dir=tmp_path, timeout=5)
    assert res["stdout"] == "script ran\n"
    assert changed == [] and res["refused"] == []


async def test_the_sync_form_works_inside_a_running_event_loop(tmp_path: Path) -> None:
    """Called from async code, run_sandboxed runs on a thread of its own and still applies."""
    res, changed = run_sandboxed(code="open('/mnt/o', 'w').write('o')", mnt_dir=tmp_path)
    assert res["status"] == "ok"
    assert _changes(changed) == {("o", "created")}


CTRL_C_PROGRAM = """
import sys
from harombe import run_sandboxed
try:
    run_sandboxed(code="print('running', flush=True); import time; time.sleep(60)",
                  mnt_dir=sys.argv[1])
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


async def test_ctrl_c_in_the_sync_form_removes_the_sandbox(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """SIGINT while the code runs: KeyboardInterrupt reaches the caller, and no container
    of the run is left (found by its sandbox id, which the log names)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CTRL_C_PROGRAM, str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HAROMBE_LOG_LEVEL": "info"},  # sandbox.created names the sandbox
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    log = b""
    while b"sandbox.created" not in log:
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert line, log.decode()
        log += line
    await asyncio.sleep(1.5)  # into the run
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert "interrupted" in out.decode(), (err.decode(), log.decode())
    (sandbox_id,) = set(re.findall(r"sandbox-[0-9a-f]{12}", log.decode()))
    assert await sandbox_manager.docker.list_containers({"harombe.sandbox": sandbox_id}) == []


# The rest on the shared manager (pooled sandboxes), through the async form.


async def test_network_is_off_by_default(sandbox_manager: SandboxManager) -> None:
    """Resolving a name fails: a run with a host directory has no network unless asked."""
    res, _ = await run_sandboxed_async(
        code="import socket; socket.getaddrinfo('example.com', 80)", manager=sandbox_manager
    )
    assert res["exit_code"] != 0 and "gaierror" in res["stderr"]


async def test_created_modified_deleted_in_subdirectories_and_unicode_names(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """Every kind of change comes back, in subdirectories and under non-ASCII names; the
    code runs in /mnt and imports a module from it."""
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "sub" / "deep" / "data.csv").write_text("a,b\n")
    (tmp_path / "gone.txt").write_text("bye")
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    code = (
        "import os, sys\n"
        "sys.dont_write_bytecode = True\n"
        "import helper\n"
        "print(os.getcwd(), helper.VALUE, sorted(os.listdir('.')))\n"
        "open('sub/deep/data.csv', 'a').write('1,2\\n')\n"
        "os.remove('gone.txt')\n"
        "os.rmdir('empty')\n"
        "os.makedirs('résumé/日本')\n"
        "open('résumé/日本/ü.txt', 'w').write('ü')\n"
    )
    res, changed = await run_sandboxed_async(code=code, mnt_dir=tmp_path, manager=sandbox_manager)
    assert res["status"] == "ok", res["stderr"]
    assert res["stdout"] == "/mnt 42 ['empty', 'gone.txt', 'helper.py', 'sub']\n"
    assert _changes(changed) == {
        ("sub/deep/data.csv", "modified"), ("gone.txt", "deleted"), ("empty", "deleted"),
        ("résumé", "created"), ("résumé/日本", "created"), ("résumé/日本/ü.txt", "created"),
    }  # fmt: skip
    assert _tree(tmp_path) == {
        "helper.py": "VALUE = 42\n", "sub": "/", "sub/deep": "/", "sub/deep/data.csv": "a,b\n1,2\n",
        "résumé": "/", "résumé/日本": "/", "résumé/日本/ü.txt": "ü",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("code", "path", "reason"),
    [
        ("os.symlink('/etc', 'etc'); os.symlink('/etc/passwd', 'keep.txt.new');"
         "os.replace('keep.txt.new', 'keep.txt')", "keep.txt", "symbolic link"),
        ("open('a', 'w').write('a'); os.link('a', 'b')", "b", "hard link"),
        ("os.mkfifo('pipe')", "pipe", "FIFO"),
    ],
    ids=["symlink-to-etc", "hard-link", "fifo"],
)  # fmt: skip
async def test_links_and_special_files_are_refused_and_the_rest_applies(
    sandbox_manager: SandboxManager, tmp_path: Path, code: str, path: str, reason: str
) -> None:
    """What the code planted is refused with a reason; the host keeps its own file, and a
    plain file written in the same run still comes back."""
    (tmp_path / "keep.txt").write_text("host")
    res, changed = await run_sandboxed_async(
        code=f"import os\n{code}\nopen('plain.txt', 'w').write('ok')\n",
        mnt_dir=tmp_path, manager=sandbox_manager,
    )  # fmt: skip
    assert res["status"] == "ok", res["stderr"]
    refused = {r["path"]: r["reason"] for r in res["refused"]}
    assert reason in refused[path]
    assert ("plain.txt", "created") in _changes(changed)
    assert (tmp_path / "keep.txt").read_text() == "host"
    assert _kinds(tmp_path) == {"keep.txt": "file", "plain.txt": "file"}


async def test_a_file_over_the_limit_is_refused(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """A file larger than max_file_bytes does not come back; a small one does."""
    code = "open('/mnt/huge.bin','wb').write(b'x' * (2 << 20)); open('/mnt/small','w').write('s')"
    res, changed = await run_sandboxed_async(
        code=code, mnt_dir=tmp_path, manager=sandbox_manager,
        limits=MountLimits(max_file_bytes=1 << 20),
    )  # fmt: skip
    assert [r["path"] for r in res["refused"]] == ["huge.bin"]
    assert "max_file_bytes" in res["refused"][0]["reason"]
    assert _changes(changed) == {("small", "created")}
    assert _kinds(tmp_path) == {"small": "file"}


async def test_an_empty_directory_mounts_as_an_empty_mnt(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """An empty host directory: /mnt is empty and writable by the code."""
    res, changed = await run_sandboxed_async(
        code="import os; print(os.listdir('/mnt'), os.access('/mnt', os.W_OK))",
        mnt_dir=tmp_path, manager=sandbox_manager,
    )  # fmt: skip
    assert res["stdout"] == "[] True\n"
    assert changed == []


async def test_what_was_written_before_a_timeout_still_comes_back(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """The run times out; the file it wrote first is applied, and the sandbox is gone."""
    code = "open('/mnt/partial.txt','w').write('p'); import time; time.sleep(30)"
    res, changed = await run_sandboxed_async(code=code, mnt_dir=tmp_path, timeout=1,
                                             manager=sandbox_manager)  # fmt: skip
    assert res["status"] == "timeout"
    assert _changes(changed) == {("partial.txt", "created")}
    assert res["sandbox_id"] not in sandbox_manager.sandboxes
    left = await sandbox_manager.docker.list_containers({"harombe.sandbox": res["sandbox_id"]})
    assert left == []


async def test_a_cancelled_run_leaves_no_sandbox(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """Cancelling the call mid-run (Ctrl-C in the sync form) removes its sandbox; the host
    directory is left as it was."""
    (tmp_path / "in.txt").write_text("in")
    before = set(sandbox_manager.sandboxes)
    task = asyncio.ensure_future(run_sandboxed_async(
        code="open('/mnt/in.txt','w').write('x'); import time; time.sleep(60)",
        mnt_dir=tmp_path, manager=sandbox_manager,
    ))  # fmt: skip
    made: set[str] = set()
    for _ in range(400):  # until the sandbox exists (at most 20 s)
        await asyncio.sleep(0.05)
        made = set(sandbox_manager.sandboxes) - before
        if made:
            break
    assert len(made) == 1
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(sandbox_manager.sandboxes) - before == set()
    (sandbox_id,) = made
    assert await sandbox_manager.docker.list_containers({"harombe.sandbox": sandbox_id}) == []
    assert _kinds(tmp_path) == {"in.txt": "file"}
    assert (tmp_path / "in.txt").read_text() == "in"


@pytest.mark.parametrize(
    ("language", "code"),
    [("shell", "echo from-shell > out.txt"),
     ("javascript", "require('fs').writeFileSync('out.txt', 'from-js')")],
    ids=["shell", "javascript"],
)  # fmt: skip
async def test_shell_and_javascript_run_in_mnt(
    sandbox_manager: SandboxManager, tmp_path: Path, language: str, code: str
) -> None:
    """Other languages run with /mnt as their working directory too."""
    res, changed = await run_sandboxed_async(code=code, language=language, mnt_dir=tmp_path,
                                             manager=sandbox_manager)  # fmt: skip
    assert res["status"] == "ok", res["stderr"]
    assert _changes(changed) == {("out.txt", "created")}
    assert (tmp_path / "out.txt").read_text().startswith("from-")


def test_cli_run_with_mnt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``harombe run --mnt DIR script.py`` streams the output, applies the change and says so."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("21")
    script = tmp_path / "script.py"
    script.write_text("n = int(open('in.txt').read())\nopen('out.txt','w').write(str(2 * n))\n"
                      "print('doubled')\n")  # fmt: skip
    assert cli_main(["run", "--mnt", str(work), str(script)]) == 0
    out, err = capsys.readouterr()
    assert out == "doubled\n"
    assert "mnt: created out.txt" in err
    assert (work / "out.txt").read_text() == "42"

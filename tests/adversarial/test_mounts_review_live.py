"""Adversarial review of run-with-a-host-directory against real gVisor: Python code that
subverts the scan of /mnt from inside its session interpreter, a sandbox that dies during the
scan, a host directory changed while the code runs, and trees the host cannot read back.

Every host directory is a fresh temporary directory; every link planted points at a canary
inside another one.
"""

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from harombe.errors import HarombeError
from harombe.mounts import run_sandboxed_async
from harombe.mounts_host import MountLimits
from harombe.security.sandbox_manager import SandboxManager

pytestmark = pytest.mark.integration


def _tree(root: Path) -> dict[str, str]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            else:
                found[rel] = "/" if path.is_dir() else path.read_text("utf-8", "replace")
    return found


async def _containers(manager: SandboxManager, sandbox_id: str) -> list[Any]:
    return await manager.docker.list_containers({"harombe.sandbox": sandbox_id})


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "sub").mkdir(parents=True)
    (root / "keep.txt").write_text("keep")
    (root / "old.txt").write_text("old")
    (root / "sub" / "a.txt").write_text("a")
    return root


@pytest.fixture
def canary(tmp_path: Path) -> Any:
    place = tmp_path / "canary"
    place.mkdir()
    (place / "a.txt").write_text("outside")
    before = _tree(place)
    yield place
    assert _tree(place) == before, "something outside mnt_dir was changed"


#: Puts one forged entry in what the scan writes, in place of the true one for its path
#: (json.dump patched in the session interpreter, which then runs the scan).
FORGE = """
import json as _j
_dump = _j.dump
def _forged(obj, f, **kw):
    if isinstance(obj, dict) and "entries" in obj:
        forged = {entry!r}
        kept = [e for e in obj["entries"] if e["path"] != forged["path"]]
        obj = {{"entries": kept + [forged], "truncated": False}}
    return _dump(obj, f, **kw)
_j.dump = _forged
"""


async def test_a_link_out_of_mnt_forged_as_a_file_never_reaches_the_host(
    sandbox_manager: SandboxManager, host: Path, tmp_path: Path
) -> None:
    """The code links /mnt/evil to the sandbox's /etc/passwd and forges the scan to call it a
    regular file with that file's hash: the host's fetch does not follow the link out, evil is
    refused, and a plain file written in the same run still applies."""
    probe, _ = await run_sandboxed_async(code="print(open('/etc/passwd').read(), end='')",
                                         manager=sandbox_manager)  # fmt: skip
    passwd = probe["stdout"].encode()
    entry = {"path": "evil", "type": "file", "size": len(passwd), "links": 1, "mode": 0o644,
             "sha256": hashlib.sha256(passwd).hexdigest()}  # fmt: skip
    code = FORGE.format(entry=entry) + (
        "import os\nos.symlink('/etc/passwd', 'evil')\nopen('plain.txt', 'w').write('ok')\n"
    )
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager)
    assert res["status"] == "ok", res["stderr"]
    assert [r["path"] for r in res["refused"]] == ["evil"], res["refused"]
    assert "could not be read back" in res["refused"][0]["reason"]
    assert ("plain.txt", "created") in {(c["path"], c["change"]) for c in changed}
    assert not (host / "evil").exists() and not (host / "evil").is_symlink()
    assert set(os.listdir(tmp_path)) == {"host"}


@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/escape.txt", "sub/../../escape.txt"],
                         ids=["dotdot", "absolute", "climb"])  # fmt: skip
async def test_a_scan_forged_to_name_a_path_outside_applies_nothing(
    sandbox_manager: SandboxManager, host: Path, tmp_path: Path, path: str
) -> None:
    """The code forges the scan with a path out of mnt_dir: the whole bring-back stops with
    mount_error (nothing applied, not even the code's real deletion); nothing is outside."""
    entry = {"path": path, "type": "file", "size": 1, "links": 1, "mode": 0o644,
             "sha256": hashlib.sha256(b"x").hexdigest()}  # fmt: skip
    code = FORGE.format(entry=entry) + "import os\nos.remove('old.txt')\n"
    before = _tree(host)
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager)
    assert res["status"] == "ok", res["stderr"]
    assert "nothing was applied" in res["mount_error"] and changed == []
    assert _tree(host) == before
    assert set(os.listdir(tmp_path)) == {"host"}
    assert await _containers(sandbox_manager, res["sandbox_id"]) == []


async def test_a_scan_the_code_makes_hang_ends_in_a_mount_error(
    sandbox_manager: SandboxManager, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code makes os.listdir sleep, so the scan never finishes: after the scan's time limit
    the result says nothing came back, the host is unchanged and the sandbox is gone."""
    monkeypatch.setattr("harombe.mounts.SCAN_TIMEOUT_S", 3.0)
    code = ("import os, time\nos.remove('old.txt')\n"
            "os.listdir = lambda *a, **k: time.sleep(600)\n")  # fmt: skip
    before = _tree(host)
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager)
    assert res["status"] == "ok", res["stderr"]
    assert "scan" in res["mount_error"] and changed == []
    assert _tree(host) == before
    assert await _containers(sandbox_manager, res["sandbox_id"]) == []


async def test_more_files_than_max_entries_apply_nothing(
    sandbox_manager: SandboxManager, host: Path
) -> None:
    """The code makes more entries than max_entries and deletes a host file: the bring-back
    stops as a whole (no deletion without the complete picture), saying which limit."""
    code = "import os\nos.remove('old.txt')\nfor i in range(60):\n    open(f'f{i}', 'w').close()\n"
    before = _tree(host)
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager,
                                             limits=MountLimits(max_entries=50))  # fmt: skip
    assert res["status"] == "ok", res["stderr"]
    assert "max_entries=50" in res["mount_error"] and changed == []
    assert _tree(host) == before


async def test_a_subdirectory_swapped_for_a_link_during_the_run_is_never_written_through(
    sandbox_manager: SandboxManager, host: Path, tmp_path: Path, canary: Path
) -> None:
    """While the code runs, another host process replaces sub/ with a link to a canary
    directory; the code's writes into sub/ are refused, the canary is untouched, and the
    code's top-level file still applies."""
    swapped = []

    def on_output(stream: str, data: bytes) -> None:
        if b"ready" in data and not swapped:
            os.rename(host / "sub", tmp_path / "sub-moved")
            os.symlink(canary, host / "sub")
            swapped.append(True)

    code = ("import time\nprint('ready', flush=True)\ntime.sleep(3)\n"
            "open('sub/a.txt', 'w').write('A')\nopen('sub/new.txt', 'w').write('N')\n"
            "open('top.txt', 'w').write('T')\n")  # fmt: skip
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager,
                                             on_output=on_output)  # fmt: skip
    assert swapped and res["status"] == "ok", res["stderr"]
    assert {r["path"] for r in res["refused"]} == {"sub/a.txt", "sub/new.txt"}
    assert {(c["path"], c["change"]) for c in changed} == {("top.txt", "created")}
    assert os.readlink(host / "sub") == str(canary)


async def test_a_scan_with_forged_modes_still_reports_every_change(
    sandbox_manager: SandboxManager, host: Path
) -> None:
    """The code makes every scanned mode a string, deletes old.txt and writes new.txt: the
    call returns (no exception), and each change it applied is reported (or, the scan being
    out of form, nothing is applied and mount_error says so)."""
    code = ("import os, stat\nos.remove('old.txt')\nopen('new.txt', 'w').write('n')\n"
            "stat.S_IMODE = lambda mode: 'x'\n")  # fmt: skip
    try:
        res, changed = await run_sandboxed_async(code=code, mnt_dir=host,
                                                 manager=sandbox_manager)  # fmt: skip
    finally:
        gone = not (host / "old.txt").exists()
    reported = {c["path"] for c in changed} | {r["path"] for r in res["refused"]}
    assert not gone or "old.txt" in reported
    assert "new.txt" in reported or (res["mount_error"] and not gone and changed == [])


async def test_a_scan_whose_output_the_code_suppresses_is_a_mount_error_in_the_result(
    sandbox_manager: SandboxManager, host: Path
) -> None:
    """The code redirects the scan's output file to /dev/null: the call still returns the
    program's result (its stdout) with mount_error, and the host is unchanged."""
    code = (
        "import os\nos.remove('old.txt')\nprint('did my part')\n_open = os.open\n"
        "def _o(path, flags, mode=0o777, **kw):\n"
        "    if str(path).startswith('/tmp/.harombe-scan-'):\n"
        "        return _open('/dev/null', os.O_WRONLY)\n"
        "    return _open(path, flags, mode, **kw)\n"
        "os.open = _o\n"
    )
    before = _tree(host)
    res, changed = await run_sandboxed_async(code=code, mnt_dir=host, manager=sandbox_manager)
    assert res["stdout"] == "did my part\n" and res["mount_error"] and changed == []
    assert _tree(host) == before


async def test_a_sandbox_lost_during_the_scan_leaves_no_container(
    sandbox_manager: SandboxManager, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox's container is removed just as the scan starts (a crash, the memory
    backstop): the result says nothing came back and no sandbox of the call is left."""
    before = set(sandbox_manager.sandboxes)
    real = sandbox_manager.execute

    async def dying(sandbox_id: str, code: str, **kw: Any) -> Any:
        if "_harombe_scan_mnt" in code:
            box = sandbox_manager.get(sandbox_id)
            await sandbox_manager.docker.remove_container(box.container_id)
        return await real(sandbox_id, code, **kw)

    monkeypatch.setattr(sandbox_manager, "execute", dying)
    try:
        res, changed = await run_sandboxed_async(code="open('n.txt', 'w').write('n')",
                                                 mnt_dir=host, manager=sandbox_manager)  # fmt: skip
        left = set(sandbox_manager.sandboxes) - before
    finally:
        monkeypatch.undo()
        for sid in set(sandbox_manager.sandboxes) - before:
            with contextlib.suppress(HarombeError):
                await sandbox_manager.destroy_sandbox(sid)
    assert "scan" in res["mount_error"] and changed == []
    assert left == set(), f"sandboxes left behind: {left}"


def _remove_chain(root: Path, name: str) -> None:
    """Remove ``root/name/name/...`` however deep (shutil.rmtree recurses and cannot)."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                               dir_fd=fds[-1]))  # fmt: skip
        except FileNotFoundError:
            break
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir(name, dir_fd=fds[-1])
    os.close(fds[0])


async def test_what_one_run_brings_back_the_next_run_can_take_in(
    sandbox_manager: SandboxManager, tmp_path: Path
) -> None:
    """The code makes /mnt/d/d/... 1,100 levels deep: whatever comes back, a second run with
    the same directory runs, or stops with a MountError that says why (never a crash)."""
    root = tmp_path / "host"
    root.mkdir()
    code = (
        "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\nos.chdir('/mnt')\n"
    )
    try:
        first, _ = await run_sandboxed_async(code=code, mnt_dir=root, manager=sandbox_manager)
        assert first["status"] == "ok", first["stderr"]
        try:
            again, _ = await run_sandboxed_async(code="pass", mnt_dir=root,
                                                 manager=sandbox_manager)  # fmt: skip
            assert again["status"] == "ok"
        except HarombeError as exc:
            assert "deep" in str(exc) or "depth" in str(exc), exc
    finally:
        _remove_chain(root, "d")

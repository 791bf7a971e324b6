"""The seeds' READMEs, as they write their calls, against real gVisor: sandbubble's
``run_sandboxed(conf, ...)`` examples and pctx-sandbox's ``@sandbox`` examples. Only the
import line changes (``from sandbox import`` / ``from pctx_sandbox import`` → ``from harombe
import``) and a placeholder path is replaced by a real one."""

from __future__ import annotations

import json
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from harombe import decorator

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _no_sandbubble_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default config as on a machine without sandbubble's variables."""
    monkeypatch.delenv("CODEEXEC_SANDBOX_VENV", raising=False)
    monkeypatch.delenv("CODEEXEC_SANDBOX_AA_PROFILE_NAME", raising=False)


# sandbubble's README, "Usage examples"


def test_sandbubble_run_a_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    """Run a snippet: rc 0, the greeting on stdout, nothing on stderr; the result is also
    today's dict."""
    from harombe import get_default_sandbox_config, run_sandboxed

    conf = get_default_sandbox_config()

    res, _files = run_sandboxed(conf, code="print('hello from sandbox')", timeout=5)

    print(res.returncode)
    print(res.stdout)
    print(res.stderr)

    assert capsys.readouterr().out == "0\nhello from sandbox\n\n\n"
    assert res["exit_code"] == 0 and res["stdout"] == "hello from sandbox\n" and _files == []
    assert json.loads(json.dumps(res)) == dict(res)


def test_sandbubble_writable_host_dir_at_mnt(capsys: pytest.CaptureFixture[str]) -> None:
    r"""Writable host dir at /mnt: out.txt written in the sandbox reaches the host. (The
    README's ``'result\n'`` inside a double-quoted string puts a real line break into the
    code, a SyntaxError in any Python: it is written ``'result\\n'`` here.)"""
    from harombe import get_default_sandbox_config, run_sandboxed

    conf = get_default_sandbox_config()

    with tempfile.TemporaryDirectory(prefix="agent_io_") as host_dir:
        res, changed = run_sandboxed(
            conf,
            code="open('/mnt/out.txt','w').write('result\\n')",
            mnt_dir=host_dir,
            timeout=5,
        )

        print("rc:", res.returncode)
        print("changed files:", changed)
        print("host out:", (Path(host_dir) / "out.txt").read_text())

    out = capsys.readouterr().out
    assert out.startswith("rc: 0\nchanged files: [{'path': 'out.txt', 'change': 'created'")
    assert out.endswith("host out: result\n\n")


def test_sandbubble_run_a_script_from_mnt(capsys: pytest.CaptureFixture[str]) -> None:
    """Run a script from /mnt: it prints, and the unchanged script is not a change."""
    from harombe import get_default_sandbox_config, run_sandboxed

    conf = get_default_sandbox_config()

    with tempfile.TemporaryDirectory(prefix="agent_io_") as host_dir:
        p = Path(host_dir) / "code.py"
        p.write_text("print('script ran')\n")

        res, changed = run_sandboxed(conf, script_path="/mnt/code.py", mnt_dir=host_dir, timeout=5)

        print(res.stdout)  # "script ran\n"
        print("changed files:", changed)  # the script file itself is excluded by design

    assert capsys.readouterr().out == "script ran\n\nchanged files: []\n"


@pytest.fixture
def a_venv(tmp_path: Path) -> Iterator[str]:
    """A real virtualenv (no packages but its own), in place of the README's /path/to/venv."""
    path = tmp_path / "venv"
    venv.create(path, with_pip=False)
    yield str(path)


def test_sandbubble_disable_network(a_venv: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Disable network: resolving a name fails, so rc is non-zero; the AppArmor profile,
    which gVisor has no use for, is named in the warnings."""
    from harombe import SandboxConfig, run_sandboxed

    conf = SandboxConfig(
        venv_path=a_venv,
        apparmor_profile_name="my_sandbox_profile",
        enable_network=False,
    )

    res, _ = run_sandboxed(conf, code="import socket; socket.getaddrinfo('example.com', 80)")
    print("rc:", res.returncode)  # non-zero: networking is off

    assert capsys.readouterr().out != "rc: 0\n" and res.returncode != 0
    assert "gaierror" in res.stderr
    assert any("'my_sandbox_profile' is not used" in w for w in res.warnings)


def test_a_venvs_packages_are_importable(tmp_path: Path) -> None:
    """venv_path's packages (here toml 0.10.2, as the venv's metadata lists it) are installed
    in the sandbox at the venv's version."""
    from harombe import SandboxConfig, run_sandboxed

    root = tmp_path / "venv"
    venv.create(root, with_pip=False)
    (site,) = root.glob("lib/python*/site-packages")
    info = site / "toml-0.10.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toml\nVersion: 0.10.2\n")

    res, _ = run_sandboxed(SandboxConfig(venv_path=str(root)),
                           code="import toml; print(toml.__version__)", timeout=30)  # fmt: skip
    assert (res.returncode, res.stdout) == (0, "0.10.2\n"), res.stderr


def test_network_without_hosts_is_refused_before_any_sandbox() -> None:
    """SandboxConfig(enable_network=True) alone: a UsageError naming allowed_domains."""
    from harombe import SandboxConfig, UsageError, run_sandboxed

    with pytest.raises(UsageError, match="allowed_domains"):
        run_sandboxed(SandboxConfig(enable_network=True), code="print(1)")


# pctx-sandbox's README


@pytest.fixture(scope="module", autouse=True)
def _fresh_runner() -> Iterator[None]:
    """One private loop for the decorated calls, shut down (sandboxes removed) at the end."""
    decorator.configure()
    yield
    decorator.shutdown()


def test_pctx_quick_start() -> None:
    """Quick Start: a pandas function called normally, run in a sandbox."""
    from harombe import sandbox

    @sandbox(dependencies=["pandas"])
    def process_data(data: list[dict]) -> dict:
        import pandas as pd

        df = pd.DataFrame(data)
        return {"rows": len(df), "columns": list(df.columns)}

    # Just call it normally - runs in isolated Podman container
    result = process_data([{"name": "Alice", "age": 30}])

    assert result == {"rows": 1, "columns": ["name", "age"]}


def test_pctx_no_dependencies() -> None:
    """No dependencies: omit the parameter."""
    from harombe import sandbox

    @sandbox()
    def safe_computation(x: int) -> int:
        return x**2

    assert safe_computation(12) == 144


def test_pctx_errors_are_caught_by_their_harombe_names() -> None:
    """A remote exception is a SandboxExecutionError imported from harombe, with
    ``error_type`` and ``traceback_str``; a timeout a SandboxTimeoutError."""
    from harombe import SandboxExecutionError, SandboxTimeoutError, sandbox

    @sandbox()
    def fails() -> None:
        raise ValueError("bad input")

    @sandbox(timeout_sec=1)
    def sleeps() -> None:
        import time

        time.sleep(30)

    with pytest.raises(SandboxExecutionError) as raised:
        fails()
    assert raised.value.error_type == "ValueError" and "bad input" in raised.value.traceback_str
    with pytest.raises(SandboxTimeoutError):
        sleeps()


def test_memory_mb_limits_the_run() -> None:
    """SandboxConfig(memory_mb=64): 200 MB the code asks for is refused in the sandbox (the
    default limit, 512 MB, would give it)."""
    from harombe import SandboxConfig, run_sandboxed

    code = "b = bytearray(200 << 20); print('got it')"
    res, _ = run_sandboxed(SandboxConfig(memory_mb=64), code=code, timeout=30)
    assert res.returncode != 0 and "got it" not in res.stdout, res
    assert res.status in ("oom", "error") and "MemoryError" in (res.stderr + str(res.error))

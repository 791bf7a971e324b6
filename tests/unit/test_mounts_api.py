"""run_sandboxed's arguments, the scan check, the /mnt tmpfs and the CLI's ``--mnt`` lines."""

from pathlib import Path
from typing import Any

import pytest

import harombe
from harombe.cli.run_mnt import check_mnt, mnt_report
from harombe.config import SandboxConfig
from harombe.errors import MountError, UsageError
from harombe.mounts import run_sandboxed
from harombe.mounts_host import MountLimits
from harombe.mounts_scan import checked_scan
from harombe.security.runtime.sandbox import MNT, MNT_MB, container_spec


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({}, "exactly one of code= .* and script_path="),
        ({"code": "1", "script_path": "/mnt/x.py"}, "exactly one"),
        ({"code": b"print(1)"}, "code must be a string"),
        ({"code": "1", "language": "cobol"}, "unknown language 'cobol'"),
        ({"script_path": "/etc/x.py", "mnt_dir": "."}, "must be a file under /mnt"),
        ({"script_path": "/mnt/x.py"}, "pass mnt_dir="),
    ],
    ids=["neither", "both", "bytes", "language", "outside-mnt", "no-mnt-dir"],
)
def test_bad_arguments_are_usage_errors(kwargs: dict[str, Any], said: str) -> None:
    """Each misuse is refused before any sandbox is made, saying how to call it."""
    with pytest.raises(UsageError, match=said):
        run_sandboxed(**kwargs)


def test_a_script_that_is_not_in_the_directory_is_refused(tmp_path: Path) -> None:
    """script_path must name a file that mnt_dir holds."""
    with pytest.raises(UsageError, match="is not a file in mnt_dir"):
        run_sandboxed(script_path="/mnt/code.py", mnt_dir=tmp_path)


def test_a_symlink_in_mnt_dir_stops_the_call_before_any_sandbox(tmp_path: Path) -> None:
    """The input directory is read first: a link in it is a MountError."""
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(MountError, match="symbolic link"):
        run_sandboxed(code="pass", mnt_dir=tmp_path)


def test_the_package_exposes_run_sandboxed_lazily() -> None:
    """``harombe.run_sandboxed`` is the function; unknown names are AttributeErrors."""
    assert harombe.run_sandboxed is run_sandboxed
    assert harombe.MountLimits is MountLimits
    with pytest.raises(AttributeError):
        _ = harombe.no_such_name


def _scan(*entries: dict[str, Any], truncated: bool = False) -> dict[str, Any]:
    return {"entries": list(entries), "truncated": truncated}


GOOD = {"path": "a/b.txt", "type": "file", "size": 1, "links": 1, "mode": 0o644,
        "sha256": "0" * 64}  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {"entries": "x"},
        _scan(GOOD, truncated=True),
        _scan({**GOOD, "path": "../etc/passwd"}),
        _scan({**GOOD, "path": "/etc/passwd"}),
        _scan({**GOOD, "path": "a//b"}),
        _scan({**GOOD, "path": "a/./b"}),
        _scan({**GOOD, "path": ""}),
        _scan({**GOOD, "type": "door"}),
        _scan({**GOOD, "size": -1}),
        _scan({**GOOD, "size": True}),
        _scan({**GOOD, "sha256": None}),
        _scan({k: v for k, v in GOOD.items() if k != "mode"}),
        _scan({**GOOD, "mode": "x"}),
        _scan({**GOOD, "mode": True}),
        _scan({**GOOD, "mode": -1}),
        _scan({**GOOD, "mode": 0o10000}),
    ],
    ids=[
        "none",
        "not-a-list",
        "truncated",
        "dotdot",
        "absolute",
        "empty-part",
        "dot-part",
        "empty",
        "unknown-type",
        "negative-size",
        "bool-size",
        "no-digest",
        "no-mode",
        "str-mode",
        "bool-mode",
        "negative-mode",
        "mode-past-07777",
    ],
)
def test_a_scan_outside_the_format_applies_nothing(raw: Any) -> None:
    """The scan comes from inside the sandbox: any field out of form is a MountError."""
    with pytest.raises(MountError, match="nothing was applied"):
        checked_scan(raw, MountLimits())


def test_a_well_formed_scan_passes_and_its_size_is_capped() -> None:
    """A good scan is returned; more entries than max_entries is refused."""
    assert checked_scan(_scan({**GOOD, "extra": "dropped"}), MountLimits()) == [GOOD]
    with pytest.raises(MountError, match="max_entries=1"):
        checked_scan(_scan(GOOD, {**GOOD, "path": "c"}), MountLimits(max_entries=1))


def test_every_sandbox_has_an_owned_mnt_tmpfs_counted_in_the_backstop() -> None:
    """/mnt is a sized tmpfs owned by the sandbox user, and the memory backstop covers it."""
    config = SandboxConfig()
    spec = container_spec("sandbox-0123456789ab", image="img", config=config, owner="o",
                          manager_id="m", language="python")  # fmt: skip
    assert spec["tmpfs"][MNT] == f"size={MNT_MB}m,mode=0755,uid=1000,gid=1000"
    limits = config.limits
    assert int(spec["mem_limit"].rstrip("m")) >= (
        limits.max_memory_mb + 2 * limits.max_disk_mb + 256 + MNT_MB
    )


def test_mnt_report_lists_changes_refusals_and_errors() -> None:
    """After a --mnt run the CLI says what changed, what was refused and why."""
    result = {
        "mnt_changed": [{"path": "out.txt", "change": "created", "type": "file"},
                        {"path": "d", "change": "deleted", "type": "directory"}],
        "refused": [{"path": "evil", "reason": "a symbolic link"}],
        "mount_error": None,
    }  # fmt: skip
    assert mnt_report(result) == ["mnt: created out.txt", "mnt: deleted d/",
                                  "mnt: refused evil: a symbolic link"]  # fmt: skip
    assert mnt_report({"mount_error": "lost"}) == ["mnt: lost"]


@pytest.mark.parametrize(
    "kwargs",
    [{"packages": ["six"], "profile": None},
     {"packages": [], "profile": "minimal"}],
    ids=["install", "profile"],
)  # fmt: skip
def test_mnt_refuses_what_it_does_not_combine_with(kwargs: dict[str, Any]) -> None:
    """--mnt with --install or --profile is a usage error."""
    with pytest.raises(UsageError, match="--mnt"):
        check_mnt(**kwargs)


def test_cli_mnt_with_install_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``harombe run --mnt DIR --install six x.py`` is bad usage (exit 2), nothing runs."""
    from harombe.cli import main as cli_main

    program = tmp_path / "x.py"
    program.write_text("print(1)")
    assert cli_main(["run", "--mnt", str(tmp_path), "--install", "six", str(program)]) == 2
    assert "--mnt cannot be combined" in capsys.readouterr().err

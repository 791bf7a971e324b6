"""Finding a container's CPU cgroup files from /proc/<pid>/cgroup text (no Docker)."""

from pathlib import Path

import pytest

from harombe.security.runtime.cgroups import cpu_cgroup, quota_files

V1 = """12:pids:/docker/abc
4:cpu,cpuacct:/docker/abc
1:name=systemd:/docker/abc
0::/
"""
V1_SPLIT = "2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n0::/\n"
V2 = "0::/system.slice/docker-abc.scope\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [(V1, (1, "/docker/abc")), (V1_SPLIT, (1, "/docker/abc")),
     (V2, (2, "/system.slice/docker-abc.scope"))],
    ids=["v1-joint", "v1-split", "v2"],
)  # fmt: skip
def test_cpu_controller_is_found(text: str, expected: tuple[int, str]) -> None:
    """The cpu controller's hierarchy version and path are read from either layout."""
    assert cpu_cgroup(text) == expected


def test_no_cpu_controller_is_an_error() -> None:
    """A listing without a cpu controller is refused rather than guessed."""
    with pytest.raises(ValueError, match="no cpu controller"):
        cpu_cgroup("3:memory:/docker/abc\n")


def test_files_to_write(tmp_path: Path) -> None:
    """v1 writes the period before the quota under the cpu mount; v2 writes cpu.max."""
    (tmp_path / "cpu,cpuacct").mkdir()
    v1 = quota_files(1, "/docker/abc", root=tmp_path)
    assert [(f.relative_to(tmp_path).as_posix(), t) for f, t in v1] == [
        ("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "{period}"),
        ("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "{quota}"),
    ]
    v2 = quota_files(2, "/system.slice/x.scope", root=tmp_path)
    assert [(f.relative_to(tmp_path).as_posix(), t) for f, t in v2] == [
        ("system.slice/x.scope/cpu.max", "{quota} {period}")
    ]
    with pytest.raises(FileNotFoundError, match="no cgroup v1 cpu hierarchy"):
        quota_files(1, "/docker/abc", root=tmp_path / "empty")

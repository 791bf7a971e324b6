"""Install progress events (install_progress.py), pip's download lines, and the NumPy 1.x
reading of wheels that lets a set be resolved once — no Docker; the resolution test runs the
host's guarded pip against a loopback index."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harombe.security.runtime import packages
from harombe.security.runtime.install_progress import InstallProgress, Reporter, human_bytes
from harombe.security.runtime.packages import pypi
from harombe.security.runtime.packages.wheels import built_against_numpy_1
from harombe.testing.wheel_index import WheelIndex, make_wheel

TARGET = pypi.Target(python="3.11.2", machine="x86_64", glibc="2.36")


def test_an_event_is_its_message_and_carries_its_fields() -> None:
    """An InstallProgress reads as its message (print, ==) and as_dict gives the four keys."""
    event = InstallProgress("downloading x.whl (1.0 MB)", stage="downloading", package="x.whl",
                            bytes=1_000_000)  # fmt: skip
    assert event == "downloading x.whl (1.0 MB)" and f"{event}" == event.message
    assert event.as_dict() == {
        "stage": "downloading",
        "package": "x.whl",
        "bytes": 1_000_000,
        "message": "downloading x.whl (1.0 MB)",
    }


async def test_the_reporter_calls_sync_and_async_callbacks_in_order() -> None:
    """A sync callback and an async one both get every event, in order."""
    got: list[str] = []

    async def later(event: InstallProgress) -> None:
        await asyncio.sleep(0)
        got.append(f"async {event}")

    for callback in (lambda event: got.append(f"sync {event}"), later):
        say = Reporter(callback)
        await say("resolving", "one")
        await say("done", "two")
    assert got == ["sync one", "sync two", "async one", "async two"]


async def test_a_failing_callback_is_dropped_not_raised() -> None:
    """A callback that raises is not called again, and the install goes on."""
    calls: list[str] = []

    def broken(event: InstallProgress) -> None:
        calls.append(str(event))
        raise RuntimeError("display gone")

    say = Reporter(broken)
    await say("resolving", "one")
    await say("done", "two")
    assert calls == ["one"]


async def test_control_characters_never_reach_a_callback() -> None:
    """Names come from package indexes: escape sequences and C1 controls become '?'."""
    got: list[InstallProgress] = []
    await Reporter(got.append)("downloading", "downloading \x1b]52;c;eA==\x07\x9b2J.whl",
                               package="a\x1bb")  # fmt: skip
    assert got[0] == "downloading ?]52;c;eA==??2J.whl" and got[0].package == "a?b"


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("  Downloading http://127.0.0.1:8000/files/a-1.0-py3-none-any.whl (12.3 MB)",
         ("a-1.0-py3-none-any.whl", 12_300_000, "12.3 MB")),
        ("  Downloading pandas-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl (12 kB)",
         ("pandas-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl", 12_000, "12 kB")),
        ("  Downloading https://h.example/b-2-py3-none-any.whl#sha256=ab",
         ("b-2-py3-none-any.whl", None, "")),
        ("Collecting a==1.0", None),
        ("Saved ./wheels/a-1.0-py3-none-any.whl", None),
    ],
    ids=["url-MB", "name-kB", "no-size", "collecting", "saved"],
)  # fmt: skip
def test_pip_download_lines_are_read(line: str, parsed: tuple[Any, ...] | None) -> None:
    """pip's 'Downloading' line gives the file name and its size; other lines give nothing."""
    assert pypi.pip_download_line(line) == parsed


@pytest.mark.parametrize(
    ("count", "text"),
    [(999, "999 B"), (1000, "1.0 kB"), (1_640_000, "1.6 MB"), (12 * 10**9, "12.0 GB")],
    ids=["bytes", "kB", "MB", "GB"],
)
def test_human_bytes(count: int, text: str) -> None:
    """Sizes in progress messages are decimal units, one decimal."""
    assert human_bytes(count) == text


def _extension_wheel(name: str, so_bytes: bytes, requires: list[str]) -> Any:
    return make_wheel(name, "1.0", requires=requires,
                      files={f"{name}/_ext.cpython-311-x86_64-linux-gnu.so": so_bytes})  # fmt: skip


@pytest.mark.parametrize(
    ("so_bytes", "old"),
    [
        (b"\x7fELF...numpy.core._multiarray_umath\x00...", True),
        (b"\x7fELF numpy._core._multiarray_umath\x00numpy.core._multiarray_umath\x00", False),
        (b"\x7fELF no numpy here", False),
        (b"x" * (1 << 20) + b"numpy.core._multiarray_umath", True),
    ],
    ids=["numpy-1-headers", "numpy-2-headers", "no-c-api", "past-the-first-chunk"],
)
def test_extensions_built_against_numpy_1_are_recognised(
    tmp_path: Path, so_bytes: bytes, old: bool
) -> None:
    """A .so naming only numpy.core's C API module was built with NumPy 1.x headers; one
    naming numpy._core (NumPy 2 headers, with the 1.x fallback) was not."""
    wheel = _extension_wheel("ext", so_bytes, ["numpy"])
    path = tmp_path / wheel.filename
    path.write_bytes(wheel.data)
    assert built_against_numpy_1(path) is old


def test_a_wheel_that_is_not_a_zip_is_not_called_old(tmp_path: Path) -> None:
    """Unreadable wheels say no here; unpacking refuses them later with the reason."""
    path = tmp_path / "x-1.0-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    assert built_against_numpy_1(path) is False


async def test_a_set_needing_numpy_1_is_resolved_once_with_numpy_below_2() -> None:
    """oldext (built against NumPy 1.x) needing numpy, with numpy 2.0 and 1.26 on the index:
    one resolution picks numpy 1.26 and never downloads numpy 2; newext (NumPy 2 headers)
    gets numpy 2.0. Progress says why numpy was limited."""
    with WheelIndex() as index, index.as_pip_config():
        index.publish(
            _extension_wheel("oldext", b"ELF numpy.core._multiarray_umath", ["numpy>=1.20"]),
            _extension_wheel("newext", b"ELF numpy._core._multiarray_umath", ["numpy>=1.20"]),
            make_wheel("numpy", "2.0.0"), make_wheel("numpy", "1.26.4"),
        )  # fmt: skip
        for root, numpy_version in (("oldext", "1.26.4"), ("newext", "2.0.0")):
            index.requested.clear()
            steps: list[InstallProgress] = []
            async with packages.fetching(root, "harombe-test-") as area:
                wheels = await pypi.resolve(
                    area, root, TARGET, packages.manylinux_platforms("x86_64", "2.36"),
                    report=Reporter(steps.append),
                )  # fmt: skip
            assert {w.name: str(w.version) for w in wheels}["numpy"] == numpy_version
            numpy_files = [p for p in index.requested if p.startswith("/files/numpy")]
            assert numpy_files == [f"/files/numpy-{numpy_version}-py3-none-any.whl"]
            limited = [s for s in steps if s.startswith("limiting numpy to <2")]
            assert bool(limited) is (root == "oldext"), steps


def test_unpack_warnings_never_reach_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel that ships a __pycache__ (numpy 1.26 does) makes installer warn: the warning
    goes to the debug log, not to the caller's stderr, and the rest is unpacked."""
    from harombe.security.runtime import environment_unpack, environments
    from harombe.security.runtime.packages.wheels import Wheel

    logged: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def debug(self, event: str, **fields: Any) -> None:
            logged.append((event, fields))

    monkeypatch.setattr(environment_unpack, "log", Recorder())

    files = {"cachey/__init__.py": b"X = 1\n", "cachey/__pycache__/x.cpython-311.pyc": b"junk"}
    built = make_wheel("cachey", "1.0", files=files)
    path = tmp_path / built.filename
    path.write_bytes(built.data)
    store = environments.EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=60)
    store.open()
    wheel = Wheel("cachey", Version("1.0"), path, ())
    hashed = [(wheel, environments.sha256_of(path))]
    key = environments.environment_key([(path.name, hashed[0][1])], TARGET)
    capfd.readouterr()
    env = store._build(key, hashed, ("cachey",), TARGET)
    assert (store.envs / env.key / "site" / "cachey" / "__init__.py").is_file()
    assert "Warning" not in capfd.readouterr().err
    assert [e for e, f in logged if "__pycache__" in f["warning"]] == [
        "environment.unpack_warned"
    ], logged


async def test_dispatch_relays_install_progress_as_output_lines() -> None:
    """A model's code_install_package through dispatch (MCP's path) hands each step to the
    caller's on_output as a stderr line, which MCP sends as a progress notification."""
    from harombe.tools.schemas import dispatch

    class Tools:
        async def code_install_package(self, **kwargs: Any) -> dict[str, Any]:
            kwargs["on_progress"]({"stage": "downloading", "package": "x.whl", "bytes": 5,
                                   "message": "downloading x.whl (5 B)"})  # fmt: skip
            return {"success": True}

    seen: list[tuple[str, bytes]] = []
    result = await dispatch(
        Tools(),  # type: ignore[arg-type]
        "code_install_package",
        {"sandbox_id": "sandbox-0123456789ab", "package": "x"},
        on_output=lambda stream, data: seen.append((stream, data)),
    )
    assert result == {"success": True}
    assert seen == [("stderr", b"downloading x.whl (5 B)\n")]

"""Adversarial review of the install cache's size cap and holds, of install progress
callbacks and of reading wheels while resolving (no Docker): evictions by another process
between a lookup and a link, builders publishing at once, reused pids, callbacks that never
return, a corrupt extension member."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from harombe.errors import PackageFetchError
from harombe.security.runtime import environments, install_progress
from harombe.security.runtime.environments import EnvironmentStore, environment_key
from harombe.security.runtime.install_progress import InstallProgress, Reporter
from harombe.security.runtime.packages.wheels import (
    Wheel,
    built_against_numpy_1,
    read_requires_dist,
)
from tests.adversarial.test_environments_review import LocalStore, corrupt_deflate, patch_headers
from tests.unit.test_environments import TARGET, make_wheel


def _stores(tmp_path: Path) -> tuple[LocalStore, EnvironmentStore]:
    """A user's store and another process's (max_mb 0: whatever nothing holds goes)."""
    wheels = [make_wheel(tmp_path, files={"tinypkg/d": b"z" * 4096})]
    user = LocalStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600, wheels=wheels)
    user.open()
    other = EnvironmentStore(tmp_path / "cache", max_mb=0, resolve_ttl_s=3600)
    return user, other


async def test_a_request_answered_from_memory_is_never_an_evicted_environment(
    tmp_path: Path,
) -> None:
    """A set looked up a moment ago, whose last sandbox is gone and which another process has
    evicted since, is built again: ensure never returns an environment that is not there."""
    user, other = _stores(tmp_path)
    await user.ensure(["tinypkg"], target=TARGET)  # built
    first = await user.ensure(["tinypkg"], target=TARGET)  # looked up, remembered
    user.holds.write([first.key])  # a sandbox linked it ...
    user.holds.write()  # ... and was destroyed: nothing holds it now
    assert other.evict() == [first.key]
    again = await user.ensure(["tinypkg"], target=TARGET)
    assert (user.envs / again.key / "manifest.json").is_file()


async def test_a_link_hold_confirms_the_environment_is_still_there(tmp_path: Path) -> None:
    """Holding an environment for a link says whether it is still published; once held, an
    eviction in another process leaves it in place."""
    user, other = _stores(tmp_path)
    env = await user.ensure(["tinypkg"], target=TARGET)
    user.holds.unhold(env.key)
    assert user.holds.hold_linked(env.key, user.envs) is True
    assert other.evict() == []
    assert (user.envs / env.key / "manifest.json").is_file()
    user.holds.write()  # its sandbox is gone
    assert other.evict() == [env.key]
    assert user.holds.hold_linked(env.key, user.envs) is False


async def test_an_async_progress_callback_that_never_returns_does_not_hang_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coroutine callback that never finishes is given up on (and not called again); the
    install's own steps go on."""
    monkeypatch.setattr(install_progress, "CALLBACK_WAIT_S", 0.2)
    calls: list[str] = []

    async def stuck(event: InstallProgress) -> None:
        calls.append(str(event))
        await asyncio.Event().wait()

    say = Reporter(stuck)
    started = time.monotonic()
    await asyncio.wait_for(say("resolving", "resolving x"), timeout=30)
    await asyncio.wait_for(say("done", "installed x"), timeout=30)
    assert calls == ["resolving x"]
    assert time.monotonic() - started < 30


async def test_a_hold_left_by_a_dead_process_whose_pid_was_reused_does_not_pin(
    tmp_path: Path,
) -> None:
    """A hold file of a process that died without removing it, whose pid now belongs to
    another process (a restarted container's pid 1), does not keep its environment from
    eviction; this process's own holds still do."""
    user, other = _stores(tmp_path)
    env = await user.ensure(["tinypkg"], target=TARGET)
    user.holds.unhold(env.key)
    later = time.time() + 3600
    stale = user.directory / "holds" / f"{env.key}.{os.getpid()}.1-42"  # started at tick 1
    stale.touch()
    os.utime(stale, (later, later))
    user.hold(env.key)
    assert other.evict() == []  # held by this live process
    user.release(env.key)
    assert other.evict() == [env.key]
    assert not stale.exists()


def test_two_builders_publishing_at_once_keep_the_cap(tmp_path: Path) -> None:
    """Two processes that each make room for a set and publish it at the same moment do not
    leave the cache over its cap together: the second to make room sees the first's set."""
    first = EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600)
    first.open()
    second = EnvironmentStore(tmp_path / "cache", max_mb=64, resolve_ttl_s=3600)
    for store in (first, second):
        store.max_bytes = 1 << 20
    wheels = [make_wheel(tmp_path, f"cap{i}", files={f"cap{i}/d": bytes([i]) * (600 << 10)})
              for i in range(2)]  # fmt: skip
    made_room = first._make_room
    outcome: list[object] = []

    def build_second() -> None:
        try:
            outcome.append(_build(second, [wheels[1]]))
        except PackageFetchError as exc:
            outcome.append(exc)

    def room_then_other_process(key: str, size: int, requirements: Sequence[str]) -> None:
        made_room(key, size, requirements)
        other = threading.Thread(target=build_second)
        other.start()  # the other process makes room and publishes now, if it can
        other.join(timeout=3)
        threads.append(other)

    threads: list[threading.Thread] = []
    first._make_room = room_then_other_process  # type: ignore[method-assign]
    with contextlib.suppress(PackageFetchError):  # either may be the one refused
        _build(first, [wheels[0]])
    for thread in threads:
        thread.join(timeout=60)
    assert outcome
    assert environments.tree_bytes(first.envs) <= first.max_bytes


def _build(store: EnvironmentStore, wheels: list[Wheel]) -> object:
    hashed = [(w, environments.sha256_of(w.path)) for w in wheels]
    key = environment_key([(w.path.name, h) for w, h in hashed], TARGET)
    return store._build(key, hashed, ("x",), TARGET)


def test_a_corrupt_extension_member_does_not_break_the_numpy_scan(tmp_path: Path) -> None:
    """A wheel from the index whose compiled extension's deflate stream is corrupt is read as
    "not a NumPy 1.x build" while resolving (unpacking refuses it later), never a crash of
    the resolution with zlib's own error."""
    so = b"\x7fELF" + b"numpy.core._multiarray_umath" * 4096
    wheel = make_wheel(tmp_path, "ext", files={"ext/_x.so": so})
    corrupt_deflate(wheel.path, "ext/_x.so")
    assert built_against_numpy_1(wheel.path) is False


@pytest.mark.parametrize("how", ["corrupt-deflate", "encrypted", "unknown-method"])
def test_an_unreadable_metadata_member_is_a_package_fetch_error(tmp_path: Path, how: str) -> None:
    """A wheel whose METADATA cannot be read (a corrupt deflate stream, an encrypted member)
    is refused while resolving with a PackageFetchError naming it, not zlib's or zipfile's
    own error."""
    wheel = make_wheel(tmp_path, "meta")
    member = "meta-1.0.dist-info/METADATA"
    if how == "corrupt-deflate":
        corrupt_deflate(wheel.path, member)
    elif how == "encrypted":
        patch_headers(wheel.path, flag=0x1)
    else:
        patch_headers(wheel.path, method=99)
    with pytest.raises(PackageFetchError, match=r"meta-1\.0-py3-none-any\.whl"):
        read_requires_dist(wheel.path)

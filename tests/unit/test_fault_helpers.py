"""The pieces of fault handling that need no Docker: background tasks, settle, timeouts."""

import asyncio
import gc
from typing import Any

import pytest

from harombe.errors import UsageError
from harombe.security.docker_manager import settle
from harombe.security.runtime.pool import Background
from harombe.security.runtime.runs import check_timeout


async def test_settle_finishes_the_work_and_undoes_it_when_cancelled() -> None:
    """A cancelled caller waits for the work; what the work made is undone before the cancel."""
    undone: list[str] = []

    async def make() -> str:
        await asyncio.sleep(0.05)
        return "thing"

    async def undo(made: str) -> None:
        undone.append(made)

    task = asyncio.create_task(settle(make(), undo=undo))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert undone == ["thing"]
    assert await settle(make(), undo=undo) == "thing" and undone == ["thing"]


async def test_background_failures_are_logged_not_left_unretrieved() -> None:
    """A failed background task is retrieved (and logged), so asyncio never reports it."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        background = Background()

        async def fail() -> None:
            raise RuntimeError("boom")

        background.spawn(fail(), name="failing")
        await background.wait()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


@pytest.mark.parametrize(
    "timeout_s",
    [float("nan"), float("inf"), float("-inf"), -1, 0, "5", True, None.__class__],
    ids=["nan", "inf", "-inf", "negative", "zero", "string", "bool", "type"],
)
def test_unusable_timeouts_are_refused(timeout_s: object) -> None:
    """check_timeout refuses anything but a finite number of seconds above zero."""
    with pytest.raises(UsageError, match="finite number of seconds"):
        check_timeout(timeout_s)


def test_usable_timeouts_pass() -> None:
    for timeout_s in (None, 0.5, 5, 600.0):
        check_timeout(timeout_s)

"""The stream adapter over output callbacks, driven by a fake call (no Docker)."""

import asyncio
import contextlib

from harombe.security.runtime.channel import OutputCallback
from harombe.security.runtime.streaming import OutputChunk, iterate


async def test_chunks_then_result_with_characters_kept_whole() -> None:
    """A UTF-8 character split across two chunks is yielded once, whole; the result is last."""

    async def call(on_output: OutputCallback) -> str:
        on_output("stdout", "na\xefve ".encode()[:3])
        await asyncio.sleep(0)
        on_output("stdout", "na\xefve ".encode()[3:])
        on_output("stderr", b"warn\n")
        return "done"

    items = [item async for item in iterate(call)]
    assert items == [
        OutputChunk("stdout", "na"),
        OutputChunk("stdout", "\xefve "),
        OutputChunk("stderr", "warn\n"),
        "done",
    ]


async def test_leaving_early_cancels_the_call() -> None:
    """Closing the iterator cancels the underlying call and waits for it to finish."""
    state = {"cancelled": False}

    async def call(on_output: OutputCallback) -> str:
        on_output("stdout", b"first\n")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return "never"

    async with contextlib.aclosing(iterate(call)) as items:
        async for item in items:
            assert item == OutputChunk("stdout", "first\n")
            break
    assert state["cancelled"]

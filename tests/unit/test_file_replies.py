"""File replies come from inside the sandbox: whatever they hold, the caller gets a bounded,
well-typed error, and a reply outside the protocol makes the sandbox lost."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from harombe.errors import FileError, SandboxLostError, SandboxNotFoundError
from harombe.security.runtime.files import MAX_KIND_CHARS, MAX_MESSAGE_CHARS
from harombe.testing import FakeDocker, FakeGuest

from .fake_manager import running


class Forger(FakeGuest):
    """Answers every ``write`` with ``reply`` (plus the request's id)."""

    reply: ClassVar[dict[str, Any]] = {}

    def _handle(self, msg: dict[str, Any], blob: bytes) -> None:
        if msg.get("op") == "write":
            self.send({"op": "result", "id": msg.get("id"), **self.reply})
            return
        super()._handle(msg, blob)


def forger(reply: dict[str, Any]) -> type[Forger]:
    return type("Forged", (Forger,), {"reply": reply})


@pytest.mark.parametrize(
    "kind",
    ["E" * 100_000, {"nested": ["x"] * 1000}, None, 12],
    ids=["huge-kind", "object-kind", "no-kind", "number-kind"],
)
async def test_an_error_reply_of_any_size_or_type_is_a_bounded_file_error(kind: Any) -> None:
    """A refusal whose kind and message are huge or not text is a FileError of bounded size."""
    reply = {"ok": False, "error": kind, "message": "m" * 1_000_000}
    async with running(FakeDocker(guest_factory=forger(reply))) as (_, manager):
        box = await manager.create_sandbox("python")
        with pytest.raises(FileError) as caught:
            await manager.write_file(box.sandbox_id, "a.txt", "x")
        assert len(str(caught.value)) <= MAX_KIND_CHARS + MAX_MESSAGE_CHARS + 2
        assert manager.get(box.sandbox_id) is box  # a refusal is not a broken sandbox


@pytest.mark.parametrize(
    "written",
    [True, -1, 2, "1", 1.0, None, 10**30],
    ids=["bool", "negative", "more-than-sent", "text", "float", "missing", "huge"],
)
async def test_a_forged_write_count_makes_the_sandbox_lost(written: Any) -> None:
    """A write reply whose byte count is not a count of what was sent ends the sandbox, and its
    id then says it was lost (not that it never existed)."""
    reply = {"ok": True, **({} if written is None else {"bytes": written})}
    async with running(FakeDocker(guest_factory=forger(reply))) as (docker, manager):
        box = await manager.create_sandbox("python")
        with pytest.raises(SandboxLostError, match="broke the protocol"):
            await manager.write_file(box.sandbox_id, "a.txt", "x")
        with pytest.raises(SandboxNotFoundError, match="was lost"):
            manager.get(box.sandbox_id)
        assert docker.labelled({"harombe.sandbox": box.sandbox_id}) == []

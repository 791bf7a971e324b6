"""Fixtures for the unit tests: nothing here needs Docker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from harombe.testing import FakeDocker


@pytest.fixture
async def docker() -> AsyncIterator[FakeDocker]:
    """A started FakeDocker; its guests are stopped afterwards, so no run is left waiting."""
    fake = FakeDocker()
    await fake.start()
    yield fake
    for container in fake.containers.values():
        container.guest.stop()

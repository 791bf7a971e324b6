"""A stand-in for the agent framework's ``tool`` decorator, so the tutorial's tool file can be
imported unchanged: it records the tool's options and returns the function itself."""

from collections.abc import Callable
from typing import Any

REGISTERED: dict[str, dict[str, Any]] = {}


def tool(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTERED[fn.__name__] = options
        return fn

    return register

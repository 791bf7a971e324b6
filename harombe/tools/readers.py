"""How one argument value is read: by its base type, never through methods a subclass may
override, with errors that name the parameter and echo at most a short preview of the value.

These are the building blocks of the models in :mod:`harombe.tools.params`; a refusal is a
pydantic error carrying its final message and the :class:`HarombeError` kind to raise.
"""

from __future__ import annotations

import re

from pydantic import ValidationInfo
from pydantic_core import PydanticCustomError

from harombe.config import Limits
from harombe.errors import HarombeError, InvalidArgumentError, SandboxNotFoundError
from harombe.security.policy.paths import exact_str, is_a, preview, type_name, workspace_relative
from harombe.security.runtime.sandbox import check_sandbox_id

_SANDBOX_ID = re.compile(r"sandbox-[0-9a-f]{12}", re.ASCII)
MAX_PACKAGE_CHARS = 1024
#: Linux's MAX_ARG_STRLEN (32 pages) less the terminating NUL: the longest ``bash -c`` program.
MAX_SHELL_CODE_BYTES = 131_071
MAX_DOMAINS = 256
MAX_DOMAIN_CHARS = 253
#: The size cap on ``code`` and ``content`` when the caller gives none (the default limit).
DEFAULT_MAX_BYTES: int = Limits.model_fields["max_file_bytes"].default
_ERROR = "harombe"


def refuse(message: str, kind: type[HarombeError] = InvalidArgumentError) -> PydanticCustomError:
    """A validation error carrying its final message and the harombe error kind to raise.

    A lone surrogate echoed from a value is written as ``\\ud800``: the message must stay
    valid text (pydantic cannot render it otherwise, and it goes into a JSON result)."""
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return PydanticCustomError(_ERROR, "{message}", {"message": safe, "kind": kind.__name__})


def describe(value: object) -> str:
    """A short description of a value for an error: ``'false', a string``; ``None``."""
    if value is None:
        return "None"
    kind = {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type_name(value)
    )
    return f"{preview(value)}, {kind}"


def boolean(name: str, value: object) -> bool:
    if value is True or value is False:  # bool cannot be subclassed: these are the only two
        return bool(value)
    hint = " (not the text 'true' or 'false')" if is_a(value, str) else ""
    raise refuse(
        f"{name} must be true or false (got {describe(value)}); pass a boolean{hint}, "
        f"e.g. {name}=True"
    )


def text(name: str, value: object, info: ValidationInfo, *, what: str) -> str:
    """``value`` if it is valid Unicode text within the size cap."""
    if not is_a(value, str):
        fix = "; decode it to text first" if is_a(value, bytes | bytearray) else ""
        raise refuse(f"{name} must be a string of {what} (got {describe(value)}){fix}")
    value = exact_str(value)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise refuse(
            f"{name} is not valid Unicode text: it holds a lone surrogate "
            f"U+{ord(value[exc.start]):04X} at character {exc.start}; send valid UTF-8 text "
            "(encode binary data as base64)"
        ) from None
    limit = (info.context or {}).get("max_bytes") or DEFAULT_MAX_BYTES
    if size > limit:
        raise refuse(
            f"{name} is {size} bytes, over the limit of {limit} bytes "
            "(security.sandbox.limits.max_file_bytes); send less, or raise the limit"
        )
    return value


def checked_id(value: object) -> str:
    if not is_a(value, str):
        raise refuse(
            f"sandbox_id must be a string such as 'sandbox-0123456789ab' (got "
            f"{describe(value)}); use the id an earlier result returned"
        )
    value = exact_str(value)
    if not _SANDBOX_ID.fullmatch(value):  # the whole text: no trailing newline, ASCII only
        raise refuse(
            f"Sandbox not found: {preview(value, 40)} is not a harombe sandbox id (they look "
            "like 'sandbox-0123456789ab'); create one with code_execute",
            SandboxNotFoundError,
        )
    try:
        return check_sandbox_id(value)
    except HarombeError as err:
        raise refuse(str(err), type(err)) from None


def seconds(value: object) -> float:
    """``value`` as a float, read by the base type (a subclass's ``__float__`` is not called);
    an integer too large for a float is refused, not raised as OverflowError."""
    if is_a(value, float):
        return float.__float__(value)
    if not is_a(value, int):
        raise refuse(f"timeout must be a number of seconds (got {describe(value)})")
    try:
        return float(int.__index__(value))
    except OverflowError:
        raise refuse(
            f"timeout is a {int.bit_length(value)}-bit integer, too large to be a number of "
            "seconds; pass e.g. timeout=10, or leave it out for the default"
        ) from None


def path(value: object, *, allow_root: bool) -> str:
    try:
        return workspace_relative(value, allow_root=allow_root)  # type: ignore[arg-type]
    except HarombeError as err:
        raise refuse(str(err), type(err)) from None

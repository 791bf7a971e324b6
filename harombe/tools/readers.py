"""How one argument value is read: by its base type, never through methods a subclass may
override, with errors that name the parameter and echo at most a short preview of the value.

These are the building blocks of the models in :mod:`harombe.tools.params`: each reader takes
the raw value (and, where the parameter's name or the validation context matters, pydantic's
:class:`~pydantic.ValidationInfo`) and returns the plain, normalised value or raises a refusal,
a pydantic error carrying its final message and the :class:`HarombeError` kind to raise.
"""

from __future__ import annotations

import re

from pydantic import ValidationInfo
from pydantic_core import PydanticCustomError

from harombe.config import LANGUAGES, REGISTRIES, Limits, NetworkConfig
from harombe.errors import (
    HarombeError,
    InvalidArgumentError,
    PackageSpecError,
    SandboxNotFoundError,
)
from harombe.security.policy.netpolicy import Allowlist
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
#: The network of a new sandbox whose call does not say, when the caller gives no default.
DEFAULT_NETWORK: bool = NetworkConfig.model_fields["enabled_by_default"].default
#: What ``code`` and ``content`` hold, for their errors: (what to pass, what it is).
TEXTS = {"code": ("the program to run", "source code"), "content": ("the file's text", "file text")}
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


def boolean(value: object, info: ValidationInfo) -> bool:
    """``True`` or ``False`` exactly: the text ``"false"``, ``0``/``1`` and ``None`` are refused."""
    if value is True or value is False:  # bool cannot be subclassed: these are the only two
        return bool(value)
    name = info.field_name
    hint = " (not the text 'true' or 'false')" if is_a(value, str) else ""
    raise refuse(
        f"{name} must be true or false (got {describe(value)}); pass a boolean{hint}, "
        f"e.g. {name}=True"
    )


def network(value: object, info: ValidationInfo) -> bool | None:
    """``network_enabled``: a boolean, or ``None`` (left out). Left out, a new sandbox gets
    ``network_default`` from the validation context (the config's ``enabled_by_default``) and
    an existing one stays ``None``: it keeps the network it was created with."""
    if value is not None:
        return boolean(value, info)
    if info.data.get("sandbox_id") is not None:
        return None
    return bool((info.context or {}).get("network_default", DEFAULT_NETWORK))


def language(value: object) -> str:
    """One of :data:`harombe.config.LANGUAGES`, exactly as written there."""
    if is_a(value, str) and exact_str(value) in LANGUAGES:
        return exact_str(value)
    raise refuse(
        f"language must be one of {', '.join(LANGUAGES)} (got {describe(value)}); "
        "write it in lower case, e.g. language='python'"
    )


def registry(value: object) -> str:
    """One of :data:`harombe.config.REGISTRIES`; another name is a :class:`PackageSpecError`."""
    names = " or ".join(repr(r) for r in REGISTRIES)
    if not is_a(value, str):
        raise refuse(f"registry must be {names} (got {describe(value)})")
    value = exact_str(value)
    if value not in REGISTRIES:
        raise refuse(
            f"unknown registry {preview(value)}; harombe installs from {names} only",
            PackageSpecError,
        )
    return value


def package(value: object) -> str:
    """A package spec's text, at most :data:`MAX_PACKAGE_CHARS`, surrounding spaces stripped
    (the spec itself is judged with the registry, by the model)."""
    if not is_a(value, str):
        raise refuse(f"package must be a string such as 'requests==2.31.0' (got {describe(value)})")
    value = exact_str(value)
    if len(value) > MAX_PACKAGE_CHARS:
        raise refuse(
            f"package is {len(value)} characters long, over the limit of "
            f"{MAX_PACKAGE_CHARS}; give one package name with an optional version"
        )
    return value.strip()


def text(value: object, info: ValidationInfo) -> str:
    """``code`` or ``content``: valid Unicode text within the size cap (``max_bytes`` in the
    validation context, else :data:`DEFAULT_MAX_BYTES`)."""
    name = str(info.field_name)
    purpose, what = TEXTS[name]
    if value is None:
        raise refuse(f"{name} is required: pass {purpose} as a string (got None)")
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


def required_id(value: object) -> str:
    """The ``sandbox_id`` of a tool acting on an existing sandbox: required, then
    :func:`checked_id`."""
    if value is None:
        raise refuse(
            "sandbox_id is required: pass the id an earlier code_execute result returned "
            "(e.g. 'sandbox-0123456789ab')"
        )
    return checked_id(value)


def optional_id(value: object) -> str | None:
    """``code_execute``'s ``sandbox_id``: ``None`` (a new sandbox) or :func:`checked_id`."""
    return None if value is None else checked_id(value)


def checked_id(value: object) -> str:
    """A string shaped like a harombe sandbox id; another shape is :class:`SandboxNotFoundError`."""
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


def timeout(value: object) -> float | None:
    """A finite number of seconds above 0 as a float, or ``None`` for the default."""
    if value is None:
        return None
    if is_a(value, bool) or not is_a(value, int | float):
        hint = ", not text" if is_a(value, str) else ""
        raise refuse(
            f"timeout must be a number of seconds (got {describe(value)}); pass a number"
            f"{hint}, e.g. timeout=10, or leave it out for the default"
        )
    as_float = seconds(value)
    if not 0 < as_float < float("inf"):  # refuses NaN too: it compares false with any cap
        raise refuse(
            f"timeout must be a finite number of seconds above 0 (got {describe(value)}); "
            "pass e.g. timeout=10, or leave it out for the default"
        )
    return as_float


def domains(value: object) -> list[str]:
    """``allowed_domains``: a list or tuple of host names as the egress proxy reads them.

    One snapshot, read by the base type's own methods: an overridden ``__iter__``/``__len__``
    (of the list or of a str in it), or another task changing the caller's list later, cannot
    make the list that was checked differ from the list the sandbox gets."""
    if value is None:
        return []
    if not is_a(value, list | tuple):
        hint = f"; write [{preview(value)}]" if is_a(value, str) else ""
        raise refuse(f"allowed_domains must be a list of host names (got {describe(value)}){hint}")
    base = list if is_a(value, list) else tuple
    count = base.__len__(value)
    if count > MAX_DOMAINS:
        raise refuse(
            f"allowed_domains holds {count} names, over the limit of {MAX_DOMAINS}; "
            "use '*.example.com' patterns for many names under one domain"
        )
    names: list[str] = []
    for item in list(base.__iter__(value)):
        if not is_a(item, str) or str.__len__(item) > MAX_DOMAIN_CHARS:
            raise refuse(
                f"allowed_domains must hold host names of at most {MAX_DOMAIN_CHARS} "
                f"characters (got {describe(item)}); write e.g. ['example.com']"
            )
        names.append(exact_str(item))
    try:
        Allowlist.parse(names)  # the proxy reads the list the same way, later
    except HarombeError as err:
        raise refuse(f"allowed_domains: {err}") from None
    return names


def file_path(value: object) -> str:
    """A file's path relative to ``/workspace`` (:func:`workspace_relative`; not the root)."""
    return _workspace_path(value, allow_root=False)


def dir_path(value: object) -> str:
    """A directory's path relative to ``/workspace``; ``.`` (the root itself) is allowed."""
    return _workspace_path(value, allow_root=True)


def _workspace_path(value: object, *, allow_root: bool) -> str:
    try:
        return workspace_relative(value, allow_root=allow_root)  # type: ignore[arg-type]
    except HarombeError as err:
        raise refuse(str(err), type(err)) from None

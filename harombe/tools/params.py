"""The arguments of every tool, as one pydantic model per tool.

Each tool validates and normalises its arguments here ONCE, before anything else happens: the
HITL gate is then shown exactly the values the manager will act on, and an argument that cannot
be read unambiguously is refused before any human is asked and before any sandbox exists. The
same models describe the tools to an LLM (``Model.model_json_schema()``), so every field says
what it means and how to get it right.

What is accepted, and what is refused with an error naming the parameter and the fix:

=================  ===========================================================================
parameter          rule
=================  ===========================================================================
booleans           ``network_enabled``, ``fresh``: ``True`` or ``False`` only. The string
                   ``"false"`` (truthy in Python), ``0``/``1`` and ``None`` are refused.
``timeout``        an int or float of seconds, finite and above 0, or ``None`` for the default.
                   ``"10"`` (a string), ``True``, ``nan`` and ``inf`` are refused.
``code``           text (``str``); ``None`` and bytes are refused, and so are lone surrogates
                   (``"\\ud800"``), which are not Unicode text; at most ``max_file_bytes`` bytes
                   as UTF-8.
``content``        as ``code``: text, no lone surrogates, at most ``max_file_bytes`` bytes.
``language``       exactly ``python``, ``javascript`` or ``shell``. Shell code is passed to
                   bash as one argument, so it may not hold NUL and is at most 131071 bytes.
``sandbox_id``     a string; one that is not shaped like ``sandbox-0123456789ab`` is reported
                   as ``SandboxNotFoundError``, like an unknown id.
file paths         :func:`harombe.security.policy.paths.workspace_relative`: the normalised path
                   relative to ``/workspace``; ambiguous paths are refused (trailing ``/`` on a
                   file, spaces or dots at the end of a name, backslashes, invisible
                   characters, non-NFC text, ``..``).
``package``        a string of at most 1024 characters, stripped of surrounding white space,
                   that :func:`~harombe.security.runtime.packages.parse_spec` accepts for
                   ``registry``.
``registry``       ``pypi`` or ``npm``.
``allowed_domains`` a list (or tuple) of at most 256 host names, each checked as the egress
                   proxy will read it; a single string is refused (it is not a list). Given
                   without ``network_enabled=True`` for a new sandbox, it is refused.
=================  ===========================================================================

Errors echo at most about 80 characters of a value, so a 10 MB argument never comes back.

Values are read by their base types (:mod:`harombe.tools.readers`): a ``str``/``int``/``float``/
``list`` subclass counts as its plain value and none of its own methods is called, so a value
cannot read one way to the gate and another to the manager; the models hold plain copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harombe import errors
from harombe.config import LANGUAGES, Language
from harombe.errors import (
    HarombeError,
    InvalidArgumentError,
    PackageSpecError,
)
from harombe.security.policy.netpolicy import Allowlist
from harombe.security.policy.paths import exact_str, is_a, preview
from harombe.security.runtime import packages
from harombe.tools.readers import (
    _ERROR,
    MAX_DOMAIN_CHARS,
    MAX_DOMAINS,
    MAX_PACKAGE_CHARS,
    MAX_SHELL_CODE_BYTES,
    boolean,
    checked_id,
    describe,
    path,
    refuse,
    seconds,
    text,
)

Model = TypeVar("Model", bound="ToolArgs")


class ToolArgs(BaseModel):
    """Base of the tool argument models: unknown parameters refused, values immutable, and no
    type coercion after the validators below (``strict``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    tool: ClassVar[str]


class _OnSandbox(ToolArgs):
    """Arguments of the tools that act on an existing sandbox."""

    sandbox_id: str = Field(
        description="Id of the sandbox to act on, as returned by an earlier code_execute "
        "result (e.g. 'sandbox-0123456789ab')."
    )

    @field_validator("sandbox_id", mode="before")
    @classmethod
    def _sandbox_id(cls, value: object) -> str:
        if value is None:
            raise refuse(
                "sandbox_id is required: pass the id an earlier code_execute result returned "
                "(e.g. 'sandbox-0123456789ab')"
            )
        return checked_id(value)


class CodeExecuteArgs(ToolArgs):
    """``code_execute`` and ``code_execute_stream``."""

    tool: ClassVar[str] = "code_execute"

    language: Language = Field(
        description="Language of `code`: 'python', 'javascript' (Node.js) or 'shell' (bash)."
    )
    code: str = Field(
        description="The program to run, as text. Python and JavaScript keep variables, "
        "imports and functions between calls on the same sandbox; the repr of a final bare "
        "expression comes back as `result`. Output is returned in `stdout`/`stderr`."
    )
    sandbox_id: str | None = Field(
        None,
        description="Id of an existing sandbox from an earlier result (e.g. "
        "'sandbox-0123456789ab') to run in, keeping its files and state; leave it out to "
        "create a new sandbox (its id is in the result).",
    )
    timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds this call may run, a number above 0. Leave it out for the "
        "configured default (max_execution_time, 30 s unless changed). Longer values are "
        "allowed up to the configured ceiling (max_timeout_s, 600 s unless changed) and capped "
        "to it with a warning.",
    )
    network_enabled: bool = Field(
        False,
        description="true to create the new sandbox with network access, limited to "
        "`allowed_domains` (needs a stronger approval). A JSON boolean, never the text "
        "'true'/'false'. Only used when `sandbox_id` is left out: a sandbox keeps the network "
        "it was created with.",
    )
    allowed_domains: list[str] = Field(
        default_factory=list,
        description="Host names the new network-enabled sandbox may connect to, e.g. "
        "['example.com', '*.example.org']; bare names, no scheme, port or path. Requires "
        "network_enabled=true.",
    )
    fresh: bool = Field(
        False,
        description="true to run this call in a new process, without the state earlier calls "
        "left in the sandbox's interpreter.",
    )

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: object) -> str:
        if is_a(value, str) and exact_str(value) in LANGUAGES:
            return exact_str(value)
        raise refuse(
            f"language must be one of {', '.join(LANGUAGES)} (got {describe(value)}); "
            "write it in lower case, e.g. language='python'"
        )

    @field_validator("code", mode="before")
    @classmethod
    def _code(cls, value: object, info: ValidationInfo) -> str:
        if value is None:
            raise refuse("code is required: pass the program to run as a string (got None)")
        return text("code", value, info, what="source code")

    @field_validator("sandbox_id", mode="before")
    @classmethod
    def _sandbox_id(cls, value: object) -> str | None:
        return None if value is None else checked_id(value)

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: object) -> float | None:
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

    @field_validator("network_enabled", mode="before")
    @classmethod
    def _network_enabled(cls, value: object) -> bool:
        return boolean("network_enabled", value)

    @field_validator("fresh", mode="before")
    @classmethod
    def _fresh(cls, value: object) -> bool:
        return boolean("fresh", value)

    @field_validator("allowed_domains", mode="before")
    @classmethod
    def _allowed_domains(cls, value: object) -> list[str]:
        if value is None:
            return []
        if not is_a(value, list | tuple):
            hint = f"; write [{preview(value)}]" if is_a(value, str) else ""
            raise refuse(
                f"allowed_domains must be a list of host names (got {describe(value)}){hint}"
            )
        # One snapshot, read by the base type's own methods: an overridden __iter__/__len__
        # (of the list or of a str in it), or another task changing the caller's list later,
        # cannot make the list that was checked differ from the list the sandbox gets.
        base = list if is_a(value, list) else tuple
        count = base.__len__(value)
        if count > MAX_DOMAINS:
            raise refuse(
                f"allowed_domains holds {count} names, over the limit of {MAX_DOMAINS}; "
                "use '*.example.com' patterns for many names under one domain"
            )
        items = list(base.__iter__(value))
        domains: list[str] = []
        for item in items:
            if not is_a(item, str) or str.__len__(item) > MAX_DOMAIN_CHARS:
                raise refuse(
                    f"allowed_domains must hold host names of at most {MAX_DOMAIN_CHARS} "
                    f"characters (got {describe(item)}); write e.g. ['example.com']"
                )
            domains.append(exact_str(item))
        try:
            Allowlist.parse(domains)  # the proxy reads the list the same way, later
        except HarombeError as err:
            raise refuse(f"allowed_domains: {err}") from None
        return domains

    @model_validator(mode="after")
    def _shell_code_fits_an_argument(self) -> CodeExecuteArgs:
        # bash gets its program as one argv string: Linux refuses NUL in it and anything over
        # MAX_ARG_STRLEN, and it would fail only inside the sandbox, after the gate.
        if self.language != "shell":
            return self
        if "\x00" in self.code:
            raise refuse(
                f"shell code contains a NUL character at position {self.code.index(chr(0))}, "
                "which bash cannot be given; remove it"
            )
        size = len(self.code.encode("utf-8"))
        if size > MAX_SHELL_CODE_BYTES:
            raise refuse(
                f"shell code is {size} bytes; bash takes its program as one argument of at "
                f"most {MAX_SHELL_CODE_BYTES} bytes, so write the script with code_write_file "
                "and run it with code='bash script.sh'"
            )
        return self

    @model_validator(mode="after")
    def _domains_need_network(self) -> CodeExecuteArgs:
        if self.sandbox_id is None and self.allowed_domains and not self.network_enabled:
            raise refuse(
                "allowed_domains was given but network_enabled is false, so the new sandbox "
                "would have no network at all; pass network_enabled=True as well, or drop "
                "allowed_domains"
            )
        return self


class InstallPackageArgs(_OnSandbox):
    """``code_install_package``."""

    tool: ClassVar[str] = "code_install_package"

    package: str = Field(
        description="One registry package with an optional version, e.g. 'requests==2.31.0' "
        "(pypi) or 'axios@1.6.0' (npm). No URLs, paths, git references or options."
    )
    registry: packages.Registry = Field(
        "pypi", description="Where the package comes from: 'pypi' (Python) or 'npm' (Node.js)."
    )

    @field_validator("package", mode="before")
    @classmethod
    def _package(cls, value: object) -> str:
        if not is_a(value, str):
            raise refuse(
                f"package must be a string such as 'requests==2.31.0' (got {describe(value)})"
            )
        value = exact_str(value)
        if len(value) > MAX_PACKAGE_CHARS:
            raise refuse(
                f"package is {len(value)} characters long, over the limit of "
                f"{MAX_PACKAGE_CHARS}; give one package name with an optional version"
            )
        return value.strip()

    @field_validator("registry", mode="before")
    @classmethod
    def _registry(cls, value: object) -> str:
        if not is_a(value, str):
            raise refuse(f"registry must be 'pypi' or 'npm' (got {describe(value)})")
        value = exact_str(value)
        if value not in packages.REGISTRIES:
            raise refuse(
                f"unknown registry {preview(value)}; harombe installs from 'pypi' or 'npm' only",
                PackageSpecError,
            )
        return value

    @model_validator(mode="after")
    def _spec(self) -> InstallPackageArgs:
        try:
            packages.parse_spec(self.package, self.registry)
        except HarombeError as err:
            raise refuse(str(err), type(err)) from None
        return self


class WriteFileArgs(_OnSandbox):
    """``code_write_file``."""

    tool: ClassVar[str] = "code_write_file"

    file_path: str = Field(
        description="Where to write, relative to /workspace (e.g. 'data/input.csv'; "
        "'/workspace/data/input.csv' is the same). Parent directories are created. No '..', "
        "no trailing '/', no spaces or dots at the end of a name."
    )
    content: str = Field(description="The file's text, written as UTF-8; replaces the file.")

    @field_validator("file_path", mode="before")
    @classmethod
    def _file_path(cls, value: object) -> str:
        return path(value, allow_root=False)

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: object, info: ValidationInfo) -> str:
        if value is None:
            raise refuse("content is required: pass the file's text as a string (got None)")
        return text("content", value, info, what="file text")


class ReadFileArgs(_OnSandbox):
    """``code_read_file``."""

    tool: ClassVar[str] = "code_read_file"

    file_path: str = Field(
        description="The file to read, relative to /workspace (e.g. 'results.txt'). It must "
        "hold UTF-8 text."
    )

    @field_validator("file_path", mode="before")
    @classmethod
    def _file_path(cls, value: object) -> str:
        return path(value, allow_root=False)


class ListFilesArgs(_OnSandbox):
    """``code_list_files``."""

    tool: ClassVar[str] = "code_list_files"

    path: str = Field(
        ".",
        description="The directory to list, relative to /workspace; '.' (the default) is "
        "/workspace itself.",
    )

    @field_validator("path", mode="before")
    @classmethod
    def _dir(cls, value: object) -> str:
        return path(value, allow_root=True)


class DestroySandboxArgs(_OnSandbox):
    """``code_destroy_sandbox``."""

    tool: ClassVar[str] = "code_destroy_sandbox"


#: Every tool's argument model, by tool name (``code_execute_stream`` shares code_execute's).
TOOL_ARGS: dict[str, type[ToolArgs]] = {
    model.tool: model
    for model in (
        CodeExecuteArgs,
        InstallPackageArgs,
        WriteFileArgs,
        ReadFileArgs,
        ListFilesArgs,
        DestroySandboxArgs,
    )
}
TOOL_ARGS["code_execute_stream"] = CodeExecuteArgs


def parse_args(
    model: type[Model], args: Mapping[str, Any], *, max_bytes: int | None = None
) -> Model:
    """``args`` validated and normalised by ``model``; otherwise the :class:`HarombeError` that
    names each bad parameter and its fix (:class:`InvalidArgumentError` unless every problem
    is of one other kind, such as :class:`WorkspacePathError` or :class:`SandboxNotFoundError`).

    ``max_bytes`` caps ``code`` and ``content`` (the manager's ``max_file_bytes``)."""
    try:
        return model.model_validate(dict(args), context={"max_bytes": max_bytes})
    except ValidationError as exc:
        try:
            error = _as_error(exc, model)
        except Exception:  # noqa: BLE001 - an error that cannot be rendered is still an error
            error = InvalidArgumentError(f"the arguments of {model.tool} could not be read")
        raise error from None
    except Exception as exc:  # noqa: BLE001 - whatever a value does, the call gets an error
        # The validators read values by their base types, so this is a last line only: a
        # value that still raised is one that cannot be read, and the caller is told so.
        raise InvalidArgumentError(
            f"the arguments of {model.tool} could not be read ({type(exc).__name__}); pass "
            "plain values: str, int, float, bool, list of str"
        ) from None


def _as_error(exc: ValidationError, model: type[BaseModel]) -> HarombeError:
    kinds: list[str] = []
    texts: list[str] = []
    for item in exc.errors(include_url=False):
        name = ".".join(str(p) for p in item["loc"]) or "arguments"
        ctx = item.get("ctx") or {}
        if item["type"] == _ERROR:
            kinds.append(str(ctx["kind"]))
            texts.append(str(ctx["message"]))
            continue
        kinds.append(InvalidArgumentError.__name__)
        if item["type"] == "missing":
            texts.append(f"{name} is required")
        elif item["type"] == "extra_forbidden":
            texts.append(
                f"unknown parameter {preview(name)}; the parameters are "
                f"{', '.join(model.model_fields)}"
            )
        else:
            texts.append(f"{name}: {item['msg']} (got {describe(item.get('input'))})")
    kind = kinds[0] if len(set(kinds)) == 1 else InvalidArgumentError.__name__
    cls = getattr(errors, kind, InvalidArgumentError)
    return cls("; ".join(texts))

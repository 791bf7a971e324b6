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
                   ``"false"`` (truthy in Python) and ``0``/``1`` are refused, and so is
                   ``None`` for ``fresh``. ``network_enabled=None`` (or left out) is the
                   config's ``network.enabled_by_default`` for a new sandbox; an existing
                   sandbox keeps the network it was created with.
``timeout``        an int or float of seconds, finite and above 0, or ``None`` for the default.
                   ``"10"`` (a string), ``True``, ``nan`` and ``inf`` are refused.
``code``           text (``str``); ``None`` and bytes are refused, and so are lone surrogates
                   (``"\\ud800"``), which are not Unicode text; at most ``max_file_bytes`` bytes
                   as UTF-8.
``content``        as ``code``: text, no lone surrogates, at most ``max_file_bytes`` bytes.
``language``       exactly ``python``, ``javascript`` or ``shell`` (``config.LANGUAGES``). Shell
                   code is passed to bash as one argument, so it may not hold NUL and is at
                   most 131071 bytes.
``sandbox_id``     a string; one that is not shaped like ``sandbox-0123456789ab`` is reported
                   as ``SandboxNotFoundError``, like an unknown id.
file paths         :func:`harombe.security.policy.paths.workspace_relative`: the normalised path
                   relative to ``/workspace``; ambiguous paths are refused (trailing ``/`` on a
                   file, spaces or dots at the end of a name, backslashes, invisible
                   characters, non-NFC text, ``..``).
``package``        a string of at most 1024 characters, stripped of surrounding white space,
                   that :func:`~harombe.security.runtime.packages.parse_spec` accepts for
                   ``registry``.
``registry``       ``pypi`` or ``npm`` (``config.REGISTRIES``).
``profile``        ``None`` or a profile name: 1 to 64 of ``a-z 0-9 _ . -``, starting with a
                   letter or digit (whether the profile exists is checked when the call is
                   planned, against the loaded profiles).
``environment``    ``None`` or an environment name, read as ``profile`` is (checked when planned).
``output_mode``    ``None`` (the config's ``security.sandbox.output_mode``), ``"full"`` or
                   ``"llm"``, exactly: ``"LLM"``, ``1`` and ``True`` are refused.
``encoding``       ``code_read_file``'s: ``"utf-8"`` (the default) or ``"base64"``, exactly.
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

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from harombe import errors
from harombe.config import OUTPUT_MODES, Language, OutputMode, Registry
from harombe.errors import HarombeError, InvalidArgumentError
from harombe.security.policy.package_specs import parse_spec
from harombe.security.policy.paths import preview
from harombe.tools import readers
from harombe.tools.readers import _ERROR, MAX_SHELL_CODE_BYTES, describe, refuse

#: What a profile's name looks like (as its file's stem).
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")

Model = TypeVar("Model", bound="ToolArgs")

# Each parameter kind is read by one function of :mod:`harombe.tools.readers`, run before
# pydantic's own (strict) type check.
SandboxId = Annotated[str, BeforeValidator(readers.required_id)]
Flag = Annotated[bool, BeforeValidator(readers.boolean)]
Text = Annotated[str, BeforeValidator(readers.text)]
FilePath = Annotated[str, BeforeValidator(readers.file_path)]
DirPath = Annotated[str, BeforeValidator(readers.dir_path)]


def _name(what: str, example: str) -> Any:
    """A reader of an optional name parameter: ``None`` or a well-formed name (plain ``str``)."""

    def read(value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not PROFILE_NAME.fullmatch(str.__str__(value)):
            raise refuse(
                f"{what} must be {example} (lower-case letters, digits, '_', '.', '-'; at most "
                f"64), got {describe(value)}"
            )
        return str.__str__(value)

    return read


_profile = _name("profile", "a profile's name such as 'minimal' or 'data-science'")
_environment = _name("environment", "a configured dependency environment's name such as 'data'")


def _output_mode(value: object) -> str | None:
    """``code_execute``'s ``output_mode``: ``None`` (the config's default), ``"full"`` or
    ``"llm"`` exactly (plain ``str``)."""
    if value is None:
        return None
    if not isinstance(value, str) or str.__str__(value) not in OUTPUT_MODES:
        raise refuse(
            f"output_mode must be 'full' (all output up to the byte cap) or 'llm' (a long "
            f"stream as its head and tail, the full text saved in the sandbox), in lower case, "
            f"or left out for the configured default; got {describe(value)}"
        )
    return str.__str__(value)


#: How ``code_read_file`` returns a file: as UTF-8 text, or its bytes as base64.
READ_ENCODINGS = ("utf-8", "base64")
ReadEncoding = Literal["utf-8", "base64"]


def _read_encoding(value: object) -> str:
    """``code_read_file``'s ``encoding``: ``"utf-8"`` or ``"base64"`` exactly (plain ``str``)."""
    if not isinstance(value, str) or str.__str__(value) not in READ_ENCODINGS:
        raise refuse(
            f"encoding must be 'utf-8' (the file's text) or 'base64' (its bytes, for images "
            f"and other binary files), in lower case; got {describe(value)}"
        )
    return str.__str__(value)


class ToolArgs(BaseModel):
    """Base of the tool argument models: unknown parameters refused, values immutable, and no
    type coercion after the readers (``strict``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    tool: ClassVar[str]


class _OnSandbox(ToolArgs):
    """Arguments of the tools that act on an existing sandbox."""

    sandbox_id: SandboxId = Field(
        description="Id of the sandbox to act on, as returned by an earlier code_execute "
        "result (e.g. 'sandbox-0123456789ab')."
    )


class CodeExecuteArgs(ToolArgs):
    """``code_execute`` and ``code_execute_stream``: the one definition of their parameters
    (the methods' signatures are checked against it)."""

    tool: ClassVar[str] = "code_execute"

    language: Annotated[Language, BeforeValidator(readers.language)] = Field(
        description="Language of `code`: 'python', 'javascript' (Node.js) or 'shell' (bash)."
    )
    code: Text = Field(
        description="The program to run, as text. Python and JavaScript keep variables, "
        "imports and functions between calls on the same sandbox; the repr of a final bare "
        "expression comes back as `result`. Output is returned in `stdout`/`stderr`."
    )
    sandbox_id: Annotated[str | None, BeforeValidator(readers.optional_id)] = Field(
        None,
        description="Id of an existing sandbox from an earlier result (e.g. "
        "'sandbox-0123456789ab') to run in, keeping its files and state; leave it out to "
        "create a new sandbox (its id is in the result).",
    )
    timeout: Annotated[float | None, BeforeValidator(readers.timeout)] = Field(
        None,
        gt=0,
        description="Seconds this call may run, a number above 0. Leave it out for the "
        "configured default (max_execution_time, 30 s unless changed). Longer values are "
        "allowed up to the configured ceiling (max_timeout_s, 600 s unless changed) and capped "
        "to it with a warning.",
    )
    # Declared after sandbox_id: its reader looks at sandbox_id to resolve a left-out value.
    network_enabled: Annotated[bool | None, BeforeValidator(readers.network)] = Field(
        None,
        validate_default=True,
        description="true to create the new sandbox with network access, limited to "
        "`allowed_domains` (needs a stronger approval); leave it out for the configured "
        "default (network.enabled_by_default, false unless changed). A JSON boolean, never the "
        "text 'true'/'false'. Only used when `sandbox_id` is left out: a sandbox keeps the "
        "network it was created with.",
    )
    allowed_domains: Annotated[list[str], BeforeValidator(readers.domains)] = Field(
        default_factory=list,
        description="Host names the new network-enabled sandbox may connect to, e.g. "
        "['example.com', '*.example.org']; bare names, no scheme, port or path. Requires "
        "network_enabled=true.",
    )
    fresh: Flag = Field(
        False,
        description="true to run this call in a new process, without the state earlier calls "
        "left in the sandbox's interpreter.",
    )
    profile: Annotated[str | None, BeforeValidator(_profile)] = Field(
        None,
        description="A policy profile to run under, e.g. 'minimal' (standard-library "
        "computation only) or 'data-science' (adds numpy, pandas, scipy). Python only. The "
        "code is checked before it runs and refused with a list of `violations` "
        "('Line N: ...') when it uses anything the profile does not allow; imports outside the "
        "profile also fail at run time. A new sandbox keeps its profile: later calls on it may "
        "repeat the name or leave it out, not change it. Leave it out to run without one.",
    )
    output_mode: Annotated[OutputMode | None, BeforeValidator(_output_mode)] = Field(
        None,
        description="How output comes back: 'full' (everything up to the byte cap) or 'llm' "
        "(a long stdout/stderr comes back as its first and last few KB with a marker line "
        "between them saying how much was cut and where the full text was saved, e.g. "
        "'.harombe/output/call-3.stdout', also listed in the result's `output_files`; read "
        "that file with code_read_file or page it with `sed -n`). Leave it out for the "
        "configured default (security.sandbox.output_mode, 'full' unless changed).",
    )

    environment: Annotated[str | None, BeforeValidator(_environment)] = Field(
        None,
        description="A dependency environment the operator configured, e.g. 'data': a new "
        "Python sandbox starts with its packages installed (and some already imported). Only "
        "for a new sandbox (leave sandbox_id out). Leave it out for a plain sandbox.",
    )

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

    package: Annotated[str, BeforeValidator(readers.package)] = Field(
        description="One registry package with an optional version, e.g. 'requests==2.31.0' "
        "(pypi) or 'axios@1.6.0' (npm). No URLs, paths, git references or options."
    )
    registry: Annotated[Registry, BeforeValidator(readers.registry)] = Field(
        "pypi", description="Where the package comes from: 'pypi' (Python) or 'npm' (Node.js)."
    )

    @model_validator(mode="after")
    def _spec(self) -> InstallPackageArgs:
        try:
            parse_spec(self.package, self.registry)
        except HarombeError as err:
            raise refuse(str(err), type(err)) from None
        return self


class WriteFileArgs(_OnSandbox):
    """``code_write_file``."""

    tool: ClassVar[str] = "code_write_file"

    file_path: FilePath = Field(
        description="Where to write, relative to /workspace (e.g. 'data/input.csv'; "
        "'/workspace/data/input.csv' is the same). Parent directories are created. No '..', "
        "no trailing '/', no spaces or dots at the end of a name."
    )
    content: Text = Field(description="The file's text, written as UTF-8; replaces the file.")


class ReadFileArgs(_OnSandbox):
    """``code_read_file``."""

    tool: ClassVar[str] = "code_read_file"

    file_path: FilePath = Field(
        description="The file to read, relative to /workspace (e.g. 'results.txt'). With "
        "encoding 'utf-8' it must hold UTF-8 text."
    )
    encoding: Annotated[ReadEncoding, BeforeValidator(_read_encoding)] = Field(
        "utf-8",
        description="'utf-8' (the default) returns the file's text in `content`; 'base64' "
        "returns its bytes base64-encoded in `content` (for images such as a saved plot, and "
        "other binary files), with `size_bytes` and `mime_type`.",
    )


class ListFilesArgs(_OnSandbox):
    """``code_list_files``."""

    tool: ClassVar[str] = "code_list_files"

    path: DirPath = Field(
        ".",
        description="The directory to list, relative to /workspace; '.' (the default) is "
        "/workspace itself.",
    )


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
    model: type[Model],
    args: Mapping[str, Any],
    *,
    max_bytes: int | None = None,
    network_default: bool | None = None,
) -> Model:
    """``args`` validated and normalised by ``model``; otherwise the :class:`HarombeError` that
    names each bad parameter and its fix (:class:`InvalidArgumentError` unless every problem
    is of one other kind, such as :class:`WorkspacePathError` or :class:`SandboxNotFoundError`).

    ``max_bytes`` caps ``code`` and ``content`` (the manager's ``max_file_bytes``);
    ``network_default`` is the network of a new sandbox whose call leaves ``network_enabled``
    out (the config's ``network.enabled_by_default``). ``None``: the built-in defaults."""
    context = {"max_bytes": max_bytes}
    if network_default is not None:
        context["network_default"] = network_default
    try:
        return model.model_validate(dict(args), context=context)
    except ValidationError as exc:
        try:
            error = _as_error(exc, model)
        except Exception:  # noqa: BLE001 - an error that cannot be rendered is still an error
            error = InvalidArgumentError(f"the arguments of {model.tool} could not be read")
        raise error from None
    except Exception as exc:  # noqa: BLE001 - whatever a value does, the call gets an error
        # The readers take values by their base types, so this is a last line only: a
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

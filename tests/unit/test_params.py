"""Tool argument models: what is accepted and normalised, what is refused and how (no Docker)."""

import inspect
import math
from typing import Any

import pytest

from harombe.errors import (
    HarombeError,
    InvalidArgumentError,
    PackageSpecError,
    SandboxNotFoundError,
    UsageError,
    WorkspacePathError,
)
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools
from harombe.tools.params import TOOL_ARGS, parse_args

SID = "sandbox-0123456789ab"
HUGE = "x" * 10_000_000
EXEC = {"language": "python", "code": "print(1)"}

ACCEPTED: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("exec-minimal", "code_execute", EXEC, {"timeout": None, "network_enabled": False}),
    ("exec-int-timeout", "code_execute", {**EXEC, "timeout": 10}, {"timeout": 10.0}),
    ("exec-float-timeout", "code_execute", {**EXEC, "timeout": 0.5}, {"timeout": 0.5}),
    ("exec-huge-timeout", "code_execute", {**EXEC, "timeout": 1e300}, {"timeout": 1e300}),
    ("exec-network", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": ["example.com"]},
     {"network_enabled": True, "allowed_domains": ["example.com"]}),
    ("exec-domains-tuple", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": ("example.com", "*.example.org")},
     {"allowed_domains": ["example.com", "*.example.org"]}),
    ("exec-network-none-is-default", "code_execute", {**EXEC, "network_enabled": None},
     {"network_enabled": False}),
    ("exec-network-none-existing", "code_execute",
     {**EXEC, "sandbox_id": SID, "network_enabled": None}, {"network_enabled": None}),
    ("exec-domains-none", "code_execute", {**EXEC, "allowed_domains": None},
     {"allowed_domains": []}),
    ("exec-sandbox", "code_execute", {**EXEC, "sandbox_id": SID}, {"sandbox_id": SID}),
    ("exec-domains-existing", "code_execute",
     {**EXEC, "sandbox_id": SID, "allowed_domains": ["example.com"]},
     {"allowed_domains": ["example.com"]}),
    ("exec-empty-code", "code_execute", {**EXEC, "code": ""}, {"code": ""}),
    ("exec-fresh", "code_execute", {**EXEC, "fresh": True}, {"fresh": True}),
    ("exec-shell", "code_execute", {"language": "shell", "code": "ls"}, {"language": "shell"}),
    ("exec-shell-longest", "code_execute", {"language": "shell", "code": "#" * 131_071},
     {"language": "shell"}),
    ("exec-python-nul", "code_execute", {**EXEC, "code": "print('\x00')"},
     {"code": "print('\x00')"}),
    ("install-stripped", "code_install_package", {"sandbox_id": SID, "package": "  six  "},
     {"package": "six", "registry": "pypi"}),
    ("install-npm", "code_install_package",
     {"sandbox_id": SID, "package": "axios@1.6.0", "registry": "npm"}, {"registry": "npm"}),
    ("write-normalised", "code_write_file",
     {"sandbox_id": SID, "file_path": "./a//run.py", "content": "x"}, {"file_path": "a/run.py"}),
    ("write-workspace-abs", "code_write_file",
     {"sandbox_id": SID, "file_path": "/workspace/.env", "content": ""}, {"file_path": ".env"}),
    ("read", "code_read_file", {"sandbox_id": SID, "file_path": "a/b.txt"},
     {"file_path": "a/b.txt"}),
    ("list-default", "code_list_files", {"sandbox_id": SID}, {"path": "."}),
    ("list-trailing-slash", "code_list_files", {"sandbox_id": SID, "path": "data/"},
     {"path": "data"}),
    ("destroy", "code_destroy_sandbox", {"sandbox_id": SID}, {"sandbox_id": SID}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tool", "args", "expected"), [a[1:] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED]
)
def test_accepted_arguments_are_normalised(
    tool: str, args: dict[str, Any], expected: dict[str, Any]
) -> None:
    """Valid arguments come back as the exact values the gate and the manager will use."""
    parsed = parse_args(TOOL_ARGS[tool], args).model_dump()
    assert {k: parsed[k] for k in expected} == expected


REFUSED: list[tuple[str, str, dict[str, Any], type[Exception], str]] = [
    ("network-string-false", "code_execute", {**EXEC, "network_enabled": "false"},
     InvalidArgumentError, "network_enabled must be true or false (got 'false', a string)"),
    ("network-string-true", "code_execute", {**EXEC, "network_enabled": "true"},
     InvalidArgumentError, "pass a boolean"),
    ("network-int", "code_execute", {**EXEC, "network_enabled": 1},
     InvalidArgumentError, "network_enabled must be true or false"),
    ("fresh-string", "code_execute", {**EXEC, "fresh": "yes"},
     InvalidArgumentError, "fresh must be true or false"),
    ("timeout-string", "code_execute", {**EXEC, "timeout": "10"},
     InvalidArgumentError, "timeout must be a number of seconds (got '10', a string)"),
    ("timeout-nan", "code_execute", {**EXEC, "timeout": math.nan},
     InvalidArgumentError, "finite number of seconds above 0"),
    ("timeout-inf", "code_execute", {**EXEC, "timeout": math.inf},
     InvalidArgumentError, "finite"),
    ("timeout-negative", "code_execute", {**EXEC, "timeout": -1},
     InvalidArgumentError, "above 0"),
    ("timeout-zero", "code_execute", {**EXEC, "timeout": 0}, InvalidArgumentError, "above 0"),
    ("timeout-bool", "code_execute", {**EXEC, "timeout": True},
     InvalidArgumentError, "timeout must be a number"),
    ("timeout-list", "code_execute", {**EXEC, "timeout": [5]},
     InvalidArgumentError, "timeout must be a number"),
    ("code-none", "code_execute", {**EXEC, "code": None},
     InvalidArgumentError, "code is required"),
    ("code-bytes", "code_execute", {**EXEC, "code": b"print(1)"},
     InvalidArgumentError, "decode it to text"),
    ("code-surrogate", "code_execute", {**EXEC, "code": "print('\ud800')"},
     InvalidArgumentError, "lone surrogate U+D800 at character 7"),
    ("code-too-big", "code_execute", {**EXEC, "code": "x" * 65 * 2**20},
     InvalidArgumentError, "over the limit of 67108864 bytes"),
    ("shell-code-nul", "code_execute", {"language": "shell", "code": "echo a\x00b"},
     InvalidArgumentError, "NUL character at position 6"),
    ("shell-code-too-long", "code_execute", {"language": "shell", "code": "#" * 131_072},
     InvalidArgumentError, "at most 131071 bytes"),
    ("language-unknown", "code_execute", {**EXEC, "language": "ruby"},
     InvalidArgumentError, "language must be one of python, javascript, shell"),
    ("language-case", "code_execute", {**EXEC, "language": "Python"},
     InvalidArgumentError, "lower case"),
    ("language-none", "code_execute", {**EXEC, "language": None},
     InvalidArgumentError, "language must be one of"),
    ("domains-string", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": "example.com"},
     InvalidArgumentError, "write ['example.com']"),
    ("domains-no-network", "code_execute", {**EXEC, "allowed_domains": ["example.com"]},
     InvalidArgumentError, "network_enabled is false"),
    ("domains-url", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": ["https://example.com/"]},
     InvalidArgumentError, "bare host name"),
    ("domains-nested", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": [["example.com"]]},
     InvalidArgumentError, "host names"),
    ("domains-too-many", "code_execute",
     {**EXEC, "network_enabled": True, "allowed_domains": [f"h{i}.example" for i in range(300)]},
     InvalidArgumentError, "over the limit of 256"),
    ("sandbox-int", "code_execute", {**EXEC, "sandbox_id": 7},
     InvalidArgumentError, "sandbox_id must be a string"),
    ("sandbox-malformed", "code_execute", {**EXEC, "sandbox_id": "../x"},
     SandboxNotFoundError, "not a harombe sandbox id"),
    ("unknown-parameter", "code_execute", {**EXEC, "network": True},
     InvalidArgumentError, "unknown parameter 'network'"),
    ("missing-code", "code_execute", {"language": "python"},
     InvalidArgumentError, "code is required"),
    ("package-huge", "code_install_package", {"sandbox_id": SID, "package": HUGE},
     InvalidArgumentError, "over the limit of 1024"),
    ("package-int", "code_install_package", {"sandbox_id": SID, "package": 3},
     InvalidArgumentError, "package must be a string"),
    ("package-url", "code_install_package",
     {"sandbox_id": SID, "package": "https://example.invalid/x.whl"},
     PackageSpecError, "URL or path"),
    ("package-option", "code_install_package",
     {"sandbox_id": SID, "package": "--index-url=http://x"}, PackageSpecError, "option"),
    ("registry-unknown", "code_install_package",
     {"sandbox_id": SID, "package": "six", "registry": "cargo"},
     PackageSpecError, "unknown registry 'cargo'"),
    ("registry-none", "code_install_package",
     {"sandbox_id": SID, "package": "six", "registry": None},
     InvalidArgumentError, "registry must be"),
    ("write-trailing-space", "code_write_file",
     {"sandbox_id": SID, "file_path": "run.py ", "content": "x"},
     WorkspacePathError, "white space"),
    ("write-trailing-slash", "code_write_file",
     {"sandbox_id": SID, "file_path": "run.py/", "content": "x"},
     WorkspacePathError, "names a directory"),
    ("write-content-none", "code_write_file",
     {"sandbox_id": SID, "file_path": "a.txt", "content": None},
     InvalidArgumentError, "content is required"),
    ("write-content-dict", "code_write_file",
     {"sandbox_id": SID, "file_path": "a.txt", "content": {"a": 1}},
     InvalidArgumentError, "content must be a string"),
    ("write-content-surrogate", "code_write_file",
     {"sandbox_id": SID, "file_path": "a.txt", "content": "\udcff"},
     InvalidArgumentError, "lone surrogate"),
    ("write-path-int", "code_write_file", {"sandbox_id": SID, "file_path": 1, "content": "x"},
     WorkspacePathError, "must be a string"),
    ("read-env-dir", "code_read_file", {"sandbox_id": SID, "file_path": ".env/"},
     WorkspacePathError, "names a directory"),
    ("read-sandbox-none", "code_read_file", {"sandbox_id": None, "file_path": "a"},
     InvalidArgumentError, "sandbox_id is required"),
    ("list-escape", "code_list_files", {"sandbox_id": SID, "path": "../"},
     WorkspacePathError, "'..'"),
    ("destroy-list", "code_destroy_sandbox", {"sandbox_id": [SID]},
     InvalidArgumentError, "sandbox_id must be a string"),
    ("mixed-kinds", "code_write_file", {"sandbox_id": SID, "file_path": "a/", "content": None},
     InvalidArgumentError, "names a directory"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tool", "args", "kind", "needle"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refused_arguments_name_the_parameter_and_the_fix(
    tool: str, args: dict[str, Any], kind: type[Exception], needle: str
) -> None:
    """A value that cannot be read unambiguously raises one harombe error naming it."""
    with pytest.raises(kind) as info:
        parse_args(TOOL_ARGS[tool], args)
    assert type(info.value) is kind
    assert needle in str(info.value), str(info.value)
    assert len(str(info.value)) < 1200


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ("code_execute", "language"),
        ("code_execute", "sandbox_id"),
        ("code_execute", "network_enabled"),
        ("code_execute", "timeout"),
        ("code_install_package", "registry"),
        ("code_write_file", "file_path"),
        ("code_list_files", "path"),
        ("code_destroy_sandbox", "sandbox_id"),
    ],
)
def test_huge_values_are_never_echoed(tool: str, param: str) -> None:
    """A 10 MB value in any parameter comes back as a short error, not as itself."""
    base = {"code_execute": EXEC}.get(tool, {"sandbox_id": SID, "package": "six",
                                              "file_path": "a", "content": ""})  # fmt: skip
    fields = TOOL_ARGS[tool].model_fields
    args = {k: v for k, v in base.items() if k in fields} | {param: HUGE}
    with pytest.raises(HarombeError) as info:
        parse_args(TOOL_ARGS[tool], args)
    assert len(str(info.value)) < 500


def test_size_cap_follows_max_file_bytes() -> None:
    """code and content are capped at the manager's max_file_bytes, in UTF-8 bytes."""
    args = {"sandbox_id": SID, "file_path": "a", "content": "é" * 6}
    assert parse_args(TOOL_ARGS["code_write_file"], args, max_bytes=12).content == "é" * 6
    with pytest.raises(InvalidArgumentError, match="13 bytes, over the limit of 12"):
        parse_args(TOOL_ARGS["code_write_file"], {**args, "content": "é" * 6 + "x"}, max_bytes=12)


@pytest.mark.parametrize("tool", sorted(TOOL_ARGS))
def test_schemas_describe_every_parameter(tool: str) -> None:
    """Each model yields a JSON schema in which every parameter has a description."""
    schema = TOOL_ARGS[tool].model_json_schema()
    assert schema["additionalProperties"] is False
    for name, prop in schema["properties"].items():
        assert len(prop.get("description", "")) > 20, name


def test_schema_types_are_strict() -> None:
    """Booleans are booleans, timeouts numbers, languages an enum: what the validators hold."""
    props = TOOL_ARGS["code_execute"].model_json_schema()["properties"]
    assert {t.get("type") for t in props["network_enabled"]["anyOf"]} == {"boolean", "null"}
    assert props["language"]["enum"] == ["python", "javascript", "shell"]
    assert {t.get("type") for t in props["timeout"]["anyOf"]} == {"number", "null"}
    assert props["allowed_domains"]["items"]["type"] == "string"


PYTHON_ONLY = {"self", "on_output", "on_progress"}


@pytest.mark.parametrize("tool", sorted(TOOL_ARGS))
def test_tool_signatures_match_their_models(tool: str) -> None:
    """Every tool (code_execute_stream too) takes exactly its model's parameters and defaults."""
    signature = inspect.signature(getattr(CodeExecutionTools, tool))
    params = {n: p for n, p in signature.parameters.items() if n not in PYTHON_ONLY}
    fields = TOOL_ARGS[tool].model_fields
    assert list(params) == list(fields)
    for name, field in fields.items():
        default = params[name].default
        if field.is_required():
            assert default is inspect.Parameter.empty, name
        elif name == "allowed_domains":
            assert default is None and field.get_default(call_default_factory=True) == []
        else:
            assert default == field.default, name


def test_stream_takes_code_executes_parameters() -> None:
    """code_execute_stream's parameters are code_execute's, defaults included (but on_output,
    which the stream makes itself); a call the signature refuses is a TypeError."""
    execute = inspect.signature(CodeExecutionTools.code_execute).parameters
    stream = inspect.signature(CodeExecutionTools.code_execute_stream).parameters
    assert list(stream) == [name for name in execute if name != "on_output"]
    for name, param in stream.items():
        shown = execute[name]
        assert (param.kind, param.default, param.annotation) == (
            shown.kind,
            shown.default,
            shown.annotation,
        ), name


async def test_stream_refuses_what_code_execute_would() -> None:
    """Unknown, missing and on_output arguments fail the stream as they fail a function."""
    tools = CodeExecutionTools(SandboxManager(DockerManager()), hitl_gate=None)
    for call in (
        lambda: tools.code_execute_stream("python", "1", on_output=print),  # type: ignore[call-arg]
        lambda: tools.code_execute_stream("python"),  # type: ignore[call-arg]
        lambda: tools.code_execute_stream("python", "1", network=True),  # type: ignore[call-arg]
    ):
        with pytest.raises(TypeError):
            await call().__anext__()


@pytest.mark.parametrize(
    ("default", "args", "expected"),
    [
        (True, {}, True),
        (True, {"network_enabled": False}, False),
        (False, {"network_enabled": True}, True),
        (True, {"sandbox_id": SID}, None),
        (True, {"allowed_domains": ["example.com"]}, True),
    ],
    ids=["default-on", "explicit-off", "explicit-on", "existing-keeps-its-own", "domains-ok"],
)
def test_network_default_comes_from_the_config(
    default: bool, args: dict[str, Any], expected: bool | None
) -> None:
    """network_enabled left out is network.enabled_by_default for a new sandbox only."""
    parsed = parse_args(TOOL_ARGS["code_execute"], {**EXEC, **args}, network_default=default)
    assert parsed.network_enabled is expected  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("limits", "timeout", "expected", "warned"),
    [
        ({"max_execution_time": 60}, None, 60.0, False),
        ({"max_execution_time": 60}, 120, 120.0, False),
        ({"max_execution_time": 60}, 600, 600.0, False),
        ({"max_execution_time": 60}, 601, 600.0, True),
        ({"max_execution_time": 60}, 1e300, 600.0, True),
        ({"max_execution_time": 900}, None, 900.0, False),
        ({"max_execution_time": 900}, 1000, 900.0, True),
        ({}, 0.25, 0.25, False),
    ],
    ids=["default", "guide-120-over-60", "at-ceiling", "over-ceiling", "absurd", "default-lifts-"
         "ceiling", "over-lifted-ceiling", "short"],
)  # fmt: skip
def test_effective_timeout(
    limits: dict[str, Any], timeout: float | None, expected: float, warned: bool
) -> None:
    """Per-call timeouts may exceed the default up to max_timeout_s; beyond it, capped + warned."""
    manager = SandboxManager(DockerManager(), **limits)
    got, warnings = manager.effective_timeout(timeout)
    assert got == expected
    assert bool(warnings) == warned
    if warned:
        assert "capped to max_timeout_s" in warnings[0]


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, 0, "5", True], ids=repr)
def test_effective_timeout_refuses_what_is_not_a_duration(timeout: Any) -> None:
    """The manager's own check refuses the same values the tools refuse."""
    with pytest.raises(UsageError, match="finite number of seconds above 0"):
        SandboxManager(DockerManager()).effective_timeout(timeout)

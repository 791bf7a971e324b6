"""The seeds' call styles, without Docker: pctx-sandbox's errors imported from ``harombe``,
sandbubble's config object first and its result read by attribute."""

from __future__ import annotations

import copy
import inspect
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import harombe
from harombe import errors
from harombe.config import parse_config
from harombe.errors import UsageError
from harombe.mounts import run_sandboxed, run_sandboxed_async
from harombe.mounts_compat import (
    RunResult,
    SandboxConfig,
    get_default_sandbox_config,
    read_call,
    venv_requirements,
)

ERRORS = sorted(
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.HarombeError)
)


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_importable_from_harombe(name: str) -> None:
    """``from harombe import SandboxExecutionError`` (pctx's import) for every harombe error:
    whatever a decorated call or run_sandboxed raises can be caught by that name."""
    assert getattr(harombe, name) is getattr(errors, name)


def test_pctx_imports_work_as_written() -> None:
    """pctx-sandbox's names, imported from harombe in one line, are the decorator's."""
    from harombe import (
        DependencyInstallError,
        SandboxExecutionError,
        SandboxStartupError,
        SandboxTimeoutError,
        SerializationError,
        sandbox,
        sandbox_async,
    )

    assert issubclass(SandboxTimeoutError, SandboxExecutionError)
    for error in (DependencyInstallError, SandboxStartupError, SerializationError):
        assert getattr(errors, error.__name__) is error
    assert callable(sandbox) and callable(sandbox_async)


def test_importing_the_errors_stays_light() -> None:
    """The errors and sandbubble's config come without the sandbox manager or the decorator."""
    code = (
        "import sys\nfrom harombe import SandboxExecutionError, SandboxConfig, "
        "get_default_sandbox_config\nheavy = [m for m in ('harombe.mounts', 'harombe.decorator', "
        "'harombe.security.runtime.manager') if m in sys.modules]\nprint(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


RESULT = {"success": True, "exit_code": 0, "stdout": "hi\n", "stderr": "", "status": "ok",
          "refused": [], "mount_error": None, "warnings": []}  # fmt: skip


def test_a_run_result_reads_as_attributes_and_as_the_dict() -> None:
    """``res.returncode``/``res.stdout`` as sandbubble's, ``res["stdout"]`` as before; equal to
    the dict, JSON as the dict, the same keys."""
    res = RunResult(RESULT)
    assert (res.returncode, res.stdout, res.stderr, res.status) == (0, "hi\n", "", "ok")
    assert res["stdout"] == "hi\n" and res == RESULT and dict(res) == RESULT
    assert list(res.keys()) == list(RESULT) and "returncode" not in res
    assert json.loads(json.dumps(res)) == RESULT and json.dumps(dict(res)) == json.dumps(RESULT)
    assert "stdout" in dir(res) and "returncode" in dir(res)


def test_a_run_result_copies_and_pickles_as_itself() -> None:
    """copy, deepcopy and pickle keep the type and the keys."""
    res = RunResult(RESULT)
    for again in (copy.copy(res), copy.deepcopy(res), pickle.loads(pickle.dumps(res))):
        assert type(again) is RunResult and again == res and again.stdout == "hi\n"


def test_a_missing_attribute_names_the_keys() -> None:
    """An attribute that is no key is an AttributeError listing the keys there are."""
    with pytest.raises(AttributeError, match=r"no 'returncod'.*exit_code"):
        _ = RunResult(RESULT).returncod


@pytest.mark.parametrize(("exit_code", "returncode"), [(3, 3), (None, None), (-1, -1)])
def test_returncode_is_the_exit_code(exit_code: object, returncode: object) -> None:
    """``returncode`` is ``exit_code``; ``None`` when nothing ran."""
    assert RunResult({"exit_code": exit_code}).returncode == returncode


def test_the_config_is_positional_only() -> None:
    """The first parameter is the config, positional only: a config and code=... never give
    "multiple values for argument 'code'"."""
    for func in (run_sandboxed, run_sandboxed_async):
        first, second = list(inspect.signature(func).parameters.values())[:2]
        assert (first.name, first.kind) == ("conf", inspect.Parameter.POSITIONAL_ONLY)
        assert second.name == "code"


def read(conf: object, code: str | None = "print(1)", **kw: Any) -> Any:
    kw.setdefault("config", None)
    kw.setdefault("network", False)
    kw.setdefault("allowed_domains", ())
    return read_call(conf, code, **kw)


def test_the_default_config_has_no_network_and_nothing_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """get_default_sandbox_config(): no network, no packages, no warnings."""
    monkeypatch.delenv("CODEEXEC_SANDBOX_VENV", raising=False)
    monkeypatch.delenv("CODEEXEC_SANDBOX_AA_PROFILE_NAME", raising=False)
    call = read(get_default_sandbox_config())
    assert (call.code, call.network, call.allowed_domains) == ("print(1)", False, ())
    assert (call.dependencies, call.warnings, call.config) == ((), (), None)


def test_the_default_config_reads_sandbubbles_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CODEEXEC_SANDBOX_VENV and CODEEXEC_SANDBOX_AA_PROFILE_NAME fill the default config."""
    monkeypatch.setenv("CODEEXEC_SANDBOX_VENV", str(tmp_path))
    monkeypatch.setenv("CODEEXEC_SANDBOX_AA_PROFILE_NAME", "my_sandbox_profile")
    conf = get_default_sandbox_config()
    assert (conf.venv_path, conf.apparmor_profile_name) == (str(tmp_path), "my_sandbox_profile")


def test_code_as_the_first_argument_still_works() -> None:
    """``run_sandboxed("print(1)")``: a string first is the code, as before configs."""
    assert read("print(2)", code=None).code == "print(2)"
    with pytest.raises(UsageError, match="code twice"):
        read("print(2)", code="print(3)")


def test_a_harombe_config_may_come_first() -> None:
    """A HarombeConfig first is the config; two configs are refused."""
    cfg = parse_config({})
    assert read(cfg).config is cfg
    with pytest.raises(UsageError, match="two harombe configs"):
        read(cfg, config=cfg)


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        (SandboxConfig(enable_network=True), r"whole network.*allowed_domains=\['api"),
        (SandboxConfig(allowed_domains=["example.com"]), "enable_network=True"),
        (SandboxConfig(enable_network=True, allowed_domains="example.com"), r"\['example.com'\]"),
        (SandboxConfig(venv_path="/path/to/venv"), "not a virtualenv.*leave venv_path out"),
        ({"enable_network": False}, "harombe.SandboxConfig"),
    ],
    ids=["network-without-hosts", "hosts-without-network", "hosts-as-text", "no-venv", "a-dict"],
)
def test_what_cannot_be_honoured_is_refused_with_the_fix(conf: object, match: str) -> None:
    """A field harombe cannot honour is a UsageError naming what to write instead."""
    with pytest.raises(UsageError, match=match):
        read(conf)


def test_network_is_the_listed_hosts() -> None:
    """enable_network with allowed_domains: the sandbox's network, limited to those hosts."""
    call = read(SandboxConfig(enable_network=True, allowed_domains=["api.example.com"]))
    assert (call.network, call.allowed_domains) == (True, ("api.example.com",))


def test_limits_become_the_configs() -> None:
    """memory_mb and cpus become the sandbox limits of the run's own manager."""
    cfg = parse_config({})
    call = read(SandboxConfig(memory_mb=256, cpus=0.25, config=cfg))
    limits = call.config.security.sandbox.limits
    assert (limits.max_memory_mb, limits.max_cpu_cores, call.limited) == (256, 0.25, True)


async def test_limits_with_a_started_manager_are_refused() -> None:
    """memory_mb cannot change a manager already started: refused before anything runs."""
    with pytest.raises(UsageError, match="memory_mb and cpus"):
        await run_sandboxed_async(SandboxConfig(memory_mb=256), code="1", manager=object())  # type: ignore[arg-type]


def test_an_apparmor_profile_is_reported_not_dropped() -> None:
    """apparmor_profile_name has nothing to confine in gVisor: the result's warnings say so."""
    (warning,) = read(SandboxConfig(apparmor_profile_name="my_sandbox_profile")).warnings
    assert "'my_sandbox_profile' is not used" in warning and "gVisor" in warning


def _venv(root: Path, *dists: tuple[str, str]) -> Path:
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_a_venvs_packages_become_pinned_dependencies(tmp_path: Path) -> None:
    """venv_path: its packages pinned to their versions, pip and setuptools left out."""
    venv = _venv(tmp_path, ("toml", "0.10.2"), ("pip", "24.0"), ("setuptools", "69.0"),
                 ("Six", "1.16.0"))  # fmt: skip
    assert venv_requirements(venv) == ("Six==1.16.0", "toml==0.10.2")
    assert read(SandboxConfig(venv_path=venv)).dependencies == ("Six==1.16.0", "toml==0.10.2")


def test_an_empty_venv_installs_nothing(tmp_path: Path) -> None:
    """A venv with only its tools adds no dependencies."""
    assert venv_requirements(_venv(tmp_path, ("pip", "24.0"))) == ()


def test_a_star_import_gives_every_public_name() -> None:
    """``from harombe import *`` brings every error, the run functions and sandbubble's config,
    and none of the package's internals."""
    names: dict[str, Any] = {}
    exec("from harombe import *", names)  # the import statement under test
    wanted = {*ERRORS, "run_sandboxed", "SandboxConfig", "get_default_sandbox_config", "sandbox"}
    assert wanted <= set(names)
    assert not {"TYPE_CHECKING", "logs", "config"} & set(names)


def test_dir_lists_the_lazy_names() -> None:
    """``dir(harombe)`` (and so completion) shows the names imported on first use."""
    shown = dir(harombe)
    assert {*ERRORS, "run_sandboxed", "RunResult", "sandbox"} <= set(shown)


class _Flipping(SandboxConfig):
    """A config whose ``enable_network`` reads False, then True, then False, …"""

    reads = 0

    @property  # type: ignore[override]
    def enable_network(self) -> bool:
        type(self).reads += 1
        return type(self).reads % 2 == 0

    @enable_network.setter
    def enable_network(self, value: bool) -> None:
        pass


def test_each_field_is_read_once() -> None:
    """A config whose fields change between reads is judged on one reading: a network that
    read off for the checks is not on for the run."""
    _Flipping.reads = 0
    call = read(_Flipping())
    assert (call.network, call.allowed_domains) == (False, ())


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        (SandboxConfig(enable_network="false", allowed_domains=["api.example.com"]),  # type: ignore[arg-type]
         r"enable_network must be True or False.*'false'"),
        (SandboxConfig(enable_network=1, allowed_domains=["api.example.com"]),  # type: ignore[arg-type]
         r"enable_network must be True or False"),
        (SandboxConfig(enable_network=True, allowed_domains=[1]),  # type: ignore[list-item]
         r"allowed_domains.*host names.*int"),
        (SandboxConfig(venv_path=5), r"venv_path.*a path.*int"),  # type: ignore[arg-type]
        (SandboxConfig(apparmor_profile_name=3), r"apparmor_profile_name.*int"),  # type: ignore[arg-type]
        (SandboxConfig(memory_mb=-1), r"SandboxConfig\.memory_mb.*32"),
        (SandboxConfig(memory_mb=float("nan")), r"SandboxConfig\.memory_mb"),  # type: ignore[arg-type]
        (SandboxConfig(memory_mb=True), r"SandboxConfig\.memory_mb.*bool"),
        (SandboxConfig(memory_mb=10**13), r"SandboxConfig\.memory_mb.*less than or equal"),
        (SandboxConfig(cpus=float("nan")), r"SandboxConfig\.cpus"),
        (SandboxConfig(cpus=10**6), r"SandboxConfig\.cpus.*64"),
        (SandboxConfig(cpus="2"), r"SandboxConfig\.cpus.*str"),  # type: ignore[arg-type]
        (SandboxConfig(config={"security": {}}), r"SandboxConfig\.config.*HarombeConfig"),  # type: ignore[arg-type]
    ],
    ids=["network-as-text", "network-as-int", "host-not-text", "venv-not-a-path",
         "apparmor-not-text", "memory-negative", "memory-nan", "memory-bool", "memory-huge",
         "cpus-nan", "cpus-huge", "cpus-as-text", "config-a-dict"],
)  # fmt: skip
def test_a_field_of_the_wrong_type_or_range_is_a_usage_error(conf: object, match: str) -> None:
    """Every SandboxConfig field is checked before use: a wrong type or range is a UsageError
    naming the field (a truthy string never turns the network on)."""
    with pytest.raises(UsageError, match=match):
        read(conf)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"allowed_domains": "api.example.com"}, r"\['api.example.com'\]"),
        ({"network": "no"}, r"network must be True or False"),
    ],
    ids=["hosts-as-text", "network-as-text"],
)
def test_run_arguments_of_the_wrong_type_are_usage_errors(kw: dict[str, Any], match: str) -> None:
    """run_sandboxed's own network arguments are checked the same way: one host name given as
    text is not split into characters, a truthy string is not a network."""
    with pytest.raises(UsageError, match=match):
        read(None, **kw)


@pytest.mark.parametrize(
    ("direct_url", "version", "shown"),
    [
        ('{"url": "file:///src/mycorp-utils", "dir_info": {"editable": true}}', "1.2.0",
         "editable"),
        ('{"url": "file:///src/mycorp_utils-1.2.0-py3-none-any.whl", "archive_info": {}}',
         "1.2.0", "file:"),
        ('{"url": "https://git.example.org/mycorp-utils", "vcs_info": {"vcs": "git"}}', "1.2.0",
         "git"),
        (None, "1.2.0+corp", "local version"),
    ],
    ids=["editable", "local-wheel", "vcs", "local-version"],
)  # fmt: skip
def test_a_package_not_from_an_index_is_refused_not_fetched_by_name(
    tmp_path: Path, direct_url: str | None, version: str, shown: str
) -> None:
    """A venv package installed from a directory, a file, a VCS URL, or with a local version
    is not pinned by name: fetching ``mycorp-utils==1.2.0`` from the public index would run
    whatever someone published under that name. The UsageError names the package and why."""
    venv = _venv(tmp_path, ("toml", "0.10.2"), ("mycorp-utils", version))
    if direct_url is not None:
        site = venv / "lib" / "python3.12" / "site-packages"
        (site / f"mycorp_utils-{version}.dist-info" / "direct_url.json").write_text(direct_url)
    with pytest.raises(UsageError, match=rf"not from a package index: mycorp-utils \(.*{shown}"):
        venv_requirements(venv)


def test_a_result_with_keys_of_any_type_still_copies() -> None:
    """A key the caller adds that is not text (``res[1] = ...``) leaves attribute reads, copies
    and pickles working: a missing attribute is still an AttributeError."""
    res = RunResult(RESULT)
    res[1] = "one"
    assert not hasattr(res, "nope")
    assert copy.deepcopy(res) == res and pickle.loads(pickle.dumps(res)) == res
    assert "stdout" in dir(res)

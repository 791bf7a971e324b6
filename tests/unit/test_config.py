"""Configuration: the guide's schema, strict keys, environment and constructor precedence."""

from pathlib import Path

import pytest

from harombe.config import DEFAULT_IMAGE, env_overrides, load_config, override, parse_config
from harombe.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_yaml_loads_with_the_guides_defaults() -> None:
    """config/harombe.yaml parses and carries the guide's default limits."""
    config = load_config(REPO / "config" / "harombe.yaml", environ={})
    sandbox = config.security.sandbox
    assert sandbox.runtime == "runsc"
    assert sandbox.limits.max_memory_mb == 512
    assert sandbox.limits.max_cpu_cores == 0.5
    assert sandbox.limits.max_disk_mb == 1024
    assert sandbox.limits.max_execution_time == 30
    assert sandbox.limits.max_output_bytes == 1_048_576
    assert sandbox.network.enabled_by_default is False
    assert config.security.hitl.enabled is True
    assert config.security.hitl.auto_approve_low_risk is True
    assert set(sandbox.languages) == {"python", "javascript", "shell"}


def test_defaults_without_any_file() -> None:
    """With no file and no environment, the built-in defaults apply."""
    config = load_config(environ={})
    assert config.security.sandbox.image_for("python") == DEFAULT_IMAGE


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"security": {"sandbox": {"limts": {}}}}, "unknown key 'security.sandbox.limts'"),
        ({"security": {"sandbox": {"limits": {"max_memroy_mb": 1}}}}, "max_memroy_mb"),
        ({"security": {"hitll": {}}}, "valid keys there are sandbox, hitl"),
        (
            {"security": {"sandbox": {"languages": {"python": {"imag": "x"}}}}},
            "languages.python.imag",
        ),
        ({"security": {"sandbox": {"languages": {"ruby": {"image": "x"}}}}}, "ruby"),
        ({"security": {"sandbox": {"limits": {"max_memory_mb": "lots"}}}}, "max_memory_mb"),
        ({"security": {"sandbox": {"limits": {"max_cpu_cores": 0}}}}, "max_cpu_cores"),
    ],
    ids=[
        "misspelt-section",
        "misspelt-limit",
        "lists-valid-keys",
        "nested-language",
        "unknown-language",
        "wrong-type",
        "out-of-range",
    ],
)
def test_bad_config_is_rejected_naming_the_key(data: dict, needle: str) -> None:
    """Unknown keys and bad values fail with a message that names them."""
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert needle in str(info.value)


def test_environment_overrides_file(tmp_path: Path) -> None:
    """HAROMBE__A__B variables override the YAML file, parsed as YAML scalars."""
    file = tmp_path / "h.yaml"
    file.write_text("security:\n  sandbox:\n    limits:\n      max_memory_mb: 256\n")
    env = {
        "HAROMBE__SECURITY__SANDBOX__LIMITS__MAX_MEMORY_MB": "1024",
        "HAROMBE__SECURITY__HITL__ENABLED": "false",
        "UNRELATED": "x",
    }
    config = load_config(file, environ=env)
    assert config.security.sandbox.limits.max_memory_mb == 1024
    assert config.security.hitl.enabled is False


def test_config_path_from_environment(tmp_path: Path) -> None:
    """$HAROMBE_CONFIG names the file when no path is given."""
    file = tmp_path / "h.yaml"
    file.write_text("security:\n  sandbox:\n    runtime: runsc-custom\n")
    assert (
        load_config(environ={"HAROMBE_CONFIG": str(file)}).security.sandbox.runtime
        == "runsc-custom"
    )


def test_unknown_key_in_environment_is_rejected() -> None:
    """A misspelt environment override fails like a misspelt YAML key."""
    with pytest.raises(ConfigError, match="max_memroy_mb"):
        load_config(environ={"HAROMBE__SECURITY__SANDBOX__LIMITS__MAX_MEMROY_MB": "1"})


def test_constructor_arguments_override_everything() -> None:
    """override() replaces limits and runtime; None leaves a value alone."""
    base = load_config(environ={"HAROMBE__SECURITY__SANDBOX__LIMITS__MAX_MEMORY_MB": "256"})
    config = override(base, max_memory_mb=2048, runtime="runsc", max_disk_mb=None)
    assert config.security.sandbox.limits.max_memory_mb == 2048
    assert config.security.sandbox.limits.max_disk_mb == 1024


@pytest.mark.parametrize(
    ("text", "error"),
    [("missing.yaml", "does not exist"), ("list.yaml", "mapping"), ("bad.yaml", "not valid YAML")],
    ids=["missing", "not-a-mapping", "broken-yaml"],
)
def test_unreadable_files_say_why(tmp_path: Path, text: str, error: str) -> None:
    """Missing, non-mapping and broken files give a ConfigError that says which."""
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "bad.yaml").write_text("security: [\n")
    with pytest.raises(ConfigError, match=error):
        load_config(tmp_path / text, environ={})


def test_env_override_tree() -> None:
    """Nested names become nested keys; values are typed."""
    assert env_overrides({"HAROMBE__A__B": "3", "HAROMBE__A__C": "[1, 2]"}) == {
        "a": {"b": 3, "c": [1, 2]}
    }


def test_timeout_ceiling_defaults_to_600_seconds() -> None:
    """max_timeout_s, the hard ceiling on per-call timeouts, is 600 s unless configured."""
    limits = load_config(REPO / "config" / "harombe.yaml", environ={}).security.sandbox.limits
    assert limits.max_timeout_s == 600 and limits.max_execution_time == 30


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({"max_execution_time": 60, "max_timeout_s": 30}, "max_timeout_s (30) is below"),
        ({"max_execution_time": 700}, "max_timeout_s (600) is below max_execution_time (700)"),
        ({"max_execution_time": float("nan")}, "max_execution_time"),
        ({"max_execution_time": float("inf")}, "max_execution_time"),
        ({"max_timeout_s": float("inf")}, "max_timeout_s"),
        ({"max_timeout_s": 0}, "max_timeout_s"),
    ],
    ids=["ceiling-below-default", "default-above-ceiling", "nan", "inf", "inf-ceiling", "zero"],
)
def test_bad_timeouts_in_config_are_refused(limits: dict, needle: str) -> None:
    """The ceiling must cover the default, and no limit may be NaN or infinite."""
    with pytest.raises(ConfigError) as info:
        parse_config({"security": {"sandbox": {"limits": limits}}})
    assert needle in str(info.value)


@pytest.mark.parametrize("key", ["max_memory_mb", "max_disk_mb"])
def test_sizes_beyond_what_docker_takes_are_refused_by_the_config(key: str) -> None:
    """A memory or disk size of 10**13 MB (more than Docker's int64 of bytes) is a ConfigError
    naming the key, not a failed Docker call at the first sandbox."""
    with pytest.raises(ConfigError, match=rf"{key}.*less than or equal"):
        parse_config({"security": {"sandbox": {"limits": {key: 10**13}}}})


def test_constructor_default_above_the_ceiling_lifts_it() -> None:
    """SandboxManager(max_execution_time=900) means 900 s is allowed: the ceiling follows."""
    config = override(load_config(environ={}), max_execution_time=900)
    assert config.security.sandbox.limits.max_timeout_s == 900
    kept = override(load_config(environ={}), max_execution_time=60)
    assert kept.security.sandbox.limits.max_timeout_s == 600
    with pytest.raises(ConfigError, match="below"):
        override(load_config(environ={}), max_execution_time=900, max_timeout_s=100)


def test_allowed_registries_are_read_as_urls() -> None:
    """pypi lists index URLs (first: the index), npm one registry; empty: the machine's own."""
    urls = ["https://mirror.example/simple", "http://extra.example/simple"]
    network = {"allowed_registries": {"pypi": urls}}
    config = parse_config({"security": {"sandbox": {"network": network}}})
    network = config.security.sandbox.network
    assert network.registry_urls("pypi") == (
        "https://mirror.example/simple",
        "http://extra.example/simple",
    )
    assert network.registry_urls("npm") == ()
    assert load_config(environ={}).security.sandbox.network.registry_urls("pypi") == ()


@pytest.mark.parametrize(
    ("registries", "needle"),
    [
        ({"npm": ["https://a.example/", "https://b.example/"]}, "npm takes one registry"),
        ({"pypi": ["ftp://mirror.example/simple"]}, "neither an http(s) URL nor a host name"),
        ({"pypi": ["/srv/wheels"]}, "neither an http(s) URL nor a host name"),
        ({"pypi": ["https://mirror.example/a b"]}, "neither an http(s) URL nor a host name"),
        ({"pypi": ["https://"]}, "neither an http(s) URL nor a host name"),
        ({"cargo": ["https://crates.example/"]}, "allowed_registries.cargo"),
    ],
    ids=["two-npm", "ftp", "path", "space", "no-host", "unknown-registry"],
)
def test_bad_registry_urls_are_refused(registries: dict, needle: str) -> None:
    """A registry entry pip or npm could not use as given is a ConfigError naming it."""
    data = {"security": {"sandbox": {"network": {"allowed_registries": registries}}}}
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_config(data)


@pytest.mark.parametrize(
    ("user", "ok"),
    [("1000:1000", True), ("2147483646:1", True), ("2147483647:1", False),
     ("1:2147483647", False), ("0:1000", False), ("1000:0", False), ("root", False),
     ("", False), ("1000", False), ("1:2:3", False), ("١٠٠٠:١٠٠٠", False)],
    ids=["default", "largest-uid", "uid-2^31-1", "gid-2^31-1", "root-uid", "root-gid", "name",
         "empty", "no-gid", "three-parts", "arabic-digits"],
)  # fmt: skip
def test_the_sandbox_user_is_numeric_below_2_31_and_never_root(user: str, ok: bool) -> None:
    """security.sandbox.user is 'uid:gid' in ASCII digits, neither 0, both below 2**31 - 1."""
    data = {"security": {"sandbox": {"user": user}}}
    if ok:
        assert parse_config(data).security.sandbox.user == user
    else:
        with pytest.raises(ConfigError, match=r"security\.sandbox\.user"):
            parse_config(data)


@pytest.mark.parametrize(
    ("urls", "ok"),
    [([f"https://m.example/{'a' * (2048 - 18)}"], True),
     ([f"https://m.example/{'a' * (2049 - 18)}"], False),
     ([f"https://m{i}.example/simple" for i in range(16)], True),
     ([f"https://m{i}.example/simple" for i in range(17)], False)],
    ids=["url-2048", "url-2049", "16-urls", "17-urls"],
)  # fmt: skip
def test_registry_urls_are_capped_at_2048_characters_and_16_entries(
    urls: list[str], ok: bool
) -> None:
    """A registry URL may be 2048 characters long and a registry may list 16, not more."""
    assert len(urls[0]) in (2048, 2049) or len(urls) in (16, 17)
    data = {"security": {"sandbox": {"network": {"allowed_registries": {"pypi": urls}}}}}
    if ok:
        assert parse_config(data).security.sandbox.network.registry_urls("pypi") == tuple(urls)
    else:
        with pytest.raises(ConfigError, match=r"allowed_registries\.pypi"):
            parse_config(data)

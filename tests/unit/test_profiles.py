"""Profiles: the shipped ones say what the spec says, extends resolves (chains, allowed vs
additional, inherited keys), every malformed document is a ConfigError naming the fix, the
describe/runtime shapes and the fingerprint; and reading them from disk."""

from __future__ import annotations

import asyncio
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harombe.errors import ConfigError
from harombe.profile_files import MAX_PROFILE_BYTES, MAX_PROFILE_DEPTH, read_profile_documents
from harombe.security.policy.profile_values import kind, short
from harombe.security.policy.profiles import Profile, import_warnings, resolve_profiles
from harombe.testing import capture_events
from harombe.tools.profiles import resolve_documents, scan

MINIMAL_IMPORTS = ["collections", "csv", "datetime", "decimal", "fractions", "functools",
                   "itertools", "json", "math", "operator", "random", "re", "statistics",
                   "string", "textwrap", "typing"]  # fmt: skip
DATA_SCIENCE_BLOCKLIST = [
    ("numpy", "ctypeslib"), ("numpy", "frompyfunc"), ("pandas", "read_pickle"),
    ("pandas", "read_sql"), ("pandas", "read_sql_query"), ("pandas", "read_sql_table"),
    ("pandas", "read_html"), ("pandas", "read_fwf"), ("pandas", "read_clipboard"),
    ("pandas", "read_excel"), ("pandas", "read_feather"), ("pandas", "read_parquet"),
    ("pandas", "read_orc"), ("pandas", "read_sas"), ("pandas", "read_spss"),
    ("pandas", "read_stata"), ("pandas", "read_gbq"), ("pandas", "read_hdf"),
    ("pandas.compat", "pickle_compat"), ("scipy.io", "loadmat"), ("scipy.io", "savemat"),
    ("scipy.io", "mmread"), ("scipy.io", "mmwrite"),
]  # fmt: skip


def shipped() -> dict[str, Profile]:
    return resolve_profiles(read_profile_documents(None))


def resolve(**documents: Any) -> dict[str, Profile]:
    """Resolve ``documents`` beside a small root profile ``base`` (math and json)."""
    return resolve_profiles({"base": {"imports": {"allowed": ["math", "json"]}}, **documents})


# -- shipped profiles ---------------------------------------------------------------------


def test_minimal_is_the_spec_minimal() -> None:
    """minimal: the spec's sixteen modules, 256 Mi, no blocklist, no preimports, both scans."""
    minimal = shipped()["minimal"]
    assert list(minimal.allowed_imports) == MINIMAL_IMPORTS
    assert minimal.blocklist == ()
    assert minimal.preimport == ()
    assert minimal.resources.model_dump() == {
        "memory_mb": 256, "cpu": 0.5, "timeout_max_s": 30.0, "subprocess_memory_mb": 512,
    }  # fmt: skip
    assert (minimal.scan_pre, minimal.scan_post) == (("ast_scan", "blocklist_audit"), ())
    assert [minimal.mode(layer) for layer in ("ast_scan", "blocklist_audit", "runtime")] == [
        "enforce", "enforce", "enforce",
    ]  # fmt: skip


def test_data_science_extends_minimal_as_the_spec_says() -> None:
    """data-science: minimal plus numpy/pandas/scipy (preimported), the spec's blocklist,
    512 Mi, and minimal's other resources and stages."""
    science = shipped()["data-science"]
    assert list(science.allowed_imports) == sorted([*MINIMAL_IMPORTS, "numpy", "pandas", "scipy"])
    assert list(science.blocklist) == DATA_SCIENCE_BLOCKLIST
    assert science.preimport == ("numpy", "pandas", "scipy")
    assert science.resources.model_dump() == {
        "memory_mb": 512, "cpu": 0.5, "timeout_max_s": 30.0, "subprocess_memory_mb": 512,
    }  # fmt: skip
    assert science.scan_pre == ("ast_scan", "blocklist_audit")


def test_describe_is_the_get_profile_body() -> None:
    """describe() is exactly the sidecar's GET /profile shape."""
    described = shipped()["data-science"].describe()
    assert list(described) == [
        "name", "description", "allowed_imports", "blocklist_entries", "scan_stages",
    ]  # fmt: skip
    assert described["name"] == "data-science"
    assert described["description"].startswith("Data analysis and scientific computing")
    assert described["allowed_imports"] == sorted(described["allowed_imports"])
    assert described["blocklist_entries"] == 23
    assert described["scan_stages"] == {"pre": ["ast_scan", "blocklist_audit"], "post": []}


def test_runtime_spec_is_json_data_for_the_sandbox() -> None:
    """runtime_spec() has the four keys the in-sandbox layer reads, as lists."""
    spec = shipped()["data-science"].runtime_spec()
    assert spec["preimport"] == ["numpy", "pandas", "scipy"]
    assert spec["subprocess_memory_mb"] == 512
    assert spec["blocklist"][0] == ["numpy", "ctypeslib"]
    assert "numpy" in spec["allowed_imports"]
    assert set(spec) == {"allowed_imports", "preimport", "subprocess_memory_mb", "blocklist"}


# -- fingerprint --------------------------------------------------------------------------


def test_the_fingerprint_is_stable() -> None:
    """Twelve hex digits, the same for the same content resolved twice."""
    first, second = shipped()["data-science"], shipped()["data-science"]
    assert re.fullmatch(r"[0-9a-f]{12}", first.fingerprint())
    assert first.fingerprint() == second.fingerprint()
    assert first == second and hash(first) == hash(second)


CHANGES = [
    ("description", {"description": "other"}),
    ("imports", {"imports": {"additional": ["re"]}}),
    ("blocklist", {"blocklist": [["math", "pi"]]}),
    ("memory", {"resources": {"memory": "128Mi"}}),
    ("timeout", {"resources": {"timeout_max": 5}}),
    ("stages", {"scan_stages": {"pre": ["ast_scan"]}}),
    ("preimport", {"preimport": ["math"]}),
    ("audit", {"audit": {"mode": {"runtime": "observe"}}}),
]


@pytest.mark.parametrize("change", [c for _, c in CHANGES], ids=[i for i, _ in CHANGES])
def test_the_fingerprint_changes_with_content(change: dict[str, Any]) -> None:
    """Any change of content gives another fingerprint (pools of the two never mix)."""
    profiles = resolve(plain={"extends": "base"}, changed={"extends": "base", **change})
    plain = profiles["plain"].model_copy(update={"name": "changed"})
    assert plain.fingerprint() != profiles["changed"].fingerprint()


def test_the_profile_is_immutable() -> None:
    """A resolved profile cannot be changed in place."""
    minimal = shipped()["minimal"]
    with pytest.raises(ValidationError):
        minimal.name = "x"  # type: ignore[misc]


# -- extends ------------------------------------------------------------------------------


def test_extends_chains_accumulate() -> None:
    """c extends b extends base: imports added at each step, blocklists appended in order."""
    profiles = resolve(
        b={"extends": "base", "imports": {"additional": ["re"]}, "blocklist": [["re", "sub"]]},
        c={"extends": "b", "imports": {"additional": ["csv"]}, "blocklist": [["csv", "writer"]]},
    )
    assert profiles["c"].allowed_imports == ("csv", "json", "math", "re")
    assert profiles["c"].blocklist == (("re", "sub"), ("csv", "writer"))


IMPORTS = [
    ("allowed-replaces", {"allowed": ["re"]}, ("re",)),
    ("additional-adds", {"additional": ["re"]}, ("json", "math", "re")),
    ("both", {"allowed": ["re"], "additional": ["csv"]}, ("csv", "re")),
    ("empty-allowed", {"allowed": []}, ()),
    ("duplicates", {"additional": ["math", "math"]}, ("json", "math")),
]


@pytest.mark.parametrize(("imports", "expected"), [r[1:] for r in IMPORTS],
                         ids=[r[0] for r in IMPORTS])  # fmt: skip
def test_allowed_replaces_and_additional_adds(
    imports: dict[str, Any], expected: tuple[str, ...]
) -> None:
    """imports.allowed replaces the parent's list; imports.additional adds to it."""
    profiles = resolve(child={"extends": "base", "imports": imports})
    assert profiles["child"].allowed_imports == expected


def test_keys_not_given_are_inherited_key_by_key() -> None:
    """resources merge key by key; stages by phase; preimport and audit modes are inherited."""
    profiles = resolve(
        parent={"extends": "base", "resources": {"memory": "1Gi", "cpu": 2}, "preimport": ["math"],
                "scan_stages": {"pre": ["ast_scan"], "post": ["blocklist_audit"]},
                "audit": {"mode": {"ast_scan": "observe"}}},
        child={"extends": "parent", "resources": {"timeout_max": 10},
               "scan_stages": {"pre": []}, "audit": {"mode": {"runtime": "observe"}}},
    )  # fmt: skip
    child = profiles["child"]
    assert child.resources.model_dump() == {
        "memory_mb": 1024, "cpu": 2.0, "timeout_max_s": 10.0, "subprocess_memory_mb": 512,
    }  # fmt: skip
    assert (child.scan_pre, child.scan_post) == ((), ("blocklist_audit",))
    assert child.preimport == ("math",)
    assert child.audit_modes == (("ast_scan", "observe"), ("runtime", "observe"))
    assert child.mode("blocklist_audit") == "enforce"


def test_an_unknown_stage_name_loads() -> None:
    """A stage name harombe does not know is not a load error (the scan refuses instead)."""
    profiles = resolve(child={"extends": "base", "scan_stages": {"pre": ["secret_scan"]}})
    assert profiles["child"].scan_pre == ("secret_scan",)


def test_defaults_without_a_parent() -> None:
    """A root profile with no keys: no imports, both pre stages, 30 s, 512 MiB, enforce."""
    profile = resolve_profiles({"bare": {}})["bare"]
    assert profile.allowed_imports == ()
    assert profile.scan_pre == ("ast_scan", "blocklist_audit")
    assert profile.resources.timeout_max_s == 30.0
    assert profile.mode("runtime") == "enforce"


# -- resources ----------------------------------------------------------------------------

RESOURCES = [
    ("memory-mi", {"memory": "256Mi"}, "memory_mb", 256),
    ("memory-gi", {"memory": "1Gi"}, "memory_mb", 1024),
    ("memory-int", {"memory": 512}, "memory_mb", 512),
    ("memory-digits", {"memory": "2048"}, "memory_mb", 2048),
    ("memory-spaces", {"memory": " 64Mi "}, "memory_mb", 64),
    ("memory-null", {"memory": None}, "memory_mb", None),
    ("cpu-millicores", {"cpu": "500m"}, "cpu", 0.5),
    ("cpu-string", {"cpu": "1"}, "cpu", 1.0),
    ("cpu-int", {"cpu": 2}, "cpu", 2.0),
    ("cpu-float", {"cpu": 0.25}, "cpu", 0.25),
    ("cpu-decimal-string", {"cpu": "1.5"}, "cpu", 1.5),
    ("timeout-int", {"timeout_max": 5}, "timeout_max_s", 5.0),
    ("timeout-float", {"timeout_max": 0.5}, "timeout_max_s", 0.5),
    ("subprocess", {"subprocess_memory_mb": 800}, "subprocess_memory_mb", 800),
]


@pytest.mark.parametrize(("resources", "field", "value"), [r[1:] for r in RESOURCES],
                         ids=[r[0] for r in RESOURCES])  # fmt: skip
def test_resources_are_parsed(resources: dict[str, Any], field: str, value: object) -> None:
    """Kubernetes-style sizes and CPU amounts become MiB and cores."""
    profile = resolve(child={"extends": "base", "resources": resources})["child"]
    assert getattr(profile.resources, field) == value


BAD_RESOURCES = [
    ("memory-mb-unit", {"memory": "256MB"}, "resources.memory '256MB' is not a size"),
    ("memory-negative", {"memory": "-1"}, "is not a size"),
    ("memory-zero", {"memory": 0}, "is out of range"),
    ("memory-bool", {"memory": True}, "is not a size"),
    ("memory-huge", {"memory": "2048Ti"}, "is out of range"),
    ("cpu-unit", {"cpu": "500x"}, "resources.cpu '500x' is not a CPU amount"),
    ("cpu-zero", {"cpu": 0}, "is not a CPU amount"),
    ("cpu-negative", {"cpu": -1}, "is not a CPU amount"),
    ("cpu-nan", {"cpu": math.nan}, "is not a CPU amount"),
    ("timeout-zero", {"timeout_max": 0}, "resources.timeout_max 0 is not a number of seconds"),
    ("timeout-string", {"timeout_max": "30"}, "is not a number of seconds"),
    ("timeout-inf", {"timeout_max": math.inf}, "is not a number of seconds"),
    ("subprocess-small", {"subprocess_memory_mb": 10}, "subprocess_memory_mb 10 is not"),
    ("subprocess-string", {"subprocess_memory_mb": "512"}, "is not a whole number of MiB"),
    ("unknown-resource", {"disk": "1Gi"}, "unknown key 'resources.disk'; valid keys there: "
     "memory, cpu, timeout_max, subprocess_memory_mb"),
]  # fmt: skip


@pytest.mark.parametrize(("resources", "message"), [r[1:] for r in BAD_RESOURCES],
                         ids=[r[0] for r in BAD_RESOURCES])  # fmt: skip
def test_bad_resources_are_refused(resources: dict[str, Any], message: str) -> None:
    """A resource value of the wrong form names the profile, the key and what to write."""
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        resolve(child={"extends": "base", "resources": resources})
    assert "profile 'child'" in str(caught.value)


# -- malformed documents ------------------------------------------------------------------

BAD_DOCUMENTS = [
    ("unknown-top-key", {"import": ["os"]}, "unknown key 'import'; valid keys there: name, "
     "description, extends"),
    ("unknown-imports-key", {"imports": {"extra": []}}, "unknown key 'imports.extra'"),
    ("unknown-stage-phase", {"scan_stages": {"during": []}}, "unknown key 'scan_stages.during'"),
    ("unknown-audit-key", {"audit": {"level": 1}}, "unknown key 'audit.level'"),
    ("unknown-audit-layer", {"audit": {"mode": {"net": "observe"}}},
     "unknown key 'audit.mode.net'; valid keys there: ast_scan, blocklist_audit, runtime"),
    ("bad-audit-mode", {"audit": {"mode": {"runtime": "warn"}}},
     "audit.mode.runtime is 'warn'; use enforce or observe"),
    ("imports-not-mapping", {"imports": ["math"]}, "imports must be a mapping"),
    ("allowed-not-list", {"imports": {"allowed": "math"}}, "imports.allowed must be a list"),
    ("allowed-dotted", {"imports": {"allowed": ["os.path"]}}, "top-level module names (no dots)"),
    ("allowed-not-str", {"imports": {"allowed": [1]}}, "imports.allowed holds 1"),
    ("blocklist-short", {"blocklist": [["math"]]}, "blocklist entry ['math'] is not [module, "
     "attribute]"),
    ("blocklist-str", {"blocklist": ["math.pi"]}, "blocklist entry 'math.pi' is not"),
    ("blocklist-ints", {"blocklist": [[1, 2]]}, "is not [module, attribute]"),
    ("blocklist-space", {"blocklist": [["a b", "c"]]}, "is not [module, attribute]"),
    ("blocklist-not-list", {"blocklist": {"math": "pi"}}, "blocklist must be a list"),
    ("preimport-not-allowed", {"preimport": ["re"]}, "preimport 're' is not an allowed import; "
     "add 're' to imports.additional"),
    ("stages-not-names", {"scan_stages": {"pre": [1]}}, "scan_stages.pre lists stage names"),
    ("description-not-text", {"description": ["x"]}, "description must be text"),
    ("name-mismatch", {"name": "other"}, "has name 'other'; a profile's name key must match"),
    ("resources-not-mapping", {"resources": "big"}, "resources must be a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(("document", "message"), [r[1:] for r in BAD_DOCUMENTS],
                         ids=[r[0] for r in BAD_DOCUMENTS])  # fmt: skip
def test_malformed_documents_are_refused(document: dict[str, Any], message: str) -> None:
    """Each malformed document is a ConfigError naming the profile, the key and the fix."""
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        resolve(child={"extends": "base", **document})
    assert "profile 'child'" in str(caught.value)


EXTENDS_ERRORS = [
    ("unknown-parent", {"a": {"extends": "nope"}},
     "profile 'a' extends 'nope', which is not a profile (known: a, base)"),
    ("self-cycle", {"a": {"extends": "a"}}, "cycle (a -> a)"),
    ("two-cycle", {"a": {"extends": "b"}, "b": {"extends": "a"}}, "cycle (a -> b -> a)"),
    ("three-cycle", {"a": {"extends": "b"}, "b": {"extends": "c"}, "c": {"extends": "a"}},
     "cycle (a -> b -> c -> a)"),
    ("parent-not-str", {"a": {"extends": ["base"]}}, "extends ['base'], which is not a profile"),
    ("bad-name", {"Big Name": {}}, "profile name 'Big Name' is not allowed"),
    ("not-mapping", {"a": ["math"]}, "profile 'a' must be a mapping of keys"),
]  # fmt: skip


@pytest.mark.parametrize(("documents", "message"), [r[1:] for r in EXTENDS_ERRORS],
                         ids=[r[0] for r in EXTENDS_ERRORS])  # fmt: skip
def test_bad_extends_are_refused(documents: dict[str, Any], message: str) -> None:
    """Unknown parents and cycles are refused, naming the profiles and the fix."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(**documents)


# -- reading from disk --------------------------------------------------------------------


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_only_the_shipped_profiles_without_a_directory() -> None:
    """No directory: exactly minimal and data-science."""
    assert sorted(read_profile_documents(None)) == ["data-science", "minimal"]


def test_a_user_profile_is_read_and_extends_a_shipped_one(tmp_path: Path) -> None:
    """A user's file is one profile named by its stem, resolvable against the shipped ones."""
    write(tmp_path, "stats.yaml", "extends: minimal\nimports:\n  additional: [numpy]\n")
    for directory in (tmp_path, str(tmp_path)):
        profiles = resolve_profiles(read_profile_documents(directory))
        assert "numpy" in profiles["stats"].allowed_imports
        assert profiles["stats"].resources.memory_mb == 256


def test_other_files_in_the_directory_are_ignored(tmp_path: Path) -> None:
    """.yml files, dot files and subdirectories are not profiles."""
    write(tmp_path, "a.yml", "imports: {}\n")
    write(tmp_path, ".hidden.yaml", "imports: {}\n")
    (tmp_path / "sub.yaml").mkdir()
    assert sorted(read_profile_documents(tmp_path)) == ["data-science", "minimal"]


FILE_ERRORS = [
    ("shipped-name", "minimal.yaml", "imports: {}\n", "which harombe ships; rename the file"),
    ("bad-yaml", "bad.yaml", "imports: [\n", "bad.yaml is not valid YAML"),
    ("not-mapping", "list.yaml", "- math\n", "list.yaml must hold a mapping"),
    ("too-big", "big.yaml", "#" * (MAX_PROFILE_BYTES + 1), f"larger than {MAX_PROFILE_BYTES}"),
]


@pytest.mark.parametrize(("name", "text", "message"), [r[1:] for r in FILE_ERRORS],
                         ids=[r[0] for r in FILE_ERRORS])  # fmt: skip
def test_bad_files_are_refused_naming_the_file(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    """A file that cannot be a profile is a ConfigError that names it."""
    write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        read_profile_documents(tmp_path)
    assert str(tmp_path) in str(caught.value)


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are refused with the file's name."""
    (tmp_path / "latin.yaml").write_bytes(b"description: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin\.yaml is not UTF-8"):
        read_profile_documents(tmp_path)


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    """A file that cannot be opened (here a dangling link) is refused with its name."""
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"cannot read profile file .*gone\.yaml"):
        read_profile_documents(tmp_path)


def test_a_missing_directory_names_the_config_key(tmp_path: Path) -> None:
    """A directory that does not exist says which setting to fix."""
    with pytest.raises(ConfigError, match=r"security\.profiles\.directory"):
        read_profile_documents(tmp_path / "nope")


def test_a_name_key_must_match_the_file(tmp_path: Path) -> None:
    """A name key that differs from the file's stem is refused when resolving."""
    write(tmp_path, "mine.yaml", "name: yours\n")
    with pytest.raises(ConfigError, match="set name: mine"):
        resolve_profiles(read_profile_documents(tmp_path))


DEEPER = MAX_PROFILE_DEPTH + 1
HOSTILE_FILES = [
    ("anchor", "a.yaml", "description: &d x\n", "uses a YAML anchor or alias (&name / *name)"),
    ("alias", "b.yaml", "imports:\n  allowed: &m [math]\n  additional: *m\n", "line 2"),
    ("too-deep", "deep.yaml", "description: " + "[" * DEEPER + "]" * DEEPER,
     f"more than {MAX_PROFILE_DEPTH} levels deep"),
    ("very-deep", "deeper.yaml", "description: " + "[" * 50_000 + "]" * 50_000, "levels deep"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "message"), [r[1:] for r in HOSTILE_FILES],
                         ids=[r[0] for r in HOSTILE_FILES])  # fmt: skip
def test_hostile_files_are_refused_before_anything_is_built(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    """Anchors, aliases and deep nesting are a ConfigError naming the file and the fix."""
    write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        read_profile_documents(tmp_path)
    assert name in str(caught.value)


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO named like a profile is refused as not a regular file (never opened blocking)."""
    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(ConfigError, match=r"pipe\.yaml is not a regular file"):
        read_profile_documents(tmp_path)


def test_a_link_to_a_regular_file_is_read(tmp_path: Path) -> None:
    """A profile file may be a symlink to a regular file."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("extends: minimal\n", encoding="utf-8")
    (tmp_path / "linked.yaml").symlink_to(target)
    assert read_profile_documents(tmp_path)["linked"] == {"extends": "minimal"}


def _bomb() -> list[object]:
    """A list that stands for 10**9 strings through shared references (built in no time)."""
    value: list[object] = ["x"] * 10
    for _ in range(8):
        value = [value] * 10
    return value


@pytest.mark.parametrize(
    "value",
    [_bomb(), "y" * 1_000_000, {f"k{i}": i for i in range(100_000)}, [[[[[[1]]]]]]],
    ids=["alias-bomb", "long-string", "large-mapping", "deep-list"],
)
def test_values_in_messages_are_bounded(value: object) -> None:
    """short() and kind() show any value in at most about 100 characters."""
    assert len(short(value)) <= 80
    assert len(kind(value)) <= 100


def test_a_hostile_document_gives_a_short_message() -> None:
    """A bomb in a key's value is named in a short message, not built out."""
    with pytest.raises(ConfigError, match="description must be text, not list") as caught:
        resolve(bad={"description": _bomb()})
    assert len(str(caught.value)) < 300


def test_a_long_unknown_key_is_shown_cut() -> None:
    """An unknown key of a megabyte is shown cut."""
    with pytest.raises(ConfigError, match="unknown key") as caught:
        resolve(bad={"z" * 1_000_000: 1})
    assert len(str(caught.value)) < 400


REFUSED = ["builtins", "gc", "ctypes", "_ctypes", "importlib", "_imp"]


@pytest.mark.parametrize("module", REFUSED)
@pytest.mark.parametrize("key", ["allowed", "additional"])
def test_modules_that_undo_the_guardrails_are_refused(module: str, key: str) -> None:
    """No profile may allow builtins, gc, ctypes or importlib (in either list)."""
    with pytest.raises(ConfigError, match=f"imports.{key} lists '{module}'.*remove it"):
        resolve(wide={"extends": "base", "imports": {key: [module]}})


@pytest.mark.parametrize("module", ["os", "sys", "subprocess", "socket", "pickle"])
def test_wide_modules_are_warned_about_when_loaded(module: str) -> None:
    """A profile allowing os, sys, subprocess… loads, with one warning event naming it."""
    documents = {"base": {"imports": {"allowed": ["math"]}},
                 "wide": {"extends": "base", "imports": {"additional": [module]}}}  # fmt: skip
    with capture_events() as events:
        profiles = resolve_documents(documents)
    warned = [e for e in events if e["event"] == "profile.risky_import_allowed"]
    assert [(e["log_level"], e["profile"]) for e in warned] == [("warning", "wide")]
    assert f"allows importing '{module}'" in warned[0]["warning"]
    assert import_warnings(profiles["wide"]) == [warned[0]["warning"]]


def test_the_shipped_profiles_warn_about_nothing() -> None:
    """minimal and data-science allow no module that deserves a warning."""
    assert [w for p in shipped().values() for w in import_warnings(p)] == []


def test_the_tools_scan_lists_every_observed_stage() -> None:
    """tools' scan returns one warning per finding, each naming the stage that found it."""
    modes = {"ast_scan": "observe", "blocklist_audit": "observe"}
    watched = resolve(w={"extends": "base", "audit": {"mode": modes}})["w"]
    warnings = asyncio.run(scan("import os\np = '../x'", watched))
    assert [w.split(":")[0] for w in warnings] == [
        "guardrail ast_scan (observe mode)",
        "guardrail blocklist_audit (observe mode)",
    ]


@pytest.mark.parametrize(
    ("document", "needed"),
    [
        pytest.param({"imports": {"additional": ["numpy", "pandas"]}}, ["numpy", "pandas"],
                     id="allowed-not-preimported"),
        pytest.param({"imports": {"additional": ["numpy", "pandas"]}, "preimport": ["pandas"]},
                     ["numpy"], id="one-listed"),
        pytest.param({"imports": {"additional": ["scipy"]}, "preimport": ["scipy.linalg"]},
                     None, id="submodule-listed"),
        pytest.param({"imports": {"additional": ["numpy"]},
                      "audit": {"mode": {"runtime": "observe"}}}, None, id="observe-mode"),
        pytest.param({"imports": {"additional": ["csv"]}}, None, id="no-such-module"),
    ],
)  # fmt: skip
def test_modules_that_start_threads_are_imported_ahead(
    document: dict[str, Any], needed: list[str] | None
) -> None:
    """numpy, pandas and scipy allowed under an enforced layer but not in preimport are
    named in the spec's preimport_needed (their import is refused once user code runs)."""
    profile = resolve_profiles(
        {**read_profile_documents(None), "p": {"extends": "minimal", **document}}
    )
    assert profile["p"].runtime_spec().get("preimport_needed") == needed

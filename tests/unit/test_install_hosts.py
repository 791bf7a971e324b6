"""Host names in ``network.allowed_registries`` (the usage guide's form): the guide's YAML
loads, and a host name limits where installs download from — the index in use and every file
— with an error naming the host and the fix. The guarded pip runs on the host against a
loopback index whose files live on another host name (``localhost``)."""

from __future__ import annotations

import pytest
import yaml

from harombe.config import parse_config
from harombe.errors import ConfigError, PackageFetchError
from harombe.security.runtime import packages
from harombe.security.runtime.packages import pypi
from harombe.security.runtime.packages.npm import check_fetched_hosts, fetched_hosts
from harombe.testing.wheel_index import WheelIndex, make_wheel

#: The usage guide's "Configuration Reference" block, its placeholders replaced by made-up
#: hosts.
GUIDE_YAML = """
# harombe.yaml
security:
  sandbox:
    enabled: true
    runtime: runsc # gVisor runtime
    # Default resource limits
    limits:
      max_memory_mb: 512
      max_cpu_cores: 0.5
      max_disk_mb: 1024
      max_execution_time: 30
      max_output_bytes: 1048576
    # Network configuration
    network:
      enabled_by_default: false
      allowed_registries:
        pypi:
          - <python-index-host>
          - <python-files-host>
        npm:
          - <npm-registry-host>
    # Supported languages
    languages:
      python:
        image: python:3.11-slim
      javascript:
        image: node:20-slim
      shell:
        image: bash:5.2
  # HITL integration
  hitl:
    enabled: true
    auto_approve_low_risk: true
"""
HOSTS = {"<python-index-host>": "index.example.org", "<python-files-host>": "files.example.org",
         "<npm-registry-host>": "registry.example.org"}  # fmt: skip
TARGET = pypi.Target(python="3.11.2", machine="x86_64", glibc="2.36")


def _guide_config() -> str:
    text = GUIDE_YAML
    for placeholder, host in HOSTS.items():
        text = text.replace(placeholder, host)
    return text


def test_the_guides_yaml_loads_with_host_names() -> None:
    """The guide's block, placeholders replaced by host names, loads: the hosts are where
    downloads may come from, no index URL is configured (the machine's is used), and the
    language images are kept as written."""
    config = parse_config(yaml.safe_load(_guide_config()))
    network = config.security.sandbox.network
    assert network.registry_hosts("pypi") == {"index.example.org", "files.example.org"}
    assert network.registry_hosts("npm") == {"registry.example.org"}
    assert network.registry_urls("pypi") == () and network.registry_urls("npm") == ()
    images = {lang: c.image for lang, c in config.security.sandbox.languages.items()}
    assert images == {"python": "python:3.11-slim", "javascript": "node:20-slim",
                      "shell": "bash:5.2"}  # fmt: skip


@pytest.mark.parametrize(
    ("entries", "hosts", "urls"),
    [
        (["https://mirror.example/simple"], set(), ("https://mirror.example/simple",)),
        (["Files.Example.ORG"], {"files.example.org"}, ()),
        (["https://mirror.example/simple", "files.example.org"],
         {"mirror.example", "files.example.org"}, ("https://mirror.example/simple",)),
        (["127.0.0.1"], {"127.0.0.1"}, ()),
    ],
    ids=["url-only-no-limit", "host-lowercased", "url-and-host", "ip"],
)  # fmt: skip
def test_entries_are_urls_or_hosts(entries: list[str], hosts: set[str], urls: tuple) -> None:
    """URLs keep their meaning (the indexes); host names limit downloads to them and to the
    URLs' hosts; without a host name there is no limit."""
    network = parse_config(
        {"security": {"sandbox": {"network": {"allowed_registries": {"pypi": entries}}}}}
    ).security.sandbox.network
    assert network.registry_hosts("pypi") == hosts and network.registry_urls("pypi") == urls


@pytest.mark.parametrize(
    "entry",
    ["mirror.example/simple", "-bad.example", "bad_host.example", "a b.example", "höst.example",
     "files.example.org:8080"],
    ids=["host-and-path", "leading-dash", "underscore", "space", "non-ascii", "port"],
)  # fmt: skip
def test_what_is_neither_a_url_nor_a_host_is_refused(entry: str) -> None:
    """An entry that is not an http(s) URL or a plain host name is a ConfigError naming both
    forms."""
    with pytest.raises(ConfigError, match="neither an http\\(s\\) URL nor a host name"):
        parse_config(
            {"security": {"sandbox": {"network": {"allowed_registries": {"pypi": [entry]}}}}}
        )


def test_npm_takes_host_names_beside_its_one_url() -> None:
    """npm takes one registry URL; host names beside it do not count as more registries."""
    registries = {"npm": ["https://npm.example/", "registry.example.org", "cdn.example.org"]}
    network = parse_config(
        {"security": {"sandbox": {"network": {"allowed_registries": registries}}}}
    ).security.sandbox.network
    assert network.registry_urls("npm") == ("https://npm.example/",)
    assert network.registry_hosts("npm") == {"npm.example", "registry.example.org",
                                             "cdn.example.org"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"PIP_INDEX_URL": "https://index.example.org/simple"}, None),
        ({"PIP_INDEX_URL": "https://other.example.org/simple"}, "other.example.org"),
        ({"PIP_INDEX_URL": "https://index.example.org/simple",
          "PIP_EXTRA_INDEX_URL": "https://index.example.org/x http://extra.example.org/y"},
         "extra.example.org"),
        ({"PIP_FIND_LINKS": "/srv/wheels"}, None),
    ],
    ids=["allowed", "index-elsewhere", "extra-elsewhere", "local-dir"],
)  # fmt: skip
def test_the_index_in_use_must_be_on_an_allowed_host(
    env: dict[str, str], refused: str | None
) -> None:
    """Every http(s) source pip would use is on an allowed host; a local directory is not a
    download. The error names the host and the setting to add it to."""
    allowed = {"index.example.org", "files.example.org"}
    if refused is None:
        pypi.check_index_hosts(env, allowed)
        return
    with pytest.raises(PackageFetchError, match=f"{refused}.*allowed_registries.pypi"):
        pypi.check_index_hosts(env, allowed)


async def _resolve(allowed: set[str]) -> list[str]:
    async with packages.fetching("hostroot", "harombe-test-") as area:
        wheels = await pypi.resolve(
            area, "hostroot", TARGET, packages.manylinux_platforms("x86_64", "2.36"),
            allowed_hosts=allowed,
        )  # fmt: skip
    return [w.label for w in wheels]


async def test_every_file_must_come_from_an_allowed_host() -> None:
    """Index pages on 127.0.0.1 link files on localhost: with only 127.0.0.1 allowed, the
    download is refused before the file is asked for, naming localhost and the fix; with
    both allowed it works; with neither, nothing is asked at all."""
    with WheelIndex(files_host="localhost") as index, index.as_pip_config():
        index.publish(make_wheel("hostroot", "1.0"))
        with pytest.raises(PackageFetchError, match=r"localhost.*allowed_registries\.pypi"):
            await _resolve({"127.0.0.1"})
        assert not any(p.startswith("/files/") for p in index.requested), index.requested
        assert await _resolve({"127.0.0.1", "localhost"}) == ["hostroot 1.0"]
        index.requested.clear()
        with pytest.raises(PackageFetchError, match=r"index 127\.0\.0\.1"):
            await _resolve({"files.example.org"})
        assert index.requested == []


@pytest.mark.parametrize(
    ("log_text", "refused"),
    [
        ("12 http fetch GET 200 https://registry.example.org/left-pad 30ms (cache miss)\n"
         "13 http fetch GET 200 https://registry.example.org/left-pad/-/left-pad-1.3.0.tgz 5ms\n"
         "14 verbose exit 0", None),
        ("12 http fetch GET 200 https://registry.example.org/x 30ms\n"
         "13 http fetch GET 200 https://cdn.elsewhere.example/x.tgz 5ms", "cdn.elsewhere.example"),
        ("1 verbose cli npm\n", "does not say where"),
    ],
    ids=["all-allowed", "tarball-elsewhere", "no-requests-logged"],
)  # fmt: skip
def test_npm_downloads_are_checked_against_its_log(log_text: str, refused: str | None) -> None:
    """Every request npm logged went to an allowed host; a log that shows none is refused."""
    allowed = {"registry.example.org"}
    if refused is None:
        check_fetched_hosts(log_text, allowed, "left-pad")
        assert fetched_hosts(log_text) == {"registry.example.org"}
        return
    with pytest.raises(PackageFetchError, match=refused):
        check_fetched_hosts(log_text, allowed, "left-pad")

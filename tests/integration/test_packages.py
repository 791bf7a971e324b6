"""Package installs into offline sandboxes, from the machine's own pip / npm configuration."""

import pytest

from harombe.tools.code_execution import CodeExecutionTools

OFFLINE_CHECK = (
    "import socket\ns = socket.socket(); s.settimeout(3)\n"
    "try:\n    s.connect(('10.0.0.1', 443)); print('ONLINE')\nexcept OSError:\n    print('offline')"
)


async def test_pypi_package_is_importable_and_sandbox_stays_offline(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A PyPI install makes the module importable in later calls; the network stays off.
    (toml: a small pure wheel the image does not hold; the image's Debian packages bring six.)"""
    result = await tools.code_install_package(
        sandbox_id=fresh_sandbox, package="toml==0.10.2", registry="pypi"
    )
    assert result["success"] is True, result
    assert "Successfully installed toml-0.10.2" in result["stdout"]
    used = await tools.code_execute(
        language="python", sandbox_id=fresh_sandbox, code="import toml\nprint(toml.__version__)"
    )
    assert used["stdout"] == "0.10.2\n"
    offline = await tools.code_execute(
        language="python", code=OFFLINE_CHECK, sandbox_id=fresh_sandbox
    )
    assert offline["stdout"] == "offline\n"


async def test_npm_package_is_requirable(tools: CodeExecutionTools, fresh_sandbox: str) -> None:
    """An npm install makes the package require()-able from code in the sandbox."""
    result = await tools.code_install_package(
        sandbox_id=fresh_sandbox, package="is-number@7.0.0", registry="npm"
    )
    assert result["success"] is True, result
    used = await tools.code_execute(
        language="javascript",
        sandbox_id=fresh_sandbox,
        code="console.log(require('is-number')(5), require('is-number')('x'))",
    )
    assert used["stdout"] == "true false\n"


@pytest.mark.parametrize(
    ("package", "registry", "needle"),
    [
        ("git+https://github.com/psf/requests", "pypi", "URL or path"),
        ("https://example.invalid/evil.whl", "pypi", "URL or path"),
        ("../evil", "pypi", "URL or path"),
        ("github:user/repo", "npm", "URL, alias"),
        ("requests", "cargo", "unknown registry"),
        ("--extra-index-url=http://evil", "pypi", "option"),
    ],
    ids=["git", "url", "path", "github", "unknown-registry", "option"],
)
async def test_non_registry_specs_are_refused(
    tools: CodeExecutionTools, sandbox_id: str, package: str, registry: str, needle: str
) -> None:
    """URLs, VCS refs, paths, options and unknown registries never reach pip or npm."""
    result = await tools.code_install_package(
        sandbox_id=sandbox_id, package=package, registry=registry
    )
    assert result["success"] is False
    assert result["error"].startswith("PackageSpecError") and needle in result["error"]


async def test_missing_package_is_a_clear_failure(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """A package that does not exist fails with pip's reason, not an exception."""
    result = await tools.code_install_package(
        sandbox_id=sandbox_id, package="harombe-no-such-package-zz==0.0.1", registry="pypi"
    )
    assert result["success"] is False
    assert result["error"].startswith("PackageNotFoundError")


@pytest.mark.parametrize(
    ("language", "probe", "package", "registry", "use"),
    [
        ("python", "try:\n    import toml\nexcept ImportError:\n    print('missing')",
         "toml==0.10.2", "pypi", "import toml\ntoml.__version__"),
        ("javascript", "try { require('is-number') } catch (e) { console.log('missing') }",
         "is-number@7.0.0", "npm", "require('is-number')(5)"),
    ],
    ids=["python", "javascript"],
)  # fmt: skip
async def test_install_after_a_failed_import_works_in_the_same_session(
    tools: CodeExecutionTools,
    fresh_sandbox: str,
    language: str,
    probe: str,
    package: str,
    registry: str,
    use: str,
) -> None:
    """An agent's usual order — import fails, install, import again — works without restart."""
    first = await tools.code_execute(language=language, code=probe, sandbox_id=fresh_sandbox)
    assert first["stdout"] == "missing\n"
    installed = await tools.code_install_package(
        sandbox_id=fresh_sandbox, package=package, registry=registry
    )
    assert installed["success"], installed
    again = await tools.code_execute(language=language, code=use, sandbox_id=fresh_sandbox)
    assert again["success"] and again["state_lost"] is False, again
    assert again["result"] in ("'0.10.2'", "true")


async def test_pypi_package_with_a_dependency_tree_installs(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A package with dependencies (resolved by harombe level by level, wheels only) installs
    with its whole tree, extras included, and imports offline."""
    result = await tools.code_install_package(
        sandbox_id=fresh_sandbox, package="requests[socks]==2.31.0", registry="pypi"
    )
    assert result["success"] is True, result
    used = await tools.code_execute(
        language="python",
        sandbox_id=fresh_sandbox,
        code="import requests, urllib3, idna, certifi, charset_normalizer, socks\n"
        "print(requests.__version__)",
    )
    assert used["stdout"] == "2.31.0\n", used


async def test_npm_package_with_a_dependency_installs(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """An npm package with a dependency installs from a checked, registry-only lockfile."""
    result = await tools.code_install_package(
        sandbox_id=fresh_sandbox, package="debug@4.3.4", registry="npm"
    )
    assert result["success"] is True, result
    used = await tools.code_execute(
        language="javascript",
        sandbox_id=fresh_sandbox,
        code="console.log(typeof require('debug'), typeof require('ms'))",
    )
    assert used["stdout"] == "function function\n", used

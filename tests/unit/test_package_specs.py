"""One rule for "is this package from a non-standard source": the installer's parser and the
HITL risk table read the same verdict, so what the gate rates as a plain registry package is
what the installer accepts, and whatever the installer refuses is CRITICAL at the gate."""

import pytest

from harombe.errors import PackageSpecError
from harombe.security.hitl import Operation, RiskClassifier, RiskLevel
from harombe.security.policy.package_specs import REGISTRIES, parse_spec, source_kind

CLASSIFIER = RiskClassifier()

#: (id, spec, registry, the kind of source it is, the package name if it is a registry
#: package, else words of the reason the installer gives)
SPECS = [
    ("pypi-pinned", "requests==2.31.0", "pypi", "registry", "requests"),
    ("pypi-range", "pandas>=2,<3", "pypi", "registry", "pandas"),
    ("pypi-bare", "six", "pypi", "registry", "six"),
    ("pypi-extra", "requests[socks]==2.31.0", "pypi", "registry", "requests"),
    ("pypi-local-version", "torch==2.1.0+cpu", "pypi", "registry", "torch"),
    ("pypi-padded", "  numpy ", "pypi", "registry", "numpy"),
    ("npm-pinned", "axios@1.6.0", "npm", "registry", "axios"),
    ("npm-bare", "is-number", "npm", "registry", "is-number"),
    ("npm-scoped", "@types/node@^20.1", "npm", "registry", "@types/node"),
    ("npm-tilde", "lodash@~4.17", "npm", "registry", "lodash"),
    ("npm-tag", "left-pad@latest", "npm", "registry", "left-pad"),
    ("npm-range", "react@>=18 <19", "npm", "registry", "react"),
    ("pypi-https", "https://evil.example/pkg.whl", "pypi", "url", "URL or path"),
    ("pypi-direct-ref", "pkg @ https://evil.example/p.tar.gz", "pypi", "url", "URL or path"),
    ("pypi-git", "git+https://github.com/x/y", "pypi", "vcs", "URL or path"),
    ("pypi-hg", "hg+https://evil.example/repo", "pypi", "vcs", "URL or path"),
    ("pypi-file", "file:///tmp/x", "pypi", "path", "URL or path"),
    ("pypi-relative", "./local_pkg", "pypi", "path", "URL or path"),
    ("pypi-absolute", "/abs/path", "pypi", "path", "URL or path"),
    ("pypi-home", "~/pkg", "pypi", "path", "URL or path"),
    ("pypi-slash", "dir/pkg", "pypi", "path", "URL or path"),
    ("pypi-wheel-file", "pkg-1.0-py3-none-any.whl", "pypi", "archive", "URL or path"),
    ("pypi-sdist-file", "pkg-1.0.tar.gz", "pypi", "archive", "URL or path"),
    ("pypi-zip-file", "pkg.zip", "pypi", "archive", "URL or path"),
    ("pypi-archive-upper", "PKG.TGZ", "pypi", "archive", "URL or path"),
    ("pypi-arbitrary-eq-file", "foo===file:x", "pypi", "path", "URL or path"),
    ("pypi-arbitrary-eq-git", "foo===git+x", "pypi", "vcs", "URL or path"),
    ("pypi-github-scheme", "github:user/repo", "pypi", "vcs", "URL or path"),
    ("pypi-npm-alias", "npm:other", "pypi", "alias", "URL or path"),
    ("pypi-option", "--index-url=http://evil", "pypi", "option", "option"),
    ("pypi-editable", "-e .", "pypi", "option", "option"),
    ("pypi-newline", "a\nb", "pypi", "option", "option"),
    ("pypi-marker", "requests; python_version<'3'", "pypi", "invalid", "marker"),
    ("pypi-malformed", "not a package!!", "pypi", "invalid", "not a valid"),
    ("pypi-lone-surrogate", "six==1.0\udc80", "pypi", "invalid", "not a valid"),
    ("pypi-empty", "", "pypi", "invalid", "empty"),
    ("pypi-too-long", "a" * 600, "pypi", "invalid", "at most 512"),
    ("npm-github", "github:user/repo", "npm", "vcs", "URL, alias"),
    ("npm-gitlab", "gitlab:user/repo", "npm", "vcs", "URL, alias"),
    ("npm-git", "git+https://github.com/x/y.git", "npm", "vcs", "URL, alias"),
    ("npm-shorthand", "user/repo", "npm", "vcs", "URL, alias"),
    ("npm-alias", "npm:other@1", "npm", "alias", "URL, alias"),
    ("npm-named-alias", "alias@npm:other@1", "npm", "alias", "URL, alias"),
    ("npm-http", "http://evil.example/x.tgz", "npm", "url", "URL, alias"),
    ("npm-other-scheme", "foo@bar:baz", "npm", "url", "URL, alias"),
    ("npm-relative", "./dir", "npm", "path", "URL, alias"),
    ("npm-link", "link:../dir", "npm", "path", "URL, alias"),
    ("npm-file", "file:../x", "npm", "path", "URL, alias"),
    ("npm-deep-scope", "@a/b/c", "npm", "path", "URL, alias"),
    ("npm-tarball-file", "foo.tgz", "npm", "archive", "URL, alias"),
    ("npm-tar-file", "foo-1.0.0.tar", "npm", "archive", "URL, alias"),
    ("npm-version-as-tarball", "foo@1.tgz", "npm", "archive", "URL, alias"),
    ("npm-upper", "UPPER", "npm", "invalid", "not a valid npm package name"),
    ("npm-shell-in-range", "ok@1;rm -rf /", "npm", "invalid", "not an npm version"),
    ("npm-lone-surrogate", "is-number@7\udc80", "npm", "invalid", "not an npm version"),
    ("npm-huge", "a" * 10_000_000, "npm", "invalid", "at most 512"),
    ("npm-option", "--registry=http://evil", "npm", "option", "option"),
    ("unknown-registry", "requests", "rubygems", "unknown-registry", "unknown registry"),
    ("empty-registry", "requests", "", "unknown-registry", "unknown registry"),
]  # fmt: skip


def _gate_risk(spec: str, registry: str) -> RiskLevel:
    params = {"sandbox_id": "sandbox-0123456789ab", "package": spec, "registry": registry}
    return CLASSIFIER.classify(Operation("code_install_package", params))


@pytest.mark.parametrize(
    ("spec", "registry", "kind", "expected"), [s[1:] for s in SPECS], ids=[s[0] for s in SPECS]
)
def test_installer_and_gate_agree(spec: str, registry: str, kind: str, expected: str) -> None:
    """A registry spec is accepted by the installer, keeps its text and is HIGH at the gate;
    any other kind is refused by the installer with a reason saying what to write, and is
    CRITICAL at the gate."""
    assert source_kind(spec, registry) == kind
    risk = _gate_risk(spec, registry)
    if kind == "registry":
        parsed = parse_spec(spec, registry)
        assert (parsed.registry, parsed.name, parsed.text) == (registry, expected, spec.strip())
        assert risk == RiskLevel.HIGH
    else:
        with pytest.raises(PackageSpecError, match=expected):
            parse_spec(spec, registry)
        assert risk == RiskLevel.CRITICAL


def test_the_table_covers_every_kind_and_registry() -> None:
    """Each kind of source is probed, for each registry where it exists."""
    kinds = {(registry, kind) for _, _, registry, kind, _ in SPECS}
    for registry in REGISTRIES:
        assert {(registry, k) for k in ("registry", "url", "vcs", "path", "archive")} <= kinds
        assert {(registry, k) for k in ("alias", "option", "invalid")} <= kinds


@pytest.mark.parametrize("package", [None, 7, ["requests"]], ids=repr)
def test_a_package_that_is_not_a_string_is_refused_and_critical(package: object) -> None:
    """What the installer cannot read is not rated as an ordinary install."""
    assert source_kind(package, "pypi") == "invalid"
    params = {"sandbox_id": "sandbox-0123456789ab", "package": package, "registry": "pypi"}
    assert CLASSIFIER.classify(Operation("code_install_package", params)) == RiskLevel.CRITICAL

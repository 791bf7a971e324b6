"""Package specs: plain registry requirements pass, everything else is refused."""

import pytest

from harombe.errors import PackageSpecError
from harombe.security.packages import manylinux_platforms, parse_spec

GOOD = [
    ("requests==2.31.0", "pypi", "requests"),
    ("pandas>=2,<3", "pypi", "pandas"),
    ("six", "pypi", "six"),
    ("requests[socks]==2.31.0", "pypi", "requests"),
    ("  numpy ", "pypi", "numpy"),
    ("axios@1.6.0", "npm", "axios"),
    ("is-number", "npm", "is-number"),
    ("@types/node@^20.1", "npm", "@types/node"),
    ("lodash@~4.17", "npm", "lodash"),
    ("left-pad@latest", "npm", "left-pad"),
    ("react@>=18 <19", "npm", "react"),
]


@pytest.mark.parametrize(("spec", "registry", "name"), GOOD, ids=[g[0].strip() for g in GOOD])
def test_registry_specs_are_accepted(spec: str, registry: str, name: str) -> None:
    """Names with version constraints pass and keep their text."""
    parsed = parse_spec(spec, registry)
    assert (parsed.registry, parsed.name, parsed.text) == (registry, name, spec.strip())


BAD = [
    ("https://evil.example/pkg.whl", "pypi", "URL or path"),
    ("git+https://github.com/x/y", "pypi", "URL or path"),
    ("pkg @ https://evil.example/p.tar.gz", "pypi", "URL or path"),
    ("file:///tmp/x", "pypi", "URL or path"),
    ("./local_pkg", "pypi", "URL or path"),
    ("/abs/path", "pypi", "URL or path"),
    ("--index-url=http://evil", "pypi", "option"),
    ("-e .", "pypi", "option"),
    ("requests; python_version<'3'", "pypi", "marker"),
    ("not a package!!", "pypi", "not a valid"),
    ("", "pypi", "empty"),
    ("a\nb", "pypi", "option"),
    ("github:user/repo", "npm", "URL, alias"),
    ("git+https://github.com/x/y.git", "npm", "URL, alias"),
    ("npm:other@1", "npm", "URL, alias"),
    ("alias@npm:other@1", "npm", "URL, alias"),
    ("http://evil.example/x.tgz", "npm", "URL, alias"),
    ("./dir", "npm", "URL, alias"),
    ("user/repo", "npm", "URL, alias"),
    ("UPPER", "npm", "not a valid npm package name"),
    ("ok@1;rm -rf /", "npm", "not an npm version"),
    ("requests", "rubygems", "unknown registry"),
    ("requests", "", "unknown registry"),
]


@pytest.mark.parametrize(
    ("spec", "registry", "needle"), BAD, ids=[f"{b[1]}:{b[0]!r}"[:40] for b in BAD]
)
def test_non_registry_specs_are_refused(spec: str, registry: str, needle: str) -> None:
    """URLs, VCS, paths, aliases, options and unknown registries are refused with a reason."""
    with pytest.raises(PackageSpecError, match=needle):
        parse_spec(spec, registry)


def test_manylinux_tags_cover_older_glibc() -> None:
    """A glibc 2.36 sandbox accepts manylinux wheels down to 2_5, legacy aliases included."""
    tags = manylinux_platforms("x86_64", "2.36")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert not any("2_37" in t for t in tags)

"""Workspace path policy: what is accepted, normalised, and refused."""

import pytest

from harombe.errors import WorkspacePathError
from harombe.security.paths import workspace_relative

ACCEPTED = [
    ("output.txt", "output.txt"),
    ("data/input.csv", "data/input.csv"),
    ("./data//input.csv", "data/input.csv"),
    ("/workspace/results.txt", "results.txt"),
    ("/workspace/a/./b", "a/b"),
    ("  spaced.txt ", "spaced.txt"),
    ("ünïcödé/файл.txt", "ünïcödé/файл.txt"),
    ("..hidden", "..hidden"),
]


@pytest.mark.parametrize(("path", "expected"), ACCEPTED, ids=[a for a, _ in ACCEPTED])
def test_accepted_paths_are_normalised(path: str, expected: str) -> None:
    """Relative paths and /workspace-absolute paths normalise to a clean relative path."""
    assert workspace_relative(path) == expected


REFUSED = [
    ("../etc/passwd", "'..'"),
    ("data/../../etc", "'..'"),
    ("a/..", "'..'"),
    ("/etc/passwd", "outside /workspace"),
    ("/workspacefoo/x", "outside /workspace"),
    ("/", "outside /workspace"),
    ("", "empty"),
    ("   ", "empty"),
    ("a\x00b", "NUL"),
    (".", "names /workspace itself"),
    ("/workspace", "names /workspace itself"),
    ("x" * 5000, "longer than"),
]


@pytest.mark.parametrize(("path", "needle"), REFUSED, ids=[repr(p)[:24] for p, _ in REFUSED])
def test_refused_paths_say_why(path: str, needle: str) -> None:
    """Escapes, empty names and NUL bytes are refused with a reason."""
    with pytest.raises(WorkspacePathError, match=needle):
        workspace_relative(path)


@pytest.mark.parametrize(("path", "expected"), [(".", "."), ("/workspace", "."), ("data/", "data")])
def test_listing_may_name_the_workspace_itself(path: str, expected: str) -> None:
    """allow_root admits '.' for directory listings."""
    assert workspace_relative(path, allow_root=True) == expected


def test_non_string_is_refused() -> None:
    """A non-string path is refused, not coerced."""
    with pytest.raises(WorkspacePathError, match="must be a string"):
        workspace_relative(3)  # type: ignore[arg-type]

"""Workspace path policy: what is accepted, how it is normalised, and what is refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harombe.errors import WorkspacePathError
from harombe.security.policy.paths import preview, workspace_relative

ACCEPTED = [
    ("output.txt", "output.txt"),
    ("data/input.csv", "data/input.csv"),
    ("./data//input.csv", "data/input.csv"),
    ("/workspace/results.txt", "results.txt"),
    ("//workspace//results.txt", "results.txt"),
    ("/workspace/a/./b", "a/b"),
    ("ünïcödé/файл.txt", "ünïcödé/файл.txt"),
    ("..hidden", "..hidden"),
    (".env", ".env"),
    ("./.env", ".env"),
    ("a/.env", "a/.env"),
    ("my file.txt", "my file.txt"),
    ("~/x", "~/x"),
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
    ("a/" + "n" * 256, "longer than 255 bytes"),
    ("a/" * 1000 + "b", "1001 directories deep"),
    ("/".join(["n" * 240] * 16 + ["n" * 234]), "longer than Linux allows"),
    ("run.py ", "white space"),
    ("  spaced.txt ", "white space"),
    (" run.py", "white space"),
    ("dir /run.py", "white space"),
    ("run.py\t", "U+0009"),
    ("run.py\u00a0", "white space"),
    ("run.py.", "ends with '.'"),
    ("run.py...", "ends with '.'"),
    ("run.py/", "names a directory"),
    (".env/", "names a directory"),
    ("data/.", "names a directory"),
    ("/workspace/run.py/", "names a directory"),
    ("a\\b.py", "backslash"),
    ("run\u200b.py", "U+200B"),
    ("exe\u202etxt.py", "U+202E"),
    ("a\u2028b", "U+2028"),
    ("a\x7fb", "U+007F"),
    ("a\nb", "U+000A"),
    ("a\ud800b", "U+D800"),
    ("cafe\u0301.py", "NFC"),
]


@pytest.mark.parametrize(("path", "needle"), REFUSED, ids=[ascii(p)[:24] for p, _ in REFUSED])
def test_refused_paths_say_why(path: str, needle: str) -> None:
    """Escapes, empty and ambiguous names are refused with a reason, never rewritten."""
    with pytest.raises(WorkspacePathError, match=needle.replace(".", r"\.").replace("+", r"\+")):
        workspace_relative(path)


@pytest.mark.parametrize(
    ("path", "expected"),
    [(".", "."), ("/workspace", "."), ("/workspace/", "."), ("data/", "data"), ("./a//b/", "a/b")],
)
def test_listing_may_name_the_workspace_itself(path: str, expected: str) -> None:
    """allow_root (directories) admits '.' and a trailing '/'."""
    assert workspace_relative(path, allow_root=True) == expected


@pytest.mark.parametrize("value", [3, None, b"a.txt", ["a"], 1.5], ids=repr)
def test_non_string_is_refused(value: object) -> None:
    """A non-string path is refused, not coerced."""
    with pytest.raises(WorkspacePathError, match="must be a string"):
        workspace_relative(value)  # type: ignore[arg-type]


def test_errors_never_echo_a_huge_path() -> None:
    """A 10 MB path is refused with a short message."""
    with pytest.raises(WorkspacePathError) as info:
        workspace_relative("a/" * 5_000_000)
    assert len(str(info.value)) < 300


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab./ \\\u0301é\u200b~-_"), max_size=30))
def test_normalisation_is_idempotent(path: str) -> None:
    """Whatever is accepted maps to itself: the gate and the manager normalise identically."""
    for allow_root in (False, True):
        try:
            once = workspace_relative(path, allow_root=allow_root)
        except WorkspacePathError:
            continue
        assert workspace_relative(once, allow_root=allow_root) == once
        assert ".." not in once.split("/") and not once.startswith("/")


@pytest.mark.parametrize(
    ("value", "limit"), [("x" * 10_000_000, 80), (list(range(10**5)), 80), ("ok", 80)]
)
def test_preview_is_bounded(value: object, limit: int) -> None:
    """Error messages echo at most about 80 characters of any value."""
    assert len(preview(value, limit)) <= limit

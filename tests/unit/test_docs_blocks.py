"""The docs' shell blocks: every one is marked, every marked one parses, and the parser and the
output comparison read the convention of docs/architecture.md ("Docs that run")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_blocks import (
    DocsBlockError,
    Expected,
    Marker,
    Step,
    fenced_blocks,
    is_serve_command,
    mismatch,
    shell_blocks,
    trailing_comment,
)

ROOT = Path(__file__).resolve().parents[2]


def one_block(markdown: str) -> list[Step]:
    (block,) = fenced_blocks(markdown, "doc.md")
    return block.steps()


def test_every_shell_block_of_the_docs_is_marked_and_every_runnable_one_parses() -> None:
    """README.md and docs/*.md: no shell block without a marker, a reason for each one not
    run, and commands for each one run."""
    blocks = shell_blocks(ROOT)
    assert blocks
    for block in blocks:
        assert block.marker is not None
        if block.marker.runnable:
            assert block.steps(), block.where
        else:
            assert block.marker.reason, block.where


def test_the_readme_serve_block_shows_its_answer() -> None:
    """The README's serve + curl block is run with serve and checks the JSON it shows."""
    (block,) = [b for b in shell_blocks(ROOT) if b.path == "README.md" and "curl" in b.body]
    assert block.marker == Marker(runnable=True, serve=True)
    serve, curl = block.steps()
    assert serve.starts_serve and serve.expected is None
    assert curl.expected is not None and curl.expected.kind == "json"


@pytest.mark.parametrize(
    ("comment", "marker"),
    [
        ("<!-- runnable -->", Marker(runnable=True)),
        ("<!-- runnable: serve -->", Marker(runnable=True, serve=True)),
        ("<!-- runnable: timeout=90 serve -->", Marker(runnable=True, serve=True, timeout_s=90)),
        ("<!--runnable:timeout=5-->", Marker(runnable=True, timeout_s=5)),
        ("<!-- not-runnable: needs a person -->", Marker(runnable=False, reason="needs a person")),
    ],
    ids=["plain", "serve", "timeout-and-serve", "no-spaces", "not-runnable"],
)
def test_markers_are_read(comment: str, marker: Marker) -> None:
    """A marker on the line before the fence, blank lines between allowed, gives its options."""
    (block,) = fenced_blocks(f"text\n{comment}\n\n```bash\necho hi\n```\n", "doc.md")
    assert block.marker == marker


@pytest.mark.parametrize(
    ("comment", "says"),
    [
        ("<!-- not-runnable -->", "needs its reason"),
        ("<!-- not-runnable:   -->", "needs its reason"),
        ("<!-- runnable: fast -->", "unknown runnable option 'fast'"),
        ("<!-- runnable: timeout=0 -->", "0 < timeout"),
        ("<!-- runnable: timeout=soon -->", "0 < timeout"),
        ("<!-- runable -->", "unreadable marker"),
        ("<!-- runnable", "unreadable marker"),
    ],
    ids=["no-reason", "blank-reason", "unknown-option", "zero-timeout", "word-timeout",
         "misspelt", "unclosed"],
)  # fmt: skip
def test_bad_markers_are_refused_naming_the_fix(comment: str, says: str) -> None:
    """A marker that cannot be read is an error with the block's place, never ignored."""
    with pytest.raises(DocsBlockError, match=says) as caught:
        fenced_blocks(f"{comment}\n```bash\necho hi\n```\n", "doc.md")
    assert "doc.md:2" in str(caught.value)


def test_an_unmarked_shell_block_fails_naming_its_place(tmp_path: Path) -> None:
    """shell_blocks raises for every unmarked shell block, with file and line and the fix."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```bash\necho hi\n```\n")
    (tmp_path / "docs" / "a.md").write_text("```\ncurl -s localhost:8000/healthz\n```\n")
    with pytest.raises(DocsBlockError) as caught:
        shell_blocks(tmp_path)
    assert "README.md:3: a shell block with no marker" in str(caught.value)
    assert "docs/a.md:1: a shell block with no marker" in str(caught.value)
    assert "<!-- not-runnable: REASON -->" in str(caught.value)


def test_a_marker_before_a_block_that_is_not_shell_fails(tmp_path: Path) -> None:
    """A marker on a python block (a marker that would test nothing) is an error."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- runnable -->\n```python\nprint(1)\n```\n")
    with pytest.raises(DocsBlockError, match=re.escape("README.md:2: a marker before a block")):
        shell_blocks(tmp_path)


@pytest.mark.parametrize(
    ("language", "body", "shell"),
    [
        ("bash", "echo hi", True),
        ("console", "$ harombe ls", True),
        ("sh", "ls", True),
        ("", "curl -s localhost:8000/healthz", True),
        ("text", "$ harombe ls", True),
        ("", "harombe serve: http://127.0.0.1:8000", False),
        ("python", "print(1)", False),
        ("yaml", "a: curl", False),
    ],
    ids=["bash", "console", "sh", "untagged-curl", "untagged-prompt", "output", "python", "yaml"],
)
def test_which_blocks_are_shell_blocks(language: str, body: str, shell: bool) -> None:
    """Shell languages, and any block with a line starting `curl ` or `$ `."""
    (block,) = fenced_blocks(f"```{language}\n{body}\n```\n", "doc.md")
    assert block.is_shell is shell


def test_script_blocks_split_into_commands_and_shown_output() -> None:
    """Column-0 `#` lines after a command are its output, a trailing `{` comment is too,
    indented comments and comments before the first command are prose, `\\` continues."""
    steps = one_block(
        "<!-- runnable -->\n"
        "```bash\n"
        "# prose before any command\n"
        "scripts/x.sh    # what it does\n"
        "                # and more of it\n"
        'curl -s localhost:8000/healthz   # {"status":"ok"}\n'
        "curl -s localhost:8000/execute \\\n"
        '     -d \'{"code": "print(1)"}\'\n'
        '# {"stdout":"1\\n",\n'
        '#  "result":null}\n'
        "\n"
        "echo two lines\n"
        "# one\n"
        "#\n"
        "# three\n"
        "```\n"
    )
    assert steps == [
        Step("scripts/x.sh    # what it does", 4),
        Step('curl -s localhost:8000/healthz   # {"status":"ok"}', 6,
             Expected("json", '{"status":"ok"}')),
        Step("curl -s localhost:8000/execute \\\n     -d '{\"code\": \"print(1)\"}'", 7,
             Expected("json", '{"stdout":"1\\n",\n "result":null}')),
        Step("echo two lines", 12, Expected("text", "one\n\nthree")),
    ]  # fmt: skip


def test_a_quote_open_at_the_end_of_a_line_continues_the_command() -> None:
    """A quoted argument over several lines is one command; a here-string is no here-doc."""
    steps = one_block(
        "<!-- runnable -->\n```bash\npython3 -c 'a = 1\n# not output\nprint(a)'\n# 1\n"
        "cat <<< hi\n# hi\n```\n"
    )
    assert steps == [
        Step("python3 -c 'a = 1\n# not output\nprint(a)'", 3, Expected("text", "1")),
        Step("cat <<< hi", 7, Expected("text", "hi")),
    ]


def test_console_blocks_read_prompts_and_output() -> None:
    """`$ ` lines are commands, the lines up to the next one their output."""
    steps = one_block(
        "<!-- runnable -->\n```console\n$ echo 42\n42\n$ true\n$ printf 'a\\nb\\n'\na\nb\n```\n"
    )
    assert steps == [
        Step("echo 42", 3, Expected("text", "42")),
        Step("true", 5),
        Step("printf 'a\\nb\\n'", 6, Expected("text", "a\nb")),
    ]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('curl x  # {"a": 1}\n# {"a": 1}', "both in a trailing comment and on the lines after"),
        ('curl x\n# {"a": }', "not JSON"),
        ("# only prose", "no command"),
        (".venv/bin/harombe serve", "mark the block <!-- runnable: serve -->"),
        ("cat <<EOF\nhi\nEOF", "here-document"),
    ],
    ids=["output-twice", "bad-json", "no-command", "serve-unmarked", "heredoc"],
)
def test_unreadable_blocks_are_refused(body: str, says: str) -> None:
    """A runnable block whose commands or output cannot be read is an error, never a pass."""
    with pytest.raises(DocsBlockError, match=says):
        one_block(f"<!-- runnable -->\n```bash\n{body}\n```\n")


def test_a_serve_block_has_one_serve_and_no_output_for_it() -> None:
    """Two serves, or output shown for serve, are refused."""
    with pytest.raises(DocsBlockError, match="more than one"):
        one_block("<!-- runnable: serve -->\n```bash\nharombe serve\nharombe serve\n```\n")
    with pytest.raises(DocsBlockError, match="no output to check"):
        one_block('<!-- runnable: serve -->\n```bash\nharombe serve  # {"a": 1}\n```\n')


@pytest.mark.parametrize(
    ("command", "serves"),
    [
        (".venv/bin/harombe serve     # http://127.0.0.1:8000", True),
        ("harombe serve --port 8000", True),
        ("HAROMBE__SECURITY__HITL__ENABLED=false harombe serve", True),
        ("harombe serve | tee log", False),
        ("harombe run x.py", False),
        ("echo harombe serve", False),
        ("harombe 'unclosed", False),
    ],
    ids=["venv-path", "options", "assignment", "pipe", "run", "echo", "unparsable"],
)
def test_serve_commands_are_recognised(command: str, serves: bool) -> None:
    """Only `harombe serve` on its own (by any path) is started in the background."""
    assert is_serve_command(command) is serves


@pytest.mark.parametrize(
    ("command", "comment"),
    [
        ("curl -s x   # {\"a\": 1}", " {\"a\": 1}"),
        ("echo '# not a comment'", None),
        ('echo "# nor this" # but this', " but this"),
        ("echo a#b", None),
        ("echo ${#x}", None),
        ("echo \\# x", None),
        ("curl x \\\n  -d '{}'  # last line", " last line"),
    ],
    ids=["json", "single-quoted", "double-quoted", "inside-word", "expansion", "escaped",
         "continued"],
)  # fmt: skip
def test_trailing_comments_are_found_outside_quotes(command: str, comment: str | None) -> None:
    """A `#` starts a comment only unquoted and at the start of a word, as in bash."""
    assert trailing_comment(command) == comment


@pytest.mark.parametrize(
    ("shown", "stdout", "why"),
    [
        ('{"a": 1, "b": "x"}', '{"b":"x","a":1}\n', None),
        ('{"a": 1}', '{"a": 1, "b": 2}', "keys shown ['a'], got ['a', 'b']"),
        ('{"a": 1, …}', '{"a": 1, "b": 2}', None),
        ('{"a": 1, …}', '{"b": 2}', "keys shown"),
        ('{"id": "sandbox-…"}', '{"id": "sandbox-1a2b"}', None),
        ('{"id": "sandbox-…"}', '{"id": "box-1a2b"}', "$.id: shown 'sandbox-…'"),
        ('{"t": …}', '{"t": [1, {"x": null}]}', None),
        ('{"ok": false}', '{"ok": 0}', "$.ok: shown False, got 0"),
        ('{"n": 1}', '{"n": 1.0}', None),
        ('{"r": null}', '{"r": "None"}', "$.r: shown None"),
        ("[1, …]", "[1, 2, 3]", None),
        ("[1, …]", "[2]", "$[0]: shown 1, got 2"),
        ("[1, 2]", "[1, 2, 3]", "2 elements shown, got 3"),
        ('{"a": 1}', "Internal Server Error", "stdout is not JSON"),
        ("42", "42\n", None),
        ("42", "43\n", "line 1: shown '42', got '43'"),
        ("a\nb", "a\n", "2 lines shown, 1 printed"),
        ("took … s", "took 1.5 s", None),
    ],
    ids=["json-equal", "json-extra-key", "json-more-keys", "json-missing-key", "string-wild",
         "string-wrong", "any-value", "bool-vs-int", "int-float", "null", "array-open",
         "array-wrong", "array-longer", "not-json", "text", "text-wrong", "text-short",
         "text-wild"],
)  # fmt: skip
def test_output_is_compared_as_the_docs_say(shown: str, stdout: str, why: str | None) -> None:
    """JSON compared as values with … placeholders; text line by line."""
    expected = Expected("json", shown) if shown.startswith(("{", "[")) else Expected("text", shown)
    found = mismatch(expected, stdout)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found, found

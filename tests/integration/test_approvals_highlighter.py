"""The approvals page's code highlighter, run in a real headless Chromium (no service: the
page's file is loaded on its own, and its script exposes ``approvalsPage.tokenize``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources

import pytest
from playwright.async_api import Page, async_playwright

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"


HIGHLIGHTS = [
    pytest.param(
        "python",
        'x = "a#b"  # c\nif x: pass\ns = """m\nl"""\n',
        [("str", '"a#b"'), ("com", "# c"), ("kw", "if"), ("kw", "pass"), ("str", '"""m\nl"""')],
        id="python-hash-in-string-and-triple-quotes",
    ),
    pytest.param(
        "python",
        "n = 6_000 * 1.5e3  # big\nyield None",
        [("num", "6_000"), ("num", "1.5e3"), ("com", "# big"), ("kw", "yield"), ("kw", "None")],
        id="python-numbers",
    ),
    pytest.param(
        "javascript",
        "const a = `t ${x}` // c\n/* b\nc */ let n = 0x1F; return 'q';",
        [
            ("kw", "const"),
            ("str", "`t ${x}`"),
            ("com", "// c"),
            ("com", "/* b\nc */"),
            ("kw", "let"),
            ("num", "0x1F"),
            ("kw", "return"),
            ("str", "'q'"),
        ],
        id="javascript-template-and-block-comment",
    ),
    pytest.param(
        "shell",
        "echo \"$HOME #x\" 'lit' # note\nx=a#b ${VAR} $1",
        [
            ("kw", "echo"),
            ("str", '"$HOME #x"'),
            ("str", "'lit'"),
            ("com", "# note"),
            ("var", "${VAR}"),
            ("var", "$1"),
        ],
        id="shell-hash-only-after-space",
    ),
    pytest.param(
        "python",
        's = "unterminated\nprint(1)',
        [("str", '"unterminated'), ("kw", "print"), ("num", "1")],
        id="python-open-string-stops-at-line-end",
    ),
    pytest.param("ruby", "puts 'x' # y", [], id="unknown-language-is-plain"),
]


@pytest.fixture(scope="module")
async def static_page() -> AsyncIterator[Page]:
    """The page's files loaded on their own: its script runs, with no key."""
    static = resources.files("harombe.service").joinpath("static")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        page = await browser.new_page()
        html = static.joinpath("approvals.html").read_text()
        await page.set_content(html.replace('<script src="/approvals/app.js"></script>', ""))
        await page.add_script_tag(content=static.joinpath("approvals.js").read_text())
        yield page
        await browser.close()


@pytest.mark.parametrize(("language", "code", "expected"), HIGHLIGHTS)
async def test_the_highlighter_marks_keywords_strings_and_comments(
    static_page: Page, language: str, code: str, expected: list[tuple[str, str]]
) -> None:
    """Tokens cover the code exactly; keywords, strings, comments, numbers, variables marked."""
    tokens = await static_page.evaluate(
        "([code, language]) => window.approvalsPage.tokenize(code, language)", [code, language]
    )
    assert "".join(text for _, text in tokens) == code
    assert [(kind, text) for kind, text in tokens if kind] == expected

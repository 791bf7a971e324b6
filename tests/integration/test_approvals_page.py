"""The approvals page in a real headless Chromium, against the live service and real gVisor.

The service runs in-process on uvicorn (127.0.0.1, a free port) with a client token, an
approver token, a known approval key, and the HITL gate on with the page as its approver.
Every ``code_execute`` needs approval (the default rules); the rules below add a line-numbered
reason for marked code, and a short timeout for code marked to expire.
``HAROMBE_UPDATE_SCREENSHOT=1`` rewrites ``docs/approvals.png`` from the held call of the
first test.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from harombe.security.runtime.docker import DockerManager
from harombe.service.state import Service
from tests.integration.service_support import APPROVAL_KEY, live_service, service_config

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CLIENT_TOKEN = "client-token-of-the-page-tests"
APPROVER_TOKEN = "approver-token-of-the-page-tests"
PERSON_MARK = "NEEDS_A_PERSON"
EXPIRE_MARK = "LET_IT_EXPIRE"
EXPIRE_S = 6
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "approvals.png"
#: Long enough for a cold gVisor sandbox on two shared cores.
CALL_S = 180.0
UI_MS = 60_000

CONFIG: dict[str, Any] = {
    "security": {
        "hitl": {
            "rules": [
                {
                    "tools": ["code_execute"],
                    "risk": "critical",
                    "timeout": 120,
                    "conditions": [{"param": "code", "matches": PERSON_MARK}],
                    "description": "Marked for a person",
                },
                {
                    "tools": ["code_execute"],
                    "risk": "critical",
                    "timeout": EXPIRE_S,
                    "conditions": [{"param": "code", "matches": EXPIRE_MARK}],
                    "description": "Marked to expire",
                },
            ]
        }
    },
    "service": {
        "tokens": [
            {"name": "agent", "token": CLIENT_TOKEN},
            {"name": "reviewer", "token": APPROVER_TOKEN, "role": "approver"},
        ]
    },
}

#: Markup in code must show as text; the mark on line 4 is the reason's line.
HELD_CODE = (
    "# shown as text, never markup: </textarea><script>window.pwned = 1</script>\n"
    "def answer() -> int:\n"
    "    return 6 * 7  # the answer\n"
    f'print("{PERSON_MARK}", answer())\n'
)


@dataclass
class Watched:
    """A page and what its console said."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def assert_clean(self, allowed: Callable[[str], bool] = lambda text: False) -> None:
        unexpected = [text for text in self.errors if not allowed(text)]
        assert unexpected == [], unexpected


@pytest.fixture(scope="module")
async def live(docker_manager: DockerManager) -> AsyncIterator[tuple[Service, str]]:
    """The live service and its address; it stops (removing its sandboxes) after the module."""
    async with live_service(docker_manager, service_config(CONFIG, hitl=True)) as started:
        yield started


@pytest.fixture(scope="module")
def base_url(live: tuple[Service, str]) -> str:
    return live[1]


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        await chromium.close()


@pytest.fixture
async def agent(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client token's HTTP client (an agent: it runs code, it cannot approve)."""
    headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=CALL_S) as client:
        yield client


@pytest.fixture
async def reviewer(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An approver token's HTTP client."""
    headers = {"Authorization": f"Bearer {APPROVER_TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=CALL_S) as client:
        yield client


@pytest.fixture
async def open_page(browser: Browser, base_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Opens the page (with the approval key unless told otherwise) in a fresh context."""
    contexts = []

    async def opener(query: str = f"?key={APPROVAL_KEY}") -> Watched:
        context = await browser.new_context(viewport={"width": 1280, "height": 860})
        contexts.append(context)
        page = await context.new_page()
        watched = Watched(page)
        page.on("console", lambda m: watched.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: watched.errors.append(f"uncaught: {exc}"))
        await page.goto(f"{base_url}/approvals{query}")
        return watched

    yield opener
    for context in contexts:
        await context.close()


async def held_approval(
    reviewer: httpx.AsyncClient, match: Callable[[dict[str, Any]], bool]
) -> Any:
    """The first held approval ``match`` accepts, once the service holds one."""
    for _ in range(int(CALL_S * 4)):
        listed = await reviewer.get("/v1/approvals")
        assert listed.status_code == 200, listed.text
        found = [a for a in listed.json()["approvals"] if match(a)]
        if found:
            return found[0]
        await asyncio.sleep(0.25)
    raise AssertionError("no matching approval was held")


async def new_sandbox(agent: httpx.AsyncClient, reviewer: httpx.AsyncClient) -> tuple[str, str]:
    """A sandbox of the agent's and the approval of its creation (held like any code, and
    approved over HTTP)."""
    creating = asyncio.ensure_future(agent.post("/v1/sandboxes", json={"language": "python"}))
    held = await held_approval(
        reviewer, lambda a: a["sandbox_id"] is None and not a["params"].get("code")
    )
    decided = await reviewer.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    created = await creating
    assert created.status_code == 201, created.text
    return str(created.json()["sandbox_id"]), str(held["id"])


def execute(agent: httpx.AsyncClient, sandbox_id: str, code: str) -> asyncio.Future[httpx.Response]:
    """Starts a (held) run; the future is its answer."""
    body = {"language": "python", "code": code}
    return asyncio.ensure_future(agent.post(f"/v1/sandboxes/{sandbox_id}/execute", json=body))


def card_of(watched: Watched, text: str) -> Locator:
    return watched.page.locator("article.approval", has_text=text)


async def test_approve_once_runs_the_held_call(
    agent: httpx.AsyncClient, reviewer: httpx.AsyncClient, open_page: Any, tmp_path: Path
) -> None:
    """A held run shows risk, line-numbered reasons and highlighted code; Approve runs it."""
    sandbox_id, _ = await new_sandbox(agent, reviewer)
    watched = await open_page()
    assert "key=" not in watched.page.url, "the key must leave the address bar"
    call = execute(agent, sandbox_id, HELD_CODE)
    card = card_of(watched, PERSON_MARK)
    await expect(card).to_be_visible(timeout=UI_MS)
    await expect(card.locator("h3 .risk")).to_have_text("CRITICAL")
    await expect(card.locator("ul.reasons")).to_contain_text(
        f"Line 4: CRITICAL Marked for a person — code matches '{PERSON_MARK}'"
    )
    await expect(card.locator("pre.code .line")).to_have_count(4)
    await expect(card.locator('.line[data-line="4"]')).to_have_class("line flagged")
    await expect(card.locator(".tok-kw")).to_have_text(["def", "return", "print"])
    await expect(card.locator(".tok-str")).to_have_text([f'"{PERSON_MARK}"'])
    await expect(card.locator(".tok-com").first).to_contain_text("</textarea><script>")
    await expect(card.locator(".countdown")).to_have_text(re.compile(r"^\d+ s left$"))
    await expect(card.locator("dl.params")).to_contain_text(sandbox_id)
    await expect(card.locator(".sandbox")).to_have_text(sandbox_id)
    await expect(card.locator(".tenant")).to_have_text("agent")
    assert await card.locator("script").count() == 0
    assert await watched.page.evaluate("window.pwned") is None
    shot = tmp_path / "approvals.png"
    await watched.page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("HAROMBE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)

    await card.get_by_role("button", name="Approve once").click()
    answer = await asyncio.wait_for(call, CALL_S)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == f"{PERSON_MARK} 42\n"
    assert answer.json()["approval"]["decided_by"] == "approvals_page"
    await expect(card).to_have_count(0)
    watched.assert_clean()


async def test_a_call_left_alone_times_out_and_is_denied(
    agent: httpx.AsyncClient, reviewer: httpx.AsyncClient, open_page: Any
) -> None:
    """Nobody answers: the call is denied at the rule's timeout and the page drops it."""
    sandbox_id, _ = await new_sandbox(agent, reviewer)
    watched = await open_page()
    call = execute(agent, sandbox_id, f'print("{EXPIRE_MARK}")')
    card = card_of(watched, EXPIRE_MARK)
    await expect(card).to_be_visible(timeout=UI_MS)
    approval_id = await card.get_attribute("data-id")
    await expect(card.locator(".countdown")).to_have_text(re.compile(r"^\d+ s left$"))
    answer = await asyncio.wait_for(call, CALL_S)
    assert answer.status_code == 403, answer.text
    assert answer.json()["kind"] == "ApprovalDeniedError"
    assert f"no answer within {EXPIRE_S} s" in answer.json()["message"]
    await expect(card).to_have_count(0)
    expired = watched.page.locator(
        '#feed li[data-type="approval.expired"]', has_text=str(approval_id)
    )
    await expect(expired).to_have_count(1)
    watched.assert_clean()


async def test_deny_refuses_and_approve_for_sandbox_covers_the_same_call(
    agent: httpx.AsyncClient, reviewer: httpx.AsyncClient, open_page: Any
) -> None:
    """Deny (by keyboard) answers 403; approve-for-sandbox lets the same code run unasked."""
    sandbox_id, _ = await new_sandbox(agent, reviewer)
    watched = await open_page()
    code = f'print("{PERSON_MARK}", "again")'
    denied_call = execute(agent, sandbox_id, code)
    card = card_of(watched, PERSON_MARK)
    await expect(card).to_be_visible(timeout=UI_MS)
    await card.get_by_role("button", name="Deny").focus()
    await watched.page.keyboard.press("Enter")
    denied = await asyncio.wait_for(denied_call, CALL_S)
    assert denied.status_code == 403, denied.text
    assert denied.json()["kind"] == "ApprovalDeniedError"
    assert "denied by approvals_page" in denied.json()["message"]
    await expect(card).to_have_count(0)

    granted_call = execute(agent, sandbox_id, code)
    await expect(card).to_be_visible(timeout=UI_MS)
    await card.get_by_role("button", name="Approve for this sandbox").click()
    granted = await asyncio.wait_for(granted_call, CALL_S)
    assert granted.status_code == 200, granted.text
    assert granted.json()["stdout"] == f"{PERSON_MARK} again\n"

    again = await asyncio.wait_for(execute(agent, sandbox_id, code), CALL_S)
    assert again.status_code == 200, again.text
    assert again.json()["stdout"] == f"{PERSON_MARK} again\n"
    assert again.json()["approval"]["decided_by"] == "sandbox_grant"
    await expect(watched.page.locator("article.approval")).to_have_count(0)
    watched.assert_clean()


async def test_the_feed_shows_decisions_and_tool_calls_live(
    agent: httpx.AsyncClient, reviewer: httpx.AsyncClient, open_page: Any
) -> None:
    """A decision made over HTTP and the call it let through appear in the open page's feed."""
    watched = await open_page()
    await expect(watched.page.locator("#conn")).to_have_text("live", timeout=UI_MS)
    sandbox_id, approval_id = await new_sandbox(agent, reviewer)
    feed = watched.page.locator("#feed li")
    called = feed.filter(has_text=f"create_sandbox by agent in {sandbox_id}: ok")
    await expect(called).to_have_count(1, timeout=UI_MS)
    decided = feed.filter(has_text=f"approve by reviewer — id {approval_id}")
    await expect(decided).to_have_count(1)
    rows = await feed.evaluate_all("rows => rows.map(r => [r.dataset.type, r.textContent])")
    mine = [kind for kind, text in rows if approval_id in text or sandbox_id in text]
    assert mine == ["tool.called", "approval.decided", "approval.requested"], "newest first"
    assert len(rows) <= 200
    watched.assert_clean()


async def test_the_page_reconnects_when_the_feed_drops(
    live: tuple[Service, str],
    agent: httpx.AsyncClient,
    reviewer: httpx.AsyncClient,
    open_page: Any,
) -> None:
    """The service ends the feed's stream: the page says so, reconnects, and shows new calls."""
    watched = await open_page()
    conn = watched.page.locator("#conn")
    await expect(conn).to_have_text("live", timeout=UI_MS)
    live[0].feed.close()  # ends every subscriber's stream, as a shutdown does
    await expect(conn).to_contain_text("reconnecting", timeout=UI_MS)
    await expect(conn).to_have_text("live", timeout=UI_MS)
    sandbox_id, _ = await new_sandbox(agent, reviewer)
    called = watched.page.locator("#feed li", has_text=f"create_sandbox by agent in {sandbox_id}")
    await expect(called).to_have_count(1, timeout=UI_MS)
    watched.assert_clean()


async def test_a_client_cannot_decide_and_the_page_needs_the_key(
    agent: httpx.AsyncClient, reviewer: httpx.AsyncClient, open_page: Any
) -> None:
    """A client token gets 403 deciding; without the key (or with a wrong one) the page says
    what it needs, and entering the key connects it."""
    sandbox_id, _ = await new_sandbox(agent, reviewer)
    call = execute(agent, sandbox_id, f'print("{PERSON_MARK}", "self")')
    held = await held_approval(reviewer, lambda a: "self" in str(a["params"].get("code")))
    refused = await agent.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
    assert refused.status_code == 403, refused.text
    assert "a client token cannot approve" in refused.json()["message"]
    assert (await reviewer.get(f"/v1/approvals/{held['id']}")).status_code == 200, "still held"
    await reviewer.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
    assert (await asyncio.wait_for(call, CALL_S)).status_code == 403

    keyless = await open_page("")
    notice = keyless.page.locator("#notice")
    await expect(notice).to_be_visible()
    await expect(notice).to_contain_text("This page needs the service's approval key")
    await expect(keyless.page.locator("#conn")).to_have_text("not connected")
    keyless.assert_clean()

    wrong = await open_page("?key=not-the-key")
    await expect(wrong.page.locator("#notice")).to_contain_text("The approval key was refused")
    wrong.assert_clean(allowed=lambda text: text.startswith("Failed to load resource"))
    await wrong.page.get_by_label("Approval key").fill(APPROVAL_KEY)
    await wrong.page.get_by_role("button", name="Use this key").click()
    await expect(wrong.page.locator("#conn")).to_have_text("live", timeout=UI_MS)
    await expect(wrong.page.locator("#notice")).to_be_hidden()

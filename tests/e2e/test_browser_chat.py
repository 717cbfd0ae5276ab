"""The browser chat page in a real headless Chromium against a real daphne server.

Signs in, chats with an agent (the reply streams in), and approves a gated tool call with the
page's own button. Skips (with the reason) when Chromium or Playwright is not installed.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "_artifacts"

pytestmark = pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture
def page(daphne_server):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(daphne_server.url + "/")
        page.fill("input[name=username]", "e2e")
        page.fill("input[name=password]", "e2e-password")
        page.click("button[type=submit]")
        page.wait_for_selector("#composer")
        yield page
        context.close()
        browser.close()


def _send(page, text: str) -> None:
    page.fill("#input", text)
    page.click("#send")


def test_chat_page_streams_a_reply(page):
    page.select_option("#agent", "coder")
    _send(page, "hello from the browser")
    reply = page.locator(".msg.assistant").last
    reply.wait_for()
    page.wait_for_function("document.querySelector('.msg.assistant').textContent.includes('hello from the browser')")
    assert reply.inner_text().startswith("Mock reply from coder")
    # The new conversation shows in the sidebar, titled from the first message.
    page.wait_for_selector("#conversations a:has-text('hello from the browser')")


def test_chat_page_approves_a_tool_call(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, '/tool write_file {"path": "from-browser.txt", "content": "approved in the browser"}\nsave it')
    card = page.locator(".tool[data-tool-call-id]").first
    card.locator("button.approve").wait_for()
    assert "awaiting input" in card.locator(".state").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-awaiting-approval.png"))
    card.locator("button.approve").click()
    page.wait_for_selector(".tool .state.succeeded")
    page.wait_for_function("[...document.querySelectorAll('.msg.assistant')].some(e => e.textContent.includes('Tool write_file ok'))")
    written = daphne_server.workspaces / "coder" / "from-browser.txt"
    assert written.read_text() == "approved in the browser"
    page.screenshot(path=str(ARTIFACTS / "chat-approved.png"))


def test_chat_page_denies_a_tool_call(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, '/tool write_file {"path": "denied.txt", "content": "nope"}')
    card = page.locator(".tool[data-tool-call-id]").first
    card.locator("button.deny").click()
    page.wait_for_selector(".tool .state.denied")
    assert not (daphne_server.workspaces / "coder" / "denied.txt").exists()


def test_admin_shows_claude_md_beside_the_prompt(daphne_server):
    """Admins edit an agent's prompt with the workspace's CLAUDE.md shown beside it."""
    sync_api = pytest.importorskip("playwright.sync_api")
    workspace = daphne_server.workspaces / "dev_efficiency_analyst"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "CLAUDE.md").write_text("# 项目说明\nMetrics live in data/metrics.csv; cite file names.")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                    "--disable-background-networking", "--disable-component-update"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(15_000)
        page.goto(daphne_server.url + "/admin/login/?next=/admin/agents_app/agent/")
        page.fill("input[name=username]", "e2e-admin")
        page.fill("input[name=password]", "e2e-admin-password")
        page.click("input[type=submit]")
        page.click("text=dev_efficiency_analyst")
        page.wait_for_selector("textarea[name=system_prompt]")
        assert "研发效能分析师" in page.input_value("textarea[name=system_prompt]")
        preview = page.locator(".field-claude_md_preview pre")
        assert "Metrics live in data/metrics.csv" in preview.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "admin-agent.png"), full_page=False)
        browser.close()

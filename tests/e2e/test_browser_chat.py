"""The browser chat page in a real headless Chromium against a real daphne server.

Covers the issue's list: sign in; pick an agent; a streamed reply rendered as Markdown with a
highlighted code block; hostile HTML in a reply runs nothing (sanitizer and CSP); stop; regenerate
and edit-and-resend; rename, search and delete; approve, deny (with a reason) and always-allow; a
decision on /approvals resuming a run another tab streams; a reconnect after the connection is
cut, without duplicated text; the timeline view; dark mode; the 390 px phone layout.

The tests write screenshots to ``docs/screenshots/`` (shown in the README). Without Chromium or
Playwright they skip, except under ``CI``, where they fail.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import requests

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--lang=en-US"]
WRITE = '/tool write_file {"path": "%s", "content": "%s"}'


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        _unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright Python package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _login(page, server, username="e2e", password="e2e-password"):
    page.goto(server.url + "/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#composer")
    # The composer is in the HTML before the scripts at the end of the body have run: a key
    # pressed before the load event finds no handler (seen under CI load: the first messages
    # were typed into a page whose chat.js had not attached its Enter handler yet).
    page.wait_for_load_state("load")


@pytest.fixture
def context(browser, daphne_server):
    context = browser.new_context(viewport={"width": 1280, "height": 820}, color_scheme="light")
    context.set_default_timeout(15_000)
    yield context
    context.close()


@pytest.fixture
def page(context, daphne_server):
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    _login(page, daphne_server)
    page.js_errors = errors
    yield page
    assert not errors, f"JavaScript errors on the page: {errors}"


def _send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def _wait_idle(page) -> None:
    """The current run ended: Send is back and no turn is busy."""
    page.wait_for_selector("#send:not([hidden])")
    page.wait_for_function("() => !document.querySelector('.turn.assistant[aria-busy=true]')")


def _last_reply(page):
    return page.locator(".turn.assistant").last


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def _api(server, method: str, path: str, **kwargs):
    return requests.request(method, server.url + path, headers=server.auth, timeout=10, **kwargs)


# --- replies ----------------------------------------------------------------------------------------

def test_browser_reply_streams_as_markdown_with_highlighted_code(page):
    page.select_option("#agent", "coder")
    assert "coder" in page.locator("#agent option:checked").inner_text().lower() or page.input_value("#agent") == "coder"
    page.fill("#input", "Here is **bold** text and a list:")
    # Shift+Enter breaks the line; Enter sends.
    page.press("#input", "Shift+Enter")
    page.keyboard.type("- 第一项 one")
    page.evaluate("""() => { const t = document.querySelector('#input');
        t.value += "\\n\\n```python\\ndef greet(name):\\n    return f'hello {name}'  # 你好\\n```"; }""")
    assert "\n" in page.input_value("#input")
    page.press("#input", "Enter")
    reply = _last_reply(page)
    reply.locator("pre code.hljs").wait_for()
    _wait_idle(page)
    assert reply.locator(".markdown strong").first.inner_text() == "bold"
    assert reply.locator(".markdown li").first.inner_text().startswith("第一项")
    code = reply.locator("pre code.hljs")
    assert "def greet(name):" in code.inner_text()
    assert code.locator(".hljs-keyword").count() >= 1  # highlighted, not just escaped
    assert reply.locator(".code-head .code-lang").inner_text() == "python"
    assert reply.locator(".copy-code").is_visible()
    # The footer shows tokens and cost.
    page.wait_for_function("() => document.querySelector('.turn.assistant:last-child .meta').textContent.includes('$')")
    meta = reply.locator(".meta").inner_text()
    assert "tokens" in meta and "$0.0000" in meta
    # The new conversation shows in the sidebar, titled from the first message.
    page.wait_for_selector("#conversations .conv-title:has-text('Here is **bold** text')")
    _shot(page, "chat")


def test_browser_hostile_reply_runs_nothing(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>\n'
                '[click](javascript:window.__pwned=3) <svg onload="window.__pwned=4"></svg>'
                '<a href="#" onclick="window.__pwned=5">link</a><iframe src="javascript:parent.__pwned=6"></iframe>')
    reply = _last_reply(page)
    reply.locator(".markdown").first.wait_for()
    _wait_idle(page)
    assert page.evaluate("() => window.__pwned") is None
    html = reply.locator(".markdown").first.inner_html()
    assert "onerror" not in html and "<script" not in html and "onload" not in html and "onclick" not in html
    assert "javascript:" not in html and "<iframe" not in html
    # Even markup that escaped a sanitizer could not run: the page's CSP forbids inline script.
    page.evaluate("""() => { const d = document.createElement('div');
        d.innerHTML = '<img src=x onerror="window.__pwned=7">'; document.body.append(d); }""")
    page.wait_for_function("() => [...document.querySelectorAll('img')].some(i => i.complete)")
    assert page.evaluate("() => window.__pwned") is None
    response = page.request.get(daphne_server.url + "/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "object-src 'none'" in policy


# --- controls ---------------------------------------------------------------------------------------

def test_browser_stop_cancels_mid_answer(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, "/drip 60 0.1\nthis answer is long enough to be stopped halfway through, surely")
    reply = _last_reply(page)
    reply.locator(".markdown").first.wait_for()
    page.click("#stop")
    reply.locator(".notice.stopped").wait_for()
    _wait_idle(page)
    run_id = reply.get_attribute("data-run-id")
    assert _api(daphne_server, "GET", f"/v1/agent/runs/{run_id}/timeline").json()["status"] == "cancelled"
    # Reopened later, the stopped turn still says so.
    page.reload()
    page.locator(".turn.assistant .notice.stopped").wait_for()
    # Esc stops too.
    _send(page, "/drip 60 0.1\nanother long answer that Esc will stop before it is done")
    _last_reply(page).locator(".markdown").first.wait_for()
    page.keyboard.press("Escape")
    _last_reply(page).locator(".notice.stopped").wait_for()
    _wait_idle(page)


def test_browser_regenerate_and_edit_last_message(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, "first question")
    _wait_idle(page)
    _send(page, "second question")
    _wait_idle(page)
    page.locator(".turn.assistant").last.locator(".regenerate").click()
    _wait_idle(page)
    assert page.locator(".turn.user").count() == 2
    assert page.locator(".turn.assistant").count() == 2
    assert "Mock reply from coder: second question" in _last_reply(page).inner_text()
    # Edit the last message and resend it: the bubble and the answer change; the old ones go.
    page.locator(".turn.user").last.locator(".edit-last").click()
    assert page.input_value("#input") == "second question"
    page.fill("#input", "/recall\nsecond question, edited")
    page.press("#input", "Enter")
    _wait_idle(page)
    assert page.locator(".turn.user").count() == 2
    assert page.locator(".turn.user .bubble").last.inner_text().endswith("second question, edited")
    answer = _last_reply(page).inner_text()
    # The model's history has the first turn only, not the superseded ones.
    assert "user: first question" in answer and "user: second question" not in answer
    # A reload shows the conversation as it now stands (superseded turns hidden).
    page.reload()
    page.wait_for_selector(".turn.user")
    _wait_idle(page)
    assert page.locator(".turn.user").count() == 2
    assert page.locator(".turn.assistant").count() == 2


def test_browser_rename_search_and_delete_conversations(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, "apples and pears")
    _wait_idle(page)
    page.click("#new-chat")
    _send(page, "bananas for breakfast")
    _wait_idle(page)
    item = page.locator("#conversations li", has_text="bananas for breakfast")
    item.locator(".rename").click()
    page.fill(".rename-input", "香蕉 notes")
    page.press(".rename-input", "Enter")
    page.wait_for_selector("#conversations .conv-title:text-is('香蕉 notes')")
    # Search by content (the title no longer says bananas) and by title.
    page.fill("#search", "breakfast")
    page.wait_for_function("() => document.querySelectorAll('#conversations li').length === 1")
    assert page.locator("#conversations .conv-title").inner_text() == "香蕉 notes"
    page.fill("#search", "apples")
    page.wait_for_selector("#conversations .conv-title:text-is('apples and pears')")
    assert page.locator("#conversations li").count() == 1
    page.fill("#search", "")
    page.wait_for_selector("#conversations .conv-title:text-is('香蕉 notes')")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#conversations li", has_text="香蕉 notes").locator(".delete").click()
    page.wait_for_function("() => ![...document.querySelectorAll('#conversations .conv-title')].some(e => e.textContent === '香蕉 notes')")
    titles = [c["title"] for c in _api(daphne_server, "GET", "/v1/conversations").json()]
    assert "香蕉 notes" not in titles and "apples and pears" in titles
    assert page.locator(".turn").count() == 0  # the open conversation was the deleted one


# --- approvals ----------------------------------------------------------------------------------------

def _awaiting_card(page):
    card = page.locator(".tool-card[data-status=awaiting_input]").last
    card.locator("button.approve").wait_for()
    return card


def test_browser_approve_deny_and_always_allow(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("approved.txt", "approved in the browser") + "\nsave it")
    card = _awaiting_card(page)
    assert "waiting for you" in card.locator(".status").inner_text()
    assert card.locator(".args").inner_text().count("approved.txt") == 1
    page.wait_for_selector("#pending-badge[data-count='1']")
    _shot(page, "approval-card")
    card.locator("button.approve").click()
    page.wait_for_selector(".tool-card[data-status=succeeded]")
    _wait_idle(page)
    assert "Tool write_file ok" in _last_reply(page).inner_text()
    assert (daphne_server.workspaces / "coder" / "approved.txt").read_text() == "approved in the browser"
    done = page.locator(".tool-card[data-status=succeeded]").first
    assert done.get_attribute("open") is None  # collapsed once done
    assert re.search(r"\d+(\.\d+)? (ms|s)", done.locator(".duration").inner_text())
    page.wait_for_selector("#pending-badge[data-count='0']")

    # Deny, with a reason.
    _send(page, WRITE % ("denied.txt", "nope"))
    card = _awaiting_card(page)
    card.locator("input.reason").fill("not in this sprint")
    card.locator("button.deny").click()
    page.wait_for_selector(".tool-card[data-status=denied]")
    _wait_idle(page)
    assert not (daphne_server.workspaces / "coder" / "denied.txt").exists()
    denied = _api(daphne_server, "GET", "/v1/tool-confirmations?status=denied").json()
    assert [c["reason"] for c in denied] == ["not in this sprint"]

    # Always allow in this conversation: the next call here is not asked.
    _send(page, WRITE % ("one.txt", "1"))
    _awaiting_card(page).locator("button.always").click()
    _wait_idle(page)
    _send(page, WRITE % ("two.txt", "2"))
    _wait_idle(page)
    last = _last_reply(page).locator(".tool-card")
    assert last.get_attribute("data-status") == "succeeded"
    assert "allow" in last.locator(".policy").inner_text() and "conversation" in last.locator(".policy").inner_text()
    assert (daphne_server.workspaces / "coder" / "two.txt").read_text() == "2"
    assert _api(daphne_server, "GET", "/v1/tool-confirmations?status=pending").json() == []


def test_browser_approvals_page_resumes_a_run_streaming_in_another_tab(page, context, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("cross-tab.txt", "decided elsewhere") + "\nthen tell me")
    _awaiting_card(page)
    other = context.new_page()
    other.goto(daphne_server.url + "/approvals")
    card = other.locator("#approvals .tool-card").first
    card.locator("button.approve").wait_for()
    assert other.locator("#pending-badge").get_attribute("data-count") == "1"
    assert "cross-tab.txt" in card.locator(".args").inner_text()
    assert card.locator(".conv-ref").inner_text().startswith("/tool write_file")
    _shot(other, "approvals")
    card.locator("button.approve").click()
    other.wait_for_selector("#approvals-empty:not([hidden])")
    # The first tab's stream resumes: the tool ran and the agent answered.
    page.wait_for_selector(".tool-card[data-status=succeeded]")
    _wait_idle(page)
    assert "Tool write_file ok" in _last_reply(page).inner_text()
    page.wait_for_selector("#pending-badge[data-count='0']")
    other.close()


def test_browser_reload_reattaches_to_a_waiting_run(page, daphne_server):
    """A reload (or a link from /approvals) shows the run that is still going, with its card."""
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("after-reload.txt", "still here") + "\nthen answer")
    _awaiting_card(page)
    page.reload()
    card = _awaiting_card(page)
    assert page.locator(".turn.user").count() == 1 and page.locator(".tool-card").count() == 1
    card.locator("button.approve").click()
    page.wait_for_selector(".tool-card[data-status=succeeded]")
    _wait_idle(page)
    assert page.locator(".tool-card").count() == 1  # replayed once, not twice
    assert "Tool write_file ok" in _last_reply(page).inner_text()
    # From history, the card still shows its duration (read from the run's timeline) and the footer its cost.
    page.reload()
    page.wait_for_selector(".tool-card[data-status=succeeded] .duration:not(:empty)")
    assert re.search(r"\d+(\.\d+)? (ms|s)", page.locator(".tool-card .duration").inner_text())
    page.wait_for_function("() => document.querySelector('.turn.assistant .meta').textContent.includes('$')")


# --- reconnect and timeline ----------------------------------------------------------------------------

def test_browser_reconnects_after_a_cut_and_shows_no_duplicates(page, daphne_server):
    """The chat stream is cut after its first delta; the page resumes with Last-Event-ID."""
    cut = {}

    def cut_after_first_delta(route):
        response = route.fetch(timeout=30_000)  # the whole stream (the run ends on its own)
        frames = response.text().split("\n\n")
        first_delta = next(i for i, f in enumerate(frames) if '"event":"agent.delta"' in f)
        cut["sent"] = frames[: first_delta + 1]
        route.fulfill(status=200, headers=dict(response.headers), body="\n\n".join(cut["sent"]) + "\n\n")

    resumed: list[str] = []
    page.on("request", lambda r: resumed.append(r.headers.get("last-event-id", "")) if "/events" in r.url else None)
    page.evaluate("""() => { window.__connTexts = [];
        new MutationObserver(() => { const c = document.querySelector('#conn');
            if (!c.hidden) window.__connTexts.push(c.textContent); })
          .observe(document.querySelector('#conn'), {attributes: true, childList: true, subtree: true}); }""")
    page.route("**/v1/agent/chat", cut_after_first_delta)
    page.select_option("#agent", "coder")
    text = "one two three four five six seven eight nine ten eleven twelve"
    _send(page, f"/drip 12 0.05\n{text}")
    _wait_idle(page)
    page.unroute("**/v1/agent/chat")
    assert _last_reply(page).locator(".markdown").inner_text().strip() == f"Mock reply from coder: {text}"
    assert resumed and resumed[0].isdigit() and int(resumed[0]) >= 2
    assert any("reconnecting" in t.lower() for t in page.evaluate("() => window.__connTexts"))
    assert page.locator("#conn").is_hidden()


def test_browser_timeline_view(page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("timeline.txt", "for the timeline") + "\nwrite it down")
    _awaiting_card(page).locator("button.approve").click()
    _wait_idle(page)
    _last_reply(page).locator(".open-timeline").click()
    dialog = page.locator("#timeline-dialog")
    dialog.locator(".steps").wait_for()
    facts = dialog.locator(".facts").inner_text()
    for label in ("Status", "Engine", "Provider", "Model", "Tokens", "Cost", "Duration"):
        assert label.lower() in facts.lower()
    assert "local" in facts and "mock-1" in facts and "$0.000000" in facts
    tool_step = dialog.locator(".step.tool")
    assert "write_file" in tool_step.inner_text() and "succeeded" in tool_step.inner_text()
    assert "waiting for approval" in tool_step.inner_text()
    assert dialog.locator(".step", has_text="agent.end").count() == 1
    _shot(page, "timeline")
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.querySelector('#timeline-dialog').open")


# --- themes, phone, accessibility ----------------------------------------------------------------------

def test_browser_dark_mode_follows_the_system_and_the_toggle(browser, daphne_server):
    context = browser.new_context(viewport={"width": 1280, "height": 820}, color_scheme="dark")
    page = context.new_page()
    page.set_default_timeout(15_000)
    _login(page, daphne_server)
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(21, 23, 28)"  # the dark palette, from the system preference
    page.select_option("#agent", "coder")
    _send(page, "Dark mode check: `inline code` and\n```js\nconst answer = 42; // 答案\n```")
    _wait_idle(page)
    _shot(page, "dark")
    page.click("#theme-toggle")  # the toggle wins over the system, and is remembered
    assert page.evaluate("() => document.documentElement.dataset.theme") == "light"
    page.reload()
    page.wait_for_selector("#composer")
    assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") == "rgb(247, 247, 248)"
    context.close()


def test_browser_phone_layout(browser, daphne_server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                                  has_touch=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    _login(page, daphne_server)
    assert page.locator("#sidebar").bounding_box()["x"] < 0  # off-canvas until asked for
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("phone.txt", "from a phone"))
    _awaiting_card(page)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    buttons = page.locator(".tool-card .buttons button")
    for i in range(buttons.count()):
        box = buttons.nth(i).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    _shot(page, "phone")
    page.locator(".tool-card button.approve").click()
    _wait_idle(page)
    page.click("#menu")
    assert page.get_attribute("#menu", "aria-expanded") == "true"
    page.wait_for_function("() => document.querySelector('#sidebar').getBoundingClientRect().x >= 0")
    assert page.locator("#conversations li").count() >= 1
    page.keyboard.press("Escape")
    assert page.get_attribute("#menu", "aria-expanded") == "false"
    context.close()


def test_browser_accessibility_basics(page):
    # Every form control has an accessible name.
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
        .filter(e => !e.closest('[hidden]') && !e.labels?.length && !e.getAttribute('aria-label')
                     && !e.textContent.trim() && !e.getAttribute('aria-labelledby')).map(e => e.outerHTML)""")
    assert unnamed == []
    assert page.get_attribute("#messages", "role") == "log"
    assert page.get_attribute("#status", "aria-live") == "polite"
    # Focus order: the skip link first, and it leads to the message box.
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className") == "skip"
    page.keyboard.press("Enter")
    page.keyboard.type("typed after skipping")
    assert page.input_value("#input") == "typed after skipping"


def test_browser_sign_out(page, daphne_server):
    page.click("#logout")  # a POST with the CSRF token (Django refuses a GET logout)
    page.wait_for_selector("input[name=username]")
    page.goto(daphne_server.url + "/approvals")
    page.wait_for_selector("input[name=username]")  # signed out: the login page again


# --- admin ---------------------------------------------------------------------------------------------

def _admin_login(page, server, next_path: str) -> None:
    page.goto(server.url + "/admin/login/?next=" + next_path)
    page.fill("input[name=username]", "e2e-admin")
    page.fill("input[name=password]", "e2e-admin-password")
    page.click("input[type=submit]")


def test_admin_shows_claude_md_beside_the_prompt(browser, daphne_server):
    """Admins edit an agent's prompt with the workspace's CLAUDE.md shown beside it."""
    workspace = daphne_server.workspaces / "dev_efficiency_analyst"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "CLAUDE.md").write_text("# 项目说明\nMetrics live in data/metrics.csv; cite file names.")
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(15_000)
    _admin_login(page, daphne_server, "/admin/agents_app/agent/")
    page.click("text=dev_efficiency_analyst")
    page.wait_for_selector("textarea[name=system_prompt]")
    assert "研发效能分析师" in page.input_value("textarea[name=system_prompt]")
    preview = page.locator(".field-claude_md_preview pre")
    assert "Metrics live in data/metrics.csv" in preview.inner_text()
    prompt_box = page.locator("textarea[name=system_prompt]").bounding_box()
    preview_box = preview.bounding_box()
    _shot(page, "admin-agent")
    assert preview_box["x"] > prompt_box["x"] + prompt_box["width"] - 1  # beside, not below
    assert "monospace" in page.evaluate("() => getComputedStyle(document.querySelector('textarea[name=system_prompt]')).fontFamily")
    page.close()


def test_admin_confirmation_actions_wake_the_waiting_run(browser, page, daphne_server):
    page.select_option("#agent", "coder")
    _send(page, WRITE % ("admin-approved.txt", "approved by an admin"))
    _awaiting_card(page)
    admin = browser.new_page(viewport={"width": 1280, "height": 900})
    admin.set_default_timeout(15_000)
    _admin_login(admin, daphne_server, "/admin/tools_app/toolconfirmation/?status__exact=pending")
    admin.locator("#result_list tbody input.action-select").first.check()
    admin.select_option("select[name=action]", "approve_selected")
    admin.click("button[name=index]")
    admin.wait_for_selector(".messagelist .success")
    page.wait_for_selector(".tool-card[data-status=succeeded]")
    _wait_idle(page)
    assert (daphne_server.workspaces / "coder" / "admin-approved.txt").read_text() == "approved by an admin"
    admin.close()


def test_admin_prompt_edit_is_used_by_the_next_run(browser, start_daphne_server, anthropic_server):
    from tests.fakes.anthropic_server import text_reply

    server = start_daphne_server(env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": anthropic_server.url,
                                      "ANTHROPIC_MAX_RETRIES": "0", "AGENT_CACHE_SECONDS": "5"})
    anthropic_server.script(text_reply(["Here is the plan:\n\n", "```sql\nSELECT 1;\n```"]))
    admin = browser.new_page(viewport={"width": 1280, "height": 1000})
    admin.set_default_timeout(15_000)
    _admin_login(admin, server, "/admin/agents_app/agent/")
    admin.click("text=dev_efficiency_analyst")
    admin.fill("textarea[name=system_prompt]", "You are the release captain. Always answer with a plan. 发布计划")
    admin.click("input[name=_save]")
    admin.wait_for_selector(".messagelist .success")
    admin.close()

    context = browser.new_context(viewport={"width": 1280, "height": 820})
    context.set_default_timeout(15_000)
    page = context.new_page()
    _login(page, server)
    page.select_option("#agent", "dev_efficiency_analyst")
    _send(page, "what next?")
    _last_reply(page).locator("pre code.hljs").wait_for()
    _wait_idle(page)
    system = anthropic_server.requests_to("/v1/messages")[-1].json["system"]
    system_text = system if isinstance(system, str) else " ".join(block.get("text", "") for block in system)
    assert system_text.startswith("You are the release captain. Always answer with a plan. 发布计划")
    assert "SELECT 1;" in _last_reply(page).locator("pre code").inner_text()
    context.close()

// The browser chat page. It talks only to the public API (session auth + CSRF header):
// POST /v1/agent/chat (SSE), GET /v1/agent/runs/:id/events to resume with Last-Event-ID,
// POST /v1/agent/runs/:id/cancel, GET /v1/agent/runs/:id/timeline, and the conversation REST.
//
// Model output is hostile: replies are parsed with marked, sanitized with DOMPurify before they
// touch the DOM, and the page's Content-Security-Policy forbids inline script on top.
(() => {
  "use strict";
  const { $, api, el, announce, csrf, toolCard, updateToolCard, formatDuration, prettyJson } = window.Orchestrator;

  const S = {
    conversationId: null,
    run: null,            // the run this page is streaming, see newRun()
    editing: false,
    query: "",
    renaming: null,       // the title input of a conversation being renamed, see startRename()
  };

  // --- Markdown, safely ------------------------------------------------------------------------
  marked.use({ gfm: true, breaks: true });
  hljs.configure({ ignoreUnescapedHTML: true });
  const PURIFY = {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "object", "embed", "svg", "math"],
    FORBID_ATTR: ["style", "id", "name"],
  };
  // Model output may not borrow the page's classes; only a fence's `language-x` survives.
  DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
    if (data.attrName === "class" && !(node.tagName === "CODE" && /^language-[\w+#-]+$/.test(data.attrValue))) data.keepAttr = false;
  });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") { node.setAttribute("target", "_blank"); node.setAttribute("rel", "noopener noreferrer nofollow"); }
  });

  function renderMarkdown(target, text) {
    target.innerHTML = DOMPurify.sanitize(marked.parse(text || ""), PURIFY);
    for (const code of target.querySelectorAll("pre > code")) {
      const lang = ((code.getAttribute("class") || "").match(/language-([\w+#-]+)/) || [])[1];
      if (lang && !hljs.getLanguage(lang)) code.removeAttribute("class");
      hljs.highlightElement(code);
      const pre = code.parentElement;
      const label = el("span", { class: "code-lang", text: lang || "text" });
      const copy = el("button", { type: "button", class: "copy-code", "aria-label": `Copy ${lang || ""} code` }, "Copy");
      copy.addEventListener("click", () => copyText(code.textContent, copy));
      pre.before(el("div", { class: "code-head" }, label, copy));
    }
  }

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (_) {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  }

  // --- turns ------------------------------------------------------------------------------------
  function messages() { return $("#messages"); }
  function hideEmptyState() { const e = $("#empty-state"); if (e) e.hidden = true; }
  function scrollToEnd() {
    const box = messages();
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 160) box.scrollTop = box.scrollHeight;
  }

  function addUserTurn(text, messageId) {
    hideEmptyState();
    const turn = el("article", { class: "turn user", "aria-label": "You", "data-message-id": messageId || "" },
      el("div", { class: "bubble", text }),
      el("div", { class: "turn-actions" },
        el("button", { type: "button", class: "link edit-last", onclick: () => startEdit(turn) }, "Edit")));
    turn._text = text;
    messages().append(turn);
    refreshTurnActions();
    messages().scrollTop = messages().scrollHeight;
    return turn;
  }

  function addAssistantTurn(runId, after) {
    hideEmptyState();
    const turn = el("article", { class: "turn assistant", "aria-label": "Agent", "data-run-id": runId || "" },
      el("div", { class: "avatar", "aria-hidden": "true", text: "✦" }),
      el("div", { class: "turn-body" },
        el("div", { class: "segments" }),
        el("footer", { class: "turn-footer" },
          el("span", { class: "meta muted small" }),
          el("span", { class: "spacer" }),
          el("button", { type: "button", class: "link copy-reply" }, "Copy"),
          el("button", { type: "button", class: "link open-timeline" }, "Timeline"),
          el("button", { type: "button", class: "link regenerate", onclick: () => regenerate() }, "Regenerate"))));
    $(".copy-reply", turn).addEventListener("click", (e) => copyText(turnText(turn), e.currentTarget));
    $(".open-timeline", turn).addEventListener("click", () => openTimeline(turn.dataset.runId));
    if (after) after.after(turn); else messages().append(turn);
    return turn;
  }

  function turnText(turn) {
    return [...turn.querySelectorAll(".segment.text")].map((s) => s._text || "").join("\n\n");
  }

  function textSegment(turn) {
    const seg = el("div", { class: "segment text markdown" });
    seg._text = "";
    $(".segments", turn).append(seg);
    return seg;
  }

  function setFooter(turn, info) {
    const parts = [];
    if (info.model) parts.push(info.model);
    const u = info.usage || {};
    const inT = u.input_tokens ?? u.inputTokens ?? u.prompt_tokens, outT = u.output_tokens ?? u.outputTokens ?? u.completion_tokens;
    if (inT !== undefined || outT !== undefined) parts.push(`${inT ?? 0} in · ${outT ?? 0} out tokens`);
    if (info.cost !== undefined && info.cost !== null) parts.push(`$${Number(info.cost).toFixed(4)}`);
    if (info.durationMs) parts.push(formatDuration(info.durationMs));
    $(".meta", turn).textContent = parts.join(" · ");
  }

  async function loadCost(turn, runId, usage) {
    try {
      const t = await api("GET", `/v1/agent/runs/${runId}/timeline`);
      const ms = t.endedAt ? new Date(t.endedAt) - new Date(t.startedAt) : null;
      setFooter(turn, { model: t.model, usage: Object.keys(t.usage || {}).length ? t.usage : usage, cost: t.cost, durationMs: ms });
      // Tool durations from the recorded timeline (first state to final state), for cards
      // rebuilt from history and to replace the page's own estimate.
      const spans = new Map();
      for (const ev of t.events) {
        if (ev.event !== "tool.state") continue;
        const id = (ev.payload || {}).toolCallId; const at = new Date(ev.at).getTime();
        const span = spans.get(id) || { from: at, to: at }; span.to = at; spans.set(id, span);
      }
      for (const card of turn.querySelectorAll(".tool-card")) {
        const span = spans.get(card.dataset.toolCallId);
        if (span && window.Orchestrator.TERMINAL.has(card.dataset.status)) card.querySelector(".duration").textContent = formatDuration(span.to - span.from);
      }
    } catch (_) { /* the footer is informative only */ }
  }

  // Only the last user message can be edited and only the last answer regenerated, when idle.
  function refreshTurnActions() {
    const idle = !S.run;
    const users = messages().querySelectorAll(".turn.user");
    users.forEach((t, i) => { $(".edit-last", t).hidden = !(idle && i === users.length - 1); });
    const answers = messages().querySelectorAll(".turn.assistant");
    answers.forEach((t, i) => { $(".regenerate", t).hidden = !(idle && i === answers.length - 1); });
  }

  function addNotice(turn, kind, text) {
    $(".segments", turn).append(el("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : null, text }));
  }

  // --- a run, streamed --------------------------------------------------------------------------
  function newRun() {
    return { id: null, lastSeq: 0, turn: addAssistantTurn(null), seg: null, tools: new Map(), ended: false,
             usage: null, model: "", controller: new AbortController(), startedAt: performance.now(), stopping: false };
  }

  // Deltas re-render their segment at most every 50 ms (a timer, not requestAnimationFrame,
  // which a hidden tab never runs); the end of a run renders whatever is left at once.
  let renderQueued = new Set();
  let renderTimer = null;
  function flushRender() {
    clearTimeout(renderTimer); renderTimer = null;
    const segments = renderQueued; renderQueued = new Set();
    for (const s of segments) renderMarkdown(s, s._text);
    scrollToEnd();
  }
  function queueRender(seg) {
    renderQueued.add(seg);
    if (renderTimer === null) renderTimer = setTimeout(flushRender, 50);
  }

  const TOOL_HANDLERS = { onDecided: () => {}, onError: () => {} };

  function onEvent(run, name, data) {
    switch (name) {
      case "conversation.created":
        S.conversationId = data.conversationId; syncUrl(); refreshConversations(); break;
      case "agent.start":
        run.id = data.runId; run.turn.dataset.runId = data.runId; run.model = data.model || "";
        setFooter(run.turn, { model: [data.provider, data.model].filter(Boolean).join(" / ") });
        break;
      case "agent.delta":
        if (!run.seg) run.seg = textSegment(run.turn);
        run.seg._text += data.text || "";
        queueRender(run.seg);
        break;
      case "tool.state": {
        let card = run.tools.get(data.toolCallId);
        if (!card) {
          card = toolCard({ toolCallId: data.toolCallId });
          run.tools.set(data.toolCallId, card);
          $(".segments", run.turn).append(card);
          run.seg = null; // text after a tool call starts a new segment
        }
        updateToolCard(card, data, TOOL_HANDLERS);
        if (data.status === "awaiting_input") { window.Orchestrator.pendingChanged(); announce(`${data.name} is waiting for your approval.`); }
        scrollToEnd();
        break;
      }
      case "agent.end":
        run.ended = true; run.usage = data.usage || {};
        flushRender();
        if (data.status === "failed") addNotice(run.turn, "error", data.error || "The run failed.");
        else if (data.status === "cancelled") addNotice(run.turn, "stopped", "Stopped.");
        if (!run.seg && !run.tools.size && data.status === "succeeded" && data.text) { run.seg = textSegment(run.turn); run.seg._text = data.text; renderMarkdown(run.seg, data.text); }
        setFooter(run.turn, { model: run.model, usage: run.usage, durationMs: performance.now() - run.startedAt });
        if (run.id) loadCost(run.turn, run.id, run.usage);
        announce(data.status === "succeeded" ? "The agent answered." : `Run ${data.status}.`);
        break;
      default: break; // ping, agent.thought, agent.message, error (agent.end carries the readable error)
    }
  }

  // Reads SSE frames; every run event has `id: <seq>`, and anything at or below the last seq
  // seen is a duplicate (a replay after a reconnect), so it is dropped.
  async function consume(run, res) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        let id = null; const dataLines = [];
        for (const line of frame.split("\n")) {
          if (line.startsWith("id:")) id = parseInt(line.slice(3).trim(), 10);
          else if (line.startsWith("data:")) dataLines.push(line.slice(5).replace(/^ /, ""));
        }
        if (!dataLines.length) continue;
        let msg;
        try { msg = JSON.parse(dataLines.join("\n")); } catch (_) { continue; }
        const isRunEvent = msg.event !== "ping" && msg.event !== "conversation.created";
        if (isRunEvent && Number.isInteger(id)) {
          if (id <= run.lastSeq) continue;
          run.lastSeq = id;
        }
        run.attempts = 0;
        onEvent(run, msg.event, msg.data || {});
        if (run.ended) { reader.cancel().catch(() => {}); return; }
      }
    }
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  function showConn(text) { const c = $("#conn"); c.textContent = text || ""; c.hidden = !text; document.body.classList.toggle("reconnecting", Boolean(text)); }

  async function followRun(run, firstResponse) {
    let res = firstResponse;
    run.attempts = 0;
    for (;;) {
      try { await consume(run, res); } catch (_) { /* a cut connection: resume below */ }
      if (run.ended || run.controller.signal.aborted) break;
      if (!run.id) throw new Error("The connection was lost before the run started.");
      run.attempts += 1;
      if (run.attempts > 40) { addNotice(run.turn, "error", "Lost the connection to the server. Reload to see the answer."); break; }
      showConn(`Connection lost — reconnecting${run.attempts > 1 ? ` (attempt ${run.attempts})` : ""}…`);
      await sleep(Math.min(400 * 2 ** (run.attempts - 1), 5000));
      try {
        res = await fetch(`/v1/agent/runs/${run.id}/events`, {
          credentials: "same-origin", signal: run.controller.signal,
          headers: { "Accept": "text/event-stream", "Last-Event-ID": String(run.lastSeq) },
        });
      } catch (_) { res = null; }
      if (res && res.status === 204) { run.ended = true; await finishFromTimeline(run); break; }
      if (res && res.status >= 400 && res.status < 500) { addNotice(run.turn, "error", `Could not resume the run (HTTP ${res.status}).`); break; }
      if (!res || !res.ok) { res = { body: { getReader: () => ({ read: async () => ({ done: true }) }) } }; continue; }
      showConn("");
      announce("Reconnected.");
    }
    showConn("");
  }

  async function finishFromTimeline(run) {
    // 204 means the end was already delivered; nothing else to replay.
    if (run.id) await loadCost(run.turn, run.id, run.usage);
  }

  async function startRun(body) {
    const run = newRun();
    S.run = run;
    setBusy(true);
    try {
      const res = await fetch("/v1/agent/chat", {
        method: "POST", credentials: "same-origin", signal: run.controller.signal,
        headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": csrf() },
        body: JSON.stringify(body),
      });
      if (!res.ok) {
        const err = await res.json().catch(() => ({ message: `HTTP ${res.status}` }));
        throw new Error(err.message || `HTTP ${res.status}`);
      }
      run.id = res.headers.get("X-Run-Id") || run.id;
      if (run.id) run.turn.dataset.runId = run.id;
      const conv = res.headers.get("X-Conversation-Id");
      if (conv && conv !== S.conversationId) { S.conversationId = conv; syncUrl(); }
      await followRun(run, res);
    } catch (e) {
      if (!run.controller.signal.aborted) addNotice(run.turn, "error", e.message);
    } finally {
      runFinished(run);
    }
  }

  // A run that is still going when its conversation is opened (a reload, a link from
  // /approvals): replay it from its first event, then follow it live.
  async function attachRun(runId) {
    const run = newRun();
    run.id = runId; run.turn.dataset.runId = runId;
    S.run = run;
    setBusy(true);
    try {
      const res = await fetch(`/v1/agent/runs/${runId}/events`, {
        credentials: "same-origin", signal: run.controller.signal, headers: { "Accept": "text/event-stream" },
      });
      if (!res.ok) throw new Error(`Could not follow the run (HTTP ${res.status}).`);
      await followRun(run, res);
    } catch (e) {
      if (!run.controller.signal.aborted) addNotice(run.turn, "error", e.message);
    } finally {
      runFinished(run);
    }
  }

  function runFinished(run) {
    if (S.run !== run) return; // the person moved to another conversation meanwhile
    S.run = null;
    setBusy(false);
    refreshConversations();
    window.Orchestrator.refreshPending();
  }

  function setBusy(busy) {
    $("#stop").hidden = !busy;
    $("#send").hidden = busy;
    $("#input").setAttribute("aria-busy", busy ? "true" : "false");
    const turn = S.run && S.run.turn;
    if (turn) turn.setAttribute("aria-busy", busy ? "true" : "false");
    document.querySelectorAll(".turn.assistant[aria-busy=true]").forEach((t) => { if (!busy) t.setAttribute("aria-busy", "false"); });
    refreshTurnActions();
  }

  async function stop() {
    const run = S.run;
    if (!run || run.stopping) return;
    run.stopping = true;
    announce("Stopping…");
    if (!run.id) { run.controller.abort(); addNotice(run.turn, "stopped", "Stopped."); return; }
    try { await api("POST", `/v1/agent/runs/${run.id}/cancel`); }
    catch (e) { if (e.code !== "run_not_active") addNotice(run.turn, "error", `Could not stop: ${e.message}`); }
  }

  // --- sending, regenerating, editing -----------------------------------------------------------
  function composerText() { return $("#input").value; }

  async function send(ev) {
    if (ev) ev.preventDefault();
    const text = composerText();
    if (!text.trim() || S.run) return;
    $("#input").value = ""; autosize();
    if (S.editing) { await resend(text); return; }
    addUserTurn(text);
    const body = { input: text, agentRole: $("#agent").value };
    if (S.conversationId) body.conversationId = S.conversationId;
    await startRun(body);
  }

  // Removes the last user turn and what followed it: the server marks them superseded.
  function dropLastTurn() {
    const users = messages().querySelectorAll(".turn.user");
    const last = users[users.length - 1];
    if (!last) return null;
    const text = last._text;
    let node = last;
    while (node) { const next = node.nextElementSibling; node.remove(); node = next; }
    return text;
  }

  async function regenerate() {
    if (S.run || !S.conversationId) return;
    const text = dropLastTurn();
    if (text === null) return;
    addUserTurn(text);
    await startRun({ conversationId: S.conversationId, regenerate: true, agentRole: $("#agent").value });
  }

  function startEdit(turn) {
    if (S.run) return;
    S.editing = true;
    $("#editing").hidden = false;
    $("#input").value = turn._text || "";
    autosize();
    $("#input").focus();
  }

  function cancelEdit() { S.editing = false; $("#editing").hidden = true; $("#input").value = ""; autosize(); }

  async function resend(text) {
    S.editing = false; $("#editing").hidden = true;
    dropLastTurn();
    addUserTurn(text);
    await startRun({ conversationId: S.conversationId, regenerate: true, input: text, agentRole: $("#agent").value });
  }

  // --- conversations ----------------------------------------------------------------------------
  function syncUrl() {
    const url = new URL(window.location.href);
    if (S.conversationId) url.searchParams.set("c", S.conversationId); else url.searchParams.delete("c");
    history.replaceState(null, "", url);
  }

  let searchTimer = null;
  let refreshes = 0;
  async function refreshConversations() {
    const mine = ++refreshes;
    let list;
    try { list = await api("GET", `/v1/conversations${S.query ? `?q=${encodeURIComponent(S.query)}` : ""}`); }
    catch (e) { announce(e.message); return; }
    if (mine !== refreshes) return;  // a later refresh (a newer search, a rename) draws the list
    // A title being edited stays: the rename refreshes the list when it is done (a refresh that
    // lands meanwhile, e.g. from a run that just ended, would throw the edit away).
    if (S.renaming && S.renaming.isConnected) return;
    const ul = $("#conversations");
    ul.replaceChildren(...list.map(conversationItem));
    $("#conversations-empty").hidden = list.length > 0;
    $("#conversations-empty").textContent = S.query ? `Nothing matches “${S.query}”.` : "No conversations yet.";
  }

  function conversationItem(c) {
    const title = c.title || "(untitled)";
    const link = el("a", { href: `/?c=${c.id}`, class: "conv-link", "data-id": c.id, title, "aria-current": c.id === S.conversationId ? "page" : null },
      el("span", { class: "conv-title", text: title }),
      el("span", { class: "conv-when muted small", text: relativeTime(c.updatedAt) }));
    link.addEventListener("click", (e) => { e.preventDefault(); openConversation(c.id); closeSidebar(); });
    const rename = el("button", { type: "button", class: "icon-btn rename", "aria-label": `Rename “${title}”`, title: "Rename" }, "✎");
    const del = el("button", { type: "button", class: "icon-btn delete", "aria-label": `Delete “${title}”`, title: "Delete" }, "✕");
    const li = el("li", { class: "conv" + (c.id === S.conversationId ? " active" : "") }, link, el("span", { class: "conv-actions" }, rename, del));
    rename.addEventListener("click", () => startRename(li, c));
    del.addEventListener("click", () => deleteConversation(c));
    return li;
  }

  function startRename(li, c) {
    const input = el("input", { type: "text", class: "rename-input", value: c.title || "", maxlength: "300", "aria-label": "New title" });
    li.replaceChildren(input);
    input.focus(); input.select();
    S.renaming = input;
    let done = false;
    const finish = async (save) => {
      if (done) return; done = true;
      if (save && input.value.trim() !== (c.title || "")) {
        try { await api("PATCH", `/v1/conversations/${c.id}`, { title: input.value }); announce("Renamed."); }
        catch (e) { announce(`Could not rename: ${e.message}`); }
      }
      if (S.renaming === input) S.renaming = null;
      refreshConversations();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); finish(true); }
      else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false); }
    });
    input.addEventListener("blur", () => finish(true));
  }

  async function deleteConversation(c) {
    if (!window.confirm(`Delete “${c.title || "(untitled)"}” and its history? Running answers are stopped.`)) return;
    try { await api("DELETE", `/v1/conversations/${c.id}`); announce("Deleted."); }
    catch (e) { announce(`Could not delete: ${e.message}`); return; }
    if (c.id === S.conversationId) newConversation();
    refreshConversations();
  }

  function newConversation() {
    if (S.run) S.run.controller.abort();
    S.conversationId = null; S.editing = false; $("#editing").hidden = true;
    messages().replaceChildren($("#empty-state") || el("div"));
    const e = $("#empty-state"); if (e) e.hidden = false;
    syncUrl(); refreshConversations();
    $("#input").focus();
  }

  async function openConversation(id) {
    if (S.run) S.run.controller.abort();
    let conv, msgs;
    try {
      [conv, msgs] = await Promise.all([api("GET", `/v1/conversations/${id}`), api("GET", `/v1/conversations/${id}/messages`)]);
    } catch (e) { announce(`Could not open the conversation: ${e.message}`); return; }
    S.conversationId = conv.id; S.editing = false; $("#editing").hidden = true;
    if (conv.agentRole && [...$("#agent").options].some((o) => o.value === conv.agentRole)) { $("#agent").value = conv.agentRole; describeAgent(); }
    // Is the last turn still being answered? Then it is replayed live instead of from history.
    const lastUser = [...msgs].reverse().find((m) => m.role === "user" && !(m.metadata || {}).superseded);
    let liveRunId = null;
    if (lastUser && lastUser.runId && !msgs.some((m) => m.role === "assistant" && m.runId === lastUser.runId)) {
      const t = await api("GET", `/v1/agent/runs/${lastUser.runId}/timeline`).catch(() => null);
      if (t && (t.status === "running" || t.status === "queued")) liveRunId = lastUser.runId;
    }
    if (S.conversationId !== conv.id) return; // another conversation was opened meanwhile
    const empty = $("#empty-state");
    messages().replaceChildren(empty);
    let turn = null, turnRun = null;
    for (const m of msgs) {
      const md = m.metadata || {};
      if (md.superseded) continue;
      if (liveRunId && m.runId === liveRunId && m.role !== "user") continue;
      if (m.role === "user") { addUserTurn(m.content, m.id); turn = null; continue; }
      if (m.role !== "assistant" && m.role !== "tool") continue;
      if (!turn || turnRun !== m.runId) { turn = addAssistantTurn(m.runId); turnRun = m.runId; }
      if (m.role === "tool") {
        const card = toolCard({ toolCallId: md.toolCallId || m.id });
        $(".segments", turn).append(card);
        updateToolCard(card, { name: md.name, status: md.status || "succeeded", input: md.input, policy: md.policy,
                               output: md.isError ? null : m.content, error: md.isError ? m.content : null }, null);
      } else {
        const seg = textSegment(turn); seg._text = m.content; renderMarkdown(seg, m.content);
        setFooter(turn, { model: md.model, usage: md.usage });
        if (m.runId) loadCost(turn, m.runId, md.usage);
      }
    }
    if (empty) empty.hidden = msgs.length > 0;
    refreshTurnActions();
    syncUrl(); refreshConversations();
    messages().scrollTop = messages().scrollHeight;
    if (liveRunId) attachRun(liveRunId);
    else showUnanswered(msgs, conv.id);
  }

  // Turns that got no answer (stopped, failed, lost) say so, as they did while streaming.
  async function showUnanswered(msgs, conversationId) {
    const answered = new Set(msgs.filter((m) => m.role === "assistant").map((m) => m.runId));
    const asked = msgs.filter((m) => m.role === "user" && m.runId && !(m.metadata || {}).superseded && !answered.has(m.runId));
    const timelines = await Promise.all(asked.map((m) => api("GET", `/v1/agent/runs/${m.runId}/timeline`).catch(() => null)));
    if (S.conversationId !== conversationId) return;
    asked.forEach((m, i) => {
      const t = timelines[i];
      if (!t || !["failed", "cancelled"].includes(t.status)) return;
      let turn = messages().querySelector(`.turn.assistant[data-run-id="${CSS.escape(m.runId)}"]`);
      if (!turn) {
        const userTurn = messages().querySelector(`.turn.user[data-message-id="${CSS.escape(m.id)}"]`);
        turn = addAssistantTurn(m.runId, userTurn);
      }
      addNotice(turn, t.status === "failed" ? "error" : "stopped", t.status === "failed" ? (t.error || "The run failed.") : "Stopped.");
      loadCost(turn, m.runId, t.usage);
    });
    refreshTurnActions();
  }

  function relativeTime(iso) {
    const d = new Date(iso); const s = (Date.now() - d) / 1000;
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return d.toLocaleDateString();
  }

  // --- the run timeline -------------------------------------------------------------------------
  async function openTimeline(runId) {
    if (!runId) return;
    const dialog = $("#timeline-dialog"); const body = $("#timeline-body");
    body.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
    dialog.showModal();
    let t;
    try { t = await api("GET", `/v1/agent/runs/${runId}/timeline`); }
    catch (e) { body.replaceChildren(el("p", { class: "notice error", text: e.message })); return; }
    const start = new Date(t.startedAt).getTime();
    const u = t.usage || {};
    const facts = [
      ["Status", t.status], ["Engine", t.engine], ["Provider", t.provider || "—"], ["Model", t.model || "—"],
      ["Tokens", `${u.input_tokens ?? 0} in · ${u.output_tokens ?? 0} out`],
      ["Cost", `$${Number(t.cost || 0).toFixed(6)}`],
      ["Duration", t.endedAt ? formatDuration(new Date(t.endedAt) - start) : "running"],
    ];
    const dl = el("dl", { class: "facts" });
    for (const [k, v] of facts) dl.append(el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) })));
    if (t.routeNote) dl.append(el("div", { class: "wide" }, el("dt", { text: "Route" }), el("dd", { text: t.routeNote })));
    if (t.error) dl.append(el("div", { class: "wide" }, el("dt", { text: "Error" }), el("dd", { text: t.error })));
    // Steps: consecutive deltas fold into one "text" step; a tool call's states fold into one row with its duration.
    const steps = []; const toolRows = new Map();
    for (const ev of t.events) {
      const at = new Date(ev.at).getTime() - start;
      const p = ev.payload || {};
      if (ev.event === "agent.delta") {
        const last = steps[steps.length - 1];
        if (last && last.kind === "text") { last.text += p.text || ""; last.count += 1; continue; }
        steps.push({ kind: "text", at, seq: ev.seq, text: p.text || "", count: 1 });
      } else if (ev.event === "tool.state") {
        let row = toolRows.get(p.toolCallId);
        if (!row) { row = { kind: "tool", at, seq: ev.seq, name: p.name, input: p.input, states: [] }; toolRows.set(p.toolCallId, row); steps.push(row); }
        row.states.push({ status: p.status, at }); row.status = p.status; row.end = at;
        if (p.output || p.error) row.output = p.output || p.error;
        if (p.policy) row.policy = p.policy;
      } else if (ev.event !== "agent.thought" && ev.event !== "agent.message") {
        steps.push({ kind: "event", at, seq: ev.seq, name: ev.event, payload: p });
      }
    }
    const ol = el("ol", { class: "steps" });
    for (const s of steps) {
      const when = el("span", { class: "when muted small", text: `+${formatDuration(s.at) || "0 ms"}` });
      if (s.kind === "text") {
        ol.append(el("li", { class: "step text" }, when, el("span", { class: "what", text: "text" }),
          el("span", { class: "detail", text: s.text.length > 240 ? s.text.slice(0, 240) + "…" : s.text })));
      } else if (s.kind === "tool") {
        const waited = s.states.find((x) => x.status === "awaiting_input");
        ol.append(el("li", { class: "step tool" }, when, el("span", { class: "what", text: `tool ${s.name}` }),
          el("span", { class: `chip status ${s.status}`, text: s.status }),
          el("span", { class: "muted small", text: `${formatDuration(s.end - s.at) || "0 ms"}${waited ? " (incl. waiting for approval)" : ""}` }),
          s.policy ? el("span", { class: "muted small", text: `${s.policy.effect}: ${s.policy.rule}` }) : null,
          el("pre", { class: "detail", text: prettyJson(s.input) + (s.output ? `\n→ ${s.output.slice(0, 400)}` : "") })));
      } else {
        const p = s.payload; let detail = "";
        if (s.name === "agent.start") detail = [p.agentRole, p.engine, p.provider, p.model, p.routeNote].filter(Boolean).join(" · ");
        else if (s.name === "agent.end") detail = [p.status, p.error].filter(Boolean).join(": ");
        else if (s.name === "error") detail = `${p.code}: ${p.message}`;
        else if (s.name === "context.patch") detail = [p.kind, p.data && p.data.name].filter(Boolean).join(" · ");
        ol.append(el("li", { class: "step" }, when, el("span", { class: "what", text: s.name }), el("span", { class: "detail", text: detail })));
      }
    }
    body.replaceChildren(dl, el("h3", { text: "Steps" }), ol);
    $("#timeline-close").focus();
  }

  // --- layout, agent picker, keyboard -----------------------------------------------------------
  function describeAgent() {
    const o = $("#agent").selectedOptions[0];
    $("#agent-desc").textContent = o ? `${o.dataset.description || ""}${o.dataset.engine ? ` (${o.dataset.engine})` : ""}` : "";
  }
  function openSidebar() { document.body.classList.add("sidebar-open"); $("#menu").setAttribute("aria-expanded", "true"); $("#scrim").hidden = false; $("#search").focus(); }
  function closeSidebar() { if (!document.body.classList.contains("sidebar-open")) return; document.body.classList.remove("sidebar-open"); $("#menu").setAttribute("aria-expanded", "false"); $("#scrim").hidden = true; }
  function autosize() { const t = $("#input"); t.style.height = "auto"; t.style.height = `${Math.min(t.scrollHeight, 240)}px`; }

  $("#composer").addEventListener("submit", send);
  $("#input").addEventListener("input", autosize);
  $("#input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    else if (e.key === "ArrowUp" && !composerText() && !S.run) {
      const users = messages().querySelectorAll(".turn.user");
      if (users.length) { e.preventDefault(); startEdit(users[users.length - 1]); }
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if ($("#timeline-dialog").open) return; // the dialog closes itself
    if (S.run) { e.preventDefault(); stop(); }
    else if (S.editing) cancelEdit();
    else closeSidebar();
  });
  $("#stop").addEventListener("click", stop);
  $("#cancel-edit").addEventListener("click", cancelEdit);
  $("#new-chat").addEventListener("click", newConversation);
  $("#agent").addEventListener("change", describeAgent);
  $("#menu").addEventListener("click", () => (document.body.classList.contains("sidebar-open") ? closeSidebar() : openSidebar()));
  $("#scrim").addEventListener("click", closeSidebar);
  $("#timeline-close").addEventListener("click", () => $("#timeline-dialog").close());
  $("#timeline-dialog").addEventListener("click", (e) => { if (e.target === e.currentTarget) e.currentTarget.close(); });
  $("#search").addEventListener("input", (e) => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { S.query = e.target.value.trim(); refreshConversations(); }, 200);
  });

  describeAgent();
  const initial = new URL(window.location.href).searchParams.get("c");
  if (initial) openConversation(initial); else refreshConversations();
})();

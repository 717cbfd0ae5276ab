// The browser chat page: talks only to the public API (session auth + CSRF header).
(() => {
  "use strict";
  const $ = (sel) => document.querySelector(sel);
  const state = { conversationId: null, busy: false, tools: new Map(), assistantEl: null, lastRunId: null };

  function csrf() {
    const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  async function api(method, path, body) {
    const res = await fetch(path, {
      method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrf() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(data.message || `HTTP ${res.status}`);
    return data;
  }

  function setStatus(text) { $("#status").textContent = text || ""; }

  function addMessage(role, text) {
    const el = document.createElement("div");
    el.className = `msg ${role}`;
    el.textContent = text;
    el.dataset.role = role;
    $("#messages").appendChild(el);
    el.scrollIntoView({ block: "end" });
    return el;
  }

  function renderTool(data) {
    let card = state.tools.get(data.toolCallId);
    if (!card) {
      card = document.createElement("div");
      card.className = "tool";
      card.dataset.toolCallId = data.toolCallId;
      card.innerHTML = '<span class="name"></span><span class="state"></span><span class="policy"></span><pre class="input"></pre><pre class="output" hidden></pre><div class="actions" hidden></div>';
      state.tools.set(data.toolCallId, card);
      $("#messages").appendChild(card);
      state.assistantEl = null; // text after a tool call starts a new bubble
    }
    card.querySelector(".name").textContent = data.name;
    const st = card.querySelector(".state");
    st.textContent = data.status.replace("_", " ");
    st.className = `state ${data.status}`;
    // Why the call ran, waited or was refused: the approval rule (or the tool's default).
    card.querySelector(".policy").textContent = data.policy ? `${data.policy.effect}: ${data.policy.rule}` : "";
    card.querySelector(".input").textContent = JSON.stringify(data.input || {}, null, 2);
    const out = card.querySelector(".output");
    if (data.output || data.error) { out.hidden = false; out.textContent = data.output || data.error; }
    const actions = card.querySelector(".actions");
    actions.innerHTML = "";
    actions.hidden = data.status !== "awaiting_input";
    if (data.status === "awaiting_input" && data.confirmationId) {
      actions.append(decisionButton("Approve", "approve", data.confirmationId), decisionButton("Deny", "deny", data.confirmationId),
                     decisionButton("Always allow here", "approve", data.confirmationId, { remember: "conversation" }));
    }
    card.scrollIntoView({ block: "end" });
  }

  function decisionButton(label, verb, id, body) {
    const b = document.createElement("button");
    b.type = "button"; b.textContent = label; b.className = body && body.remember ? "remember" : verb;
    b.addEventListener("click", async () => {
      document.querySelectorAll(`button[data-confirmation="${id}"]`).forEach((x) => (x.disabled = true));
      try {
        await api("POST", `/v1/tool-confirmations/${id}/${verb}`, body);
        setStatus(body && body.remember ? "Approved; this tool now runs without asking in this conversation." : `${label}d.`);
      }
      catch (e) { setStatus(`Could not ${verb}: ${e.message}`); }
      refreshPending();
    });
    b.dataset.confirmation = id;
    return b;
  }

  function onEvent(name, data) {
    switch (name) {
      case "conversation.created":
        state.conversationId = data.conversationId; refreshConversations(); break;
      case "agent.start":
        state.lastRunId = data.runId; setStatus(`Running on ${data.engine}${data.model ? " / " + data.model : ""}…`); break;
      case "agent.delta":
        if (!state.assistantEl) state.assistantEl = addMessage("assistant", "");
        state.assistantEl.textContent += data.text; break;
      case "tool.state":
        renderTool(data); if (data.status === "awaiting_input") refreshPending(); break;
      case "agent.end":
        setStatus(data.status === "succeeded" ? "" : `Run ${data.status}${data.error ? ": " + data.error : ""}`);
        if (data.status === "failed" && data.error) addMessage("error", data.error);
        break;
      case "error":
        break; // the agent.end that follows carries the readable error
      default: break;
    }
  }

  async function streamChat(input) {
    const body = { input, agentRole: $("#agent").value };
    if (state.conversationId) body.conversationId = state.conversationId;
    const res = await fetch("/v1/agent/chat", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": csrf() },
      body: JSON.stringify(body),
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({ message: `HTTP ${res.status}` }));
      throw new Error(err.message);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        const dataLines = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
        if (!dataLines.length) continue;
        try { const msg = JSON.parse(dataLines.join("\n")); onEvent(msg.event, msg.data || {}); } catch (_) { /* ignore */ }
      }
    }
  }

  async function send(ev) {
    ev.preventDefault();
    const input = $("#input").value.trim();
    if (!input || state.busy) return;
    state.busy = true; $("#send").disabled = true;
    $("#input").value = "";
    addMessage("user", input);
    state.assistantEl = null;
    try { await streamChat(input); }
    catch (e) { addMessage("error", e.message); setStatus(""); }
    finally { state.busy = false; $("#send").disabled = false; refreshConversations(); }
  }

  async function refreshConversations() {
    try {
      const list = await api("GET", "/v1/conversations");
      const nav = $("#conversations"); nav.innerHTML = "";
      for (const c of list) {
        const a = document.createElement("a");
        a.href = "#"; a.textContent = c.title || "(untitled)"; a.dataset.id = c.id;
        if (c.id === state.conversationId) a.className = "active";
        a.addEventListener("click", (e) => { e.preventDefault(); openConversation(c); });
        nav.appendChild(a);
      }
    } catch (e) { setStatus(e.message); }
  }

  async function openConversation(c) {
    state.conversationId = c.id; state.tools.clear(); state.assistantEl = null;
    if (c.agentRole) $("#agent").value = c.agentRole;
    $("#messages").innerHTML = "";
    const msgs = await api("GET", `/v1/conversations/${c.id}/messages`);
    for (const m of msgs) {
      if (m.role === "tool") {
        const md = m.metadata || {};
        renderTool({ toolCallId: md.toolCallId || m.id, name: md.name || "tool", status: md.status || "succeeded", input: md.input, output: m.content });
      } else if (m.role === "user" || m.role === "assistant") { addMessage(m.role, m.content); state.assistantEl = null; }
    }
    refreshConversations();
  }

  async function refreshPending() {
    try {
      const items = await api("GET", "/v1/tool-confirmations?status=pending");
      const box = $("#pending"); box.innerHTML = "";
      for (const c of items) {
        const div = document.createElement("div");
        div.className = "tool";
        div.innerHTML = '<span class="name"></span><pre></pre><div class="actions"></div>';
        div.querySelector(".name").textContent = c.tool;
        div.querySelector("pre").textContent = JSON.stringify(c.input, null, 2);
        div.querySelector(".actions").append(decisionButton("Approve", "approve", c.id), decisionButton("Deny", "deny", c.id));
        box.appendChild(div);
      }
    } catch (_) { /* the list is a convenience; the inline buttons still work */ }
  }

  $("#composer").addEventListener("submit", send);
  $("#input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) send(e); });
  $("#new-chat").addEventListener("click", () => { state.conversationId = null; state.tools.clear(); $("#messages").innerHTML = ""; refreshConversations(); });
  refreshConversations();
  refreshPending();
  setInterval(refreshPending, 5000);
})();

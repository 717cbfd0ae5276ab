// Shared by the chat page and the approvals page: the API client, the theme toggle, the live
// pending-approvals badge, and tool-call cards with their decision controls.
// Everything from the server or a model is put in the page as text (textContent), never as HTML,
// except Markdown replies, which chat.js sanitizes with DOMPurify.
(() => {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);

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
    if (res.status === 204) return null;
    const data = await res.json().catch(() => ({}));
    if (!res.ok) { const e = new Error(data.message || `HTTP ${res.status}`); e.code = data.code; e.status = res.status; throw e; }
    return data;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function announce(text) { const s = $("#status"); if (s) { s.textContent = ""; s.textContent = text || ""; } }

  // --- theme: the system preference until the person picks one -------------------------------
  const dark = () => document.documentElement.dataset.theme === "dark" ||
    (!document.documentElement.dataset.theme && window.matchMedia("(prefers-color-scheme: dark)").matches);
  function syncThemeButton() {
    const b = $("#theme-toggle");
    if (!b) return;
    b.setAttribute("aria-label", dark() ? "Switch to light theme" : "Switch to dark theme");
    b.setAttribute("aria-pressed", dark() ? "true" : "false");
    b.textContent = dark() ? "☀" : "☾";
  }
  function toggleTheme() {
    const next = dark() ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    try { localStorage.setItem("theme", next); } catch (_) { /* private mode */ }
    syncThemeButton();
  }

  // --- the pending badge: polled, and refreshed at once when any tab decides or sees a new call --
  const channel = "BroadcastChannel" in window ? new BroadcastChannel("orchestrator-approvals") : null;
  const badgeListeners = [];
  let badgeTimer = null;
  async function refreshPending() {
    let items;
    try { items = await api("GET", "/v1/tool-confirmations?status=pending"); } catch (_) { return null; }
    const badge = $("#pending-badge");
    if (badge) {
      badge.dataset.count = String(items.length);
      $(".n", badge).textContent = String(items.length);
      badge.title = `${items.length} tool call${items.length === 1 ? "" : "s"} waiting for you`;
    }
    for (const fn of badgeListeners) fn(items);
    return items;
  }
  function schedulePending() {
    clearTimeout(badgeTimer);
    badgeTimer = setTimeout(async () => { if (!document.hidden) await refreshPending(); schedulePending(); }, 3000);
  }
  function pendingChanged() {
    if (channel) channel.postMessage("changed");
    refreshPending();
  }
  if (channel) channel.onmessage = () => refreshPending();
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshPending(); });

  // --- tool cards -------------------------------------------------------------------------------
  const STATUS_LABEL = {
    pending: "pending", running: "running", awaiting_input: "waiting for you", approved: "approved",
    succeeded: "done", failed: "failed", denied: "denied", expired: "expired",
  };
  const TERMINAL = new Set(["succeeded", "failed", "denied", "expired"]);

  function formatDuration(ms) {
    if (ms === null || ms === undefined || ms < 0) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
    return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
  }

  function prettyJson(value) {
    try { return JSON.stringify(value === undefined ? {} : value, null, 2); } catch (_) { return String(value); }
  }

  // One card per tool call. `opts.conversation` adds a link to it (approvals page).
  function toolCard(opts) {
    const card = el("details", { class: "tool-card", "data-tool-call-id": opts.toolCallId || "" });
    const summary = el("summary", {},
      el("span", { class: "tool-icon", "aria-hidden": "true", text: "⚙" }),
      el("span", { class: "tool-name" }),
      el("span", { class: "chip status" }),
      el("span", { class: "duration muted small" }),
      el("span", { class: "policy muted small" }));
    const body = el("div", { class: "tool-body" },
      el("div", { class: "label", text: "Arguments" }), el("pre", { class: "args", tabindex: "0" }),
      el("div", { class: "label out-label", text: "Output", hidden: true }), el("pre", { class: "output", tabindex: "0", hidden: true }),
      el("div", { class: "decision", hidden: true }));
    card.append(summary, body);
    card.open = true;
    card._startedAt = performance.now();
    return card;
  }

  function updateToolCard(card, data, handlers) {
    $(".tool-name", card).textContent = data.name || "tool";
    const status = data.status || "pending";
    const chip = $(".status", card);
    chip.textContent = STATUS_LABEL[status] || status;
    chip.className = `chip status ${status}`;
    card.dataset.status = status;
    $(".policy", card).textContent = data.policy && data.policy.rule ? `· ${data.policy.effect}: ${data.policy.rule}` : "";
    if (data.input !== undefined) $(".args", card).textContent = prettyJson(data.input);
    const outText = data.output || data.error || "";
    if (outText) {
      const out = $(".output", card);
      out.hidden = false; out.textContent = outText;
      out.classList.toggle("is-error", Boolean(data.error) || status === "failed");
      $(".out-label", card).hidden = false;
    }
    if (data.durationMs !== undefined) $(".duration", card).textContent = formatDuration(data.durationMs);
    else if (TERMINAL.has(status) && card._startedAt && !card._done) {
      $(".duration", card).textContent = formatDuration(performance.now() - card._startedAt);
    }
    const decision = $(".decision", card);
    if (status === "awaiting_input" && data.confirmationId && handlers) {
      if (decision.dataset.confirmation !== data.confirmationId) {
        decision.replaceChildren(...decisionControls(data.confirmationId, handlers));
        decision.dataset.confirmation = data.confirmationId;
      }
      decision.hidden = false;
      card.open = true;
    } else {
      decision.hidden = true;
      decision.replaceChildren();
      delete decision.dataset.confirmation;
    }
    if (TERMINAL.has(status) && !card._done) {
      card._done = true;
      card.open = false; // collapsed once done; the summary still says what happened
    }
  }

  // Approve / Deny (with an optional reason) / Always allow in this conversation.
  function decisionControls(confirmationId, handlers) {
    const reasonId = `reason-${confirmationId}`;
    const reason = el("input", { id: reasonId, class: "reason", type: "text", maxlength: "2000", placeholder: "Reason (optional)", autocomplete: "off" });
    const buttons = [];
    const act = (verb, remember) => async () => {
      buttons.forEach((b) => (b.disabled = true));
      const body = {};
      if (reason.value.trim()) body.reason = reason.value.trim();
      if (remember) body.remember = "conversation";
      try {
        const result = await api("POST", `/v1/tool-confirmations/${confirmationId}/${verb}`, body);
        announce(remember ? `Approved. ${result.tool || "This tool"} now runs without asking in this conversation.`
          : `${verb === "approve" ? "Approved" : "Denied"}.`);
        if (handlers.onDecided) handlers.onDecided(result, verb, remember);
      } catch (e) {
        buttons.forEach((b) => (b.disabled = false));
        announce(`Could not ${verb}: ${e.message}`);
        if (handlers.onError) handlers.onError(e);
      }
      pendingChanged();
    };
    buttons.push(
      el("button", { type: "button", class: "approve", onclick: act("approve") }, "Approve"),
      el("button", { type: "button", class: "deny", onclick: act("deny") }, "Deny"),
      el("button", { type: "button", class: "always", onclick: act("approve", true),
                     title: "Approve, and let this tool run without asking for the rest of this conversation" },
         "Always allow in this conversation"));
    return [
      el("label", { class: "sr-only", for: reasonId, text: "Reason for the decision (optional)" }), reason,
      el("div", { class: "buttons" }, ...buttons),
    ];
  }

  function init() {
    syncThemeButton();
    const t = $("#theme-toggle");
    if (t) t.addEventListener("click", toggleTheme);
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", syncThemeButton);
    refreshPending();
    schedulePending();
  }

  window.Orchestrator = {
    $, api, el, announce, csrf, refreshPending, pendingChanged, onPending: (fn) => badgeListeners.push(fn),
    toolCard, updateToolCard, formatDuration, prettyJson, TERMINAL,
  };
  init();
})();

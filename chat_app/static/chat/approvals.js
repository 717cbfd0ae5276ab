// /approvals: every tool call waiting for this user, across conversations, with the same
// decision controls as the chat page. Deciding here wakes the run wherever it is streaming.
(() => {
  "use strict";
  const { $, api, el, toolCard, updateToolCard, onPending } = window.Orchestrator;
  const titles = new Map();
  const cards = new Map();

  async function loadTitles() {
    try { for (const c of await api("GET", "/v1/conversations")) titles.set(c.id, c.title || "(untitled)"); } catch (_) { /* links still work */ }
  }

  function when(iso) { const d = new Date(iso); return isNaN(d) ? "" : d.toLocaleString(); }

  function render(items) {
    const box = $("#approvals");
    const ids = new Set(items.map((c) => c.id));
    for (const [id, card] of cards) if (!ids.has(id)) { card.remove(); cards.delete(id); }
    for (const c of items) {
      if (cards.has(c.id)) continue;
      const card = toolCard({ toolCallId: c.toolCallId });
      card.classList.add("approval");
      card.dataset.confirmationId = c.id;
      const head = el("div", { class: "approval-head small" },
        el("a", { href: `/?c=${c.conversationId}`, class: "conv-ref", text: titles.get(c.conversationId) || "Open the conversation" }),
        el("span", { class: "muted", text: ` · asked ${when(c.createdAt)}${c.expiresAt ? ` · expires ${when(c.expiresAt)}` : ""}` }));
      card.querySelector(".tool-body").prepend(head);
      updateToolCard(card, { name: c.tool, status: "awaiting_input", input: c.input, confirmationId: c.id },
                     { onDecided: () => { card.remove(); cards.delete(c.id); syncEmpty(); } });
      cards.set(c.id, card);
      box.append(card);
    }
    syncEmpty();
  }

  function syncEmpty() { $("#approvals-empty").hidden = cards.size > 0; }

  onPending(async (items) => {
    if (items.some((c) => !titles.has(c.conversationId))) await loadTitles();
    render(items);
  });
})();

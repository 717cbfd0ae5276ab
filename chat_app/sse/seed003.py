"""Seed-003 dialect: ``POST /conversations/:id/messages/stream`` named SSE events.

Every frame is ``event: <type>\\ndata: <json>\\n\\n``. Mapping of the canonical run events:

============================  ==============================================================
canonical                     seed 003
============================  ==============================================================
``agent.start``               ``init``  ``{sessionId, conversationId, runId, agentRole, engine,
                              model}``. ``sessionId`` is the engine session this turn resumes
                              (the conversation's stored one), ``null`` on a conversation's
                              first turn: the engine only names a new session when it answers,
                              so the id to resume with next time is the one in ``done``.
``agent.delta``               ``assistant`` ``{text}`` (one per streamed text fragment)
``tool.state``                ``tool_use`` ``{id, name, input, status}`` for every state change
                              (``pending``, ``awaiting_input`` + ``confirmationId``, ``running``,
                              ``succeeded`` + ``output``, ``failed``/``denied`` + ``error``)
``error``                     ``error`` ``{code, message}`` (e.g. ``run_timeout``,
                              ``authentication_failed``, ``mcp_connect_failed``)
``agent.end`` succeeded       ``done`` ``{messageId, sessionId, text, usage}``: the stored
                              assistant message and the conversation's updated session id
``agent.end`` cancelled       ``error`` ``{code: "cancelled", message}``
``agent.end`` failed          nothing more (its ``error`` event was already sent)
``agent.message``,            not sent (``done`` carries the message)
``context.patch``
============================  ==============================================================

Keep-alive while the run is quiet: an SSE comment line (``: ping``), which EventSource ignores.
"""
from __future__ import annotations

from typing import Any

from chat_app.events import RecordedEvent

from .base import sse_frame

PING_FRAME = ": ping\n\n"


class Seed003Dialect:
    """Maps one run's recorded events to seed-003 frames (stateful: one error per run)."""

    def __init__(self) -> None:
        self.error_sent = False
        self.finished = False

    def render(self, event: RecordedEvent) -> str | None:
        p = event.payload
        if event.event == "agent.start":
            return sse_frame({
                "sessionId": p.get("sessionId") or None,
                "conversationId": p.get("conversationId"),
                "runId": p.get("runId") or event.run_id,
                "agentRole": p.get("agentRole"),
                "engine": p.get("engine"),
                "model": p.get("model"),
            }, event="init")
        if event.event == "agent.delta":
            return sse_frame({"text": p.get("text", "")}, event="assistant") if p.get("text") else None
        if event.event == "tool.state":
            data: dict[str, Any] = {"id": p.get("toolCallId"), "name": p.get("name"), "input": p.get("input") or {},
                                    "status": p.get("status")}
            for key in ("output", "error", "confirmationId"):
                if p.get(key) is not None:
                    data[key] = p[key]
            return sse_frame(data, event="tool_use")
        if event.event == "error":
            self.error_sent = True
            return sse_frame({"code": p.get("code", "error"), "message": p.get("message", "")}, event="error")
        if event.event == "agent.end":
            self.finished = True
            status = p.get("status")
            if status == "succeeded":
                return sse_frame({"messageId": p.get("messageId"), "sessionId": p.get("sessionId") or None,
                                  "text": p.get("text", ""), "usage": p.get("usage") or {}}, event="done")
            if self.error_sent:
                return None
            self.error_sent = True
            code = p.get("errorCode") or ("cancelled" if status == "cancelled" else "run_failed")
            return sse_frame({"code": code, "message": p.get("error") or f"Run {status}."}, event="error")
        return None


def render_all(events: list[RecordedEvent]) -> list[str]:
    """The frames for a complete recorded sequence (for tests and replay)."""
    dialect = Seed003Dialect()
    return [frame for frame in (dialect.render(e) for e in events) if frame]

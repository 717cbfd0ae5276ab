"""The seed-003 dialect: ``POST /conversations/:id/messages/stream`` named SSE events.

Every frame is ``event: <type>\\ndata: <json>\\n\\n``. Mapping of the canonical run events:

============================  ==============================================================
canonical                     seed 003
============================  ==============================================================
``agent.start``               ``init``  ``{sessionId, conversationId, runId, agentRole, engine,
                              model}``. ``sessionId`` is the engine session this turn resumes
                              (the conversation's stored one), ``null`` on a conversation's
                              first turn: the engine only names a new session when it answers,
                              so the id to resume with next time is the one in ``done``.
``agent.delta``               ``assistant`` ``{text}`` (one per streamed text fragment; fragments
                              that arrive faster than the client reads are merged)
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
Closing this stream before ``done``/``error`` cancels the run (``cancel_on_disconnect``).
"""
from __future__ import annotations

from typing import Any

from core.events import RecordedEvent, RunEnded, RunError, RunStarted, TextDelta, ToolCallState

from .base import Dialect, sse_frame


class MessageStreamDialect(Dialect):
    name = "message-stream"
    cancel_on_disconnect = True

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.error_sent = False

    def translate(self, event: RecordedEvent) -> list[str]:
        data = event.data
        kind = type(data)
        if kind is TextDelta:
            return [sse_frame({"text": data.text}, event="assistant")] if data.text else []
        if kind is ToolCallState:
            out: dict[str, Any] = {"id": data.tool_call_id, "name": data.name, "input": data.input or {},
                                   "status": data.status}
            for key, value in (("output", data.output), ("error", data.error), ("confirmationId", data.confirmation_id)):
                if value is not None:
                    out[key] = value
            return [sse_frame(out, event="tool_use")]
        if kind is RunStarted:
            return [sse_frame({"sessionId": data.session_id or None, "conversationId": data.conversation_id,
                               "runId": data.run_id or event.run_id, "agentRole": data.agent_role,
                               "engine": data.engine, "model": data.model}, event="init")]
        if kind is RunError:
            self.error_sent = True
            return [sse_frame({"code": data.code or "error", "message": data.message}, event="error")]
        if kind is RunEnded:
            self.finished = True
            if data.status == "succeeded":
                return [sse_frame({"messageId": data.message_id, "sessionId": data.session_id or None,
                                   "text": data.text, "usage": data.usage or {}}, event="done")]
            if self.error_sent:
                return []
            self.error_sent = True
            code = data.error_code or ("cancelled" if data.status == "cancelled" else "run_failed")
            return [sse_frame({"code": code, "message": data.error or f"Run {data.status}."}, event="error")]
        return []

"""The seed-000 dialect, shared by ``POST /api/v1/chat/stream`` (SSE) and ``/ws/chat``.

Every event is one JSON object with a ``type``; on SSE each is framed ``data: <json>\\n\\n``,
on the WebSocket each is one text message::

    {"type": "content_delta", "content": "Hel"}
    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}}
    {"type": "tool_use", "id": "toolu_2", "name": "write_file", "input": {...},
     "status": "awaiting_input", "confirmation_id": "<uuid>"}
    {"type": "tool_result", "tool_use_id": "toolu_1", "name": "read_file", "output": "...",
     "is_error": false, "status": "succeeded"}            (status: succeeded | failed | denied)
    {"type": "done", "content": "<full answer>", "conversation_id": "<uuid>", "run_id": "<uuid>",
     "message_id": "<uuid>", "usage": {"input_tokens": 10, "output_tokens": 5}}
    {"type": "error", "message": "<readable>", "code": "<stable code>"}

A stream ends after ``done`` or ``error``. Canonical events without a seed-000 counterpart
(``agent.start``, ``agent.message``, ``context.patch``, the ``running`` tool state) are skipped.
Keep-alive on SSE: a ``: ping`` comment (the WebSocket needs none).
"""
from __future__ import annotations

from typing import Any

from core.events import (RecordedEvent, RunEnded, RunError, RunStarted, TextDelta,
                         ToolCallState, ToolStatus)

from .base import Dialect, sse_frame


class ChatStreamDialect(Dialect):
    name = "chat-stream"

    def translate(self, event: RecordedEvent) -> list[dict[str, Any]]:
        if self.finished:  # after done/error nothing more is sent
            return []
        data = event.data
        kind = type(data)
        if kind is TextDelta:
            return [{"type": "content_delta", "content": data.text}] if data.text else []
        if kind is ToolCallState:
            return self._tool(data)
        if kind is RunError:
            self.finished = True
            return [{"type": "error", "message": data.message or "The run failed.", "code": data.code or "run_failed"}]
        if kind is RunEnded:
            self.finished = True
            if data.status == "succeeded":
                return [{"type": "done", "content": data.text, "conversation_id": self.conversation_id,
                         "run_id": self.run_id, "message_id": data.message_id, "usage": data.usage or {}}]
            return [{"type": "error", "message": data.error or f"The run ended {data.status}.",
                     "code": data.error_code or str(data.status)}]
        if kind is RunStarted:
            self.conversation_id = self.conversation_id or data.conversation_id
        return []  # AssistantMessage, ContextPatch, … have no seed-000 form

    @staticmethod
    def _tool(call: ToolCallState) -> list[dict[str, Any]]:
        status = call.status
        base = {"id": call.tool_call_id, "name": call.name, "input": call.input or {}}
        if status == ToolStatus.PENDING:
            return [{"type": "tool_use", **base}]
        if status == ToolStatus.AWAITING_INPUT:
            return [{"type": "tool_use", **base, "status": ToolStatus.AWAITING_INPUT,
                     "confirmation_id": call.confirmation_id}]
        if status in ToolStatus.TERMINAL:
            failed = status != ToolStatus.SUCCEEDED
            output = call.error if failed else call.output
            return [{"type": "tool_result", "tool_use_id": call.tool_call_id, "name": call.name,
                     "output": output if output is not None else "", "is_error": failed, "status": status}]
        return []

    @staticmethod
    def encode(frame: Any) -> str:
        return frame if isinstance(frame, str) else sse_frame(frame)



"""The seed-000 event dialect, shared by ``POST /api/v1/chat/stream`` (SSE) and ``/ws/chat``.

Every event is one JSON object with a ``type``; on SSE each is framed ``data: <json>\\n\\n``::

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
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from chat_app.events import RecordedEvent, ToolStatus

from .base import sse_frame, with_pings


class Seed000Translator:
    """Maps one run's canonical events to seed-000 event objects, in order."""

    def __init__(self, *, conversation_id: str = "", run_id: str = ""):
        self.conversation_id = str(conversation_id)
        self.run_id = str(run_id)
        self.finished = False

    def translate(self, recorded: RecordedEvent) -> list[dict[str, Any]]:
        if self.finished:
            return []
        payload = recorded.payload
        name = recorded.event
        if name == "agent.start":
            self.conversation_id = self.conversation_id or payload.get("conversationId", "")
            self.run_id = self.run_id or recorded.run_id
            return []
        if name == "agent.delta":
            text = payload.get("text") or ""
            return [{"type": "content_delta", "content": text}] if text else []
        if name == "tool.state":
            return self._tool(payload)
        if name == "error":
            self.finished = True
            return [{"type": "error", "message": payload.get("message", "The run failed."),
                     "code": payload.get("code", "run_failed")}]
        if name == "agent.end":
            self.finished = True
            status = payload.get("status")
            if status == "succeeded":
                return [{
                    "type": "done",
                    "content": payload.get("text", ""),
                    "conversation_id": self.conversation_id,
                    "run_id": self.run_id or recorded.run_id,
                    "message_id": payload.get("messageId"),
                    "usage": payload.get("usage") or {},
                }]
            return [{"type": "error", "message": payload.get("error") or f"The run ended {status}.",
                     "code": payload.get("errorCode") or str(status)}]
        return []

    @staticmethod
    def _tool(payload: dict[str, Any]) -> list[dict[str, Any]]:
        status = payload.get("status")
        call = {"id": payload.get("toolCallId"), "name": payload.get("name"), "input": payload.get("input") or {}}
        if status == ToolStatus.PENDING:
            return [{"type": "tool_use", **call}]
        if status == ToolStatus.AWAITING_INPUT:
            return [{"type": "tool_use", **call, "status": ToolStatus.AWAITING_INPUT,
                     "confirmation_id": payload.get("confirmationId")}]
        if status in ToolStatus.TERMINAL:
            failed = status != ToolStatus.SUCCEEDED
            output = payload.get("error") if failed else payload.get("output")
            return [{"type": "tool_result", "tool_use_id": call["id"], "name": call["name"],
                     "output": output if output is not None else "", "is_error": failed, "status": status}]
        return []


async def seed000_events(source: AsyncIterator[RecordedEvent], *, conversation_id: str = "",
                         run_id: str = "") -> AsyncIterator[dict[str, Any]]:
    """The seed-000 objects for a run's event stream; stops after ``done`` or ``error``."""
    translator = Seed000Translator(conversation_id=conversation_id, run_id=run_id)
    async for recorded in source:
        for item in translator.translate(recorded):
            yield item
        if translator.finished:
            return


async def seed000_sse(source: AsyncIterator[RecordedEvent], *, conversation_id: str, run_id: str,
                      ping_interval: float) -> AsyncIterator[str]:
    """SSE frames (``data: <json>\\n\\n``), with a ``: ping`` comment on each idle interval."""
    translator = Seed000Translator(conversation_id=conversation_id, run_id=run_id)
    async for recorded in with_pings(source, ping_interval):
        if recorded is None:
            yield ": ping\n\n"
            continue
        for item in translator.translate(recorded):
            yield sse_frame(item)
        if translator.finished:
            return

"""The AI SDK UI message stream dialect (``POST /v1/agent/chat?format=vercel-ai``).

Checked against the ``ai`` npm package v6 (``uiMessageChunkSchema``, ``readUIMessageStream``):
the response has the header ``x-vercel-ai-ui-message-stream: v1`` and is SSE whose every
message is ``data: <one UI message chunk as JSON>``, ending with ``data: [DONE]``. Keep-alive
pings are SSE comments (``: ping``), which the SDK's event-stream parser skips.

Mapping of canonical events (one assistant UI message per run, its ``messageId`` = the run id)::

    (stream begins)     {"type":"start","messageId":runId,"messageMetadata":{"runId","conversationId"}}
                        {"type":"data-conversation","data":{"conversationId"}}   only if created
    agent.start         {"type":"start-step"}
    agent.delta         {"type":"text-start","id"} once per text run, then
                        {"type":"text-delta","id","delta"}
    tool.state pending  {"type":"text-end","id"} if text is open, then
                        {"type":"tool-input-start","toolCallId","toolName","dynamic":true}
                        {"type":"tool-input-available","toolCallId","toolName","input","dynamic":true}
      awaiting_input    {"type":"tool-approval-request","approvalId":confirmationId,"toolCallId"}
      succeeded         {"type":"tool-output-available","toolCallId","output","dynamic":true}
      failed / expired  {"type":"tool-output-error","toolCallId","errorText","dynamic":true}
      denied            {"type":"tool-output-denied","toolCallId"}
      every state       {"type":"data-tool-state","id":toolCallId,"data":<tool.state payload:
                         toolCallId, name, status, input, confirmationId?, output?, error?>}
                        (same ``id``, so the client keeps one part per tool call, updated)
      last tool done    {"type":"finish-step"}; the model's next output opens a new step
    context.patch       {"type":"data-context-patch","data":{"kind","data"},"transient":true}
    agent.message       the text as text-start/-delta/-end only if no delta streamed it
    error               {"type":"error","errorText":message}
    agent.end           {"type":"text-end"}/{"type":"finish-step"} as needed,
                        {"type":"abort","reason"} if cancelled, then
                        {"type":"finish","finishReason":"stop"|"error"|"other",
                         "messageMetadata":{"runId","conversationId","status","usage","messageId"?,"error"?}}
    (stream ends)       data: [DONE]

Tools are ``dynamic`` because the server owns them: the client has no typed tool definitions.

Requests: besides ``{conversationId?, input, ...}`` the endpoint takes the AI SDK's own body
``{id?, messages: UIMessage[]}`` (see :func:`parse_chat_request`). A body whose last message is
the assistant's, carrying tool parts in state ``approval-responded`` (what
``addToolApprovalResponse`` produces), is a decision, not a new turn: each confirmation is
decided and the response streams the rest of that run (from the ``awaiting_input`` event on),
continuing the same UI message. An approval may add ``remember`` (``"conversation"`` or
``"agent"``) and ``pattern`` to make the decision an approval rule, as on the REST decision.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from core.errors import InvalidInput
from core.events import RecordedEvent, ToolStatus, to_json

from .base import Dialect

DONE_FRAME = "data: [DONE]\n\n"

_FINISH_REASONS = {"succeeded": "stop", "failed": "error", "cancelled": "other"}

Part = dict[str, Any]


def data_frame(part: Part) -> str:
    return f"data: {to_json(part)}\n\n"


@dataclass
class UiMessageStreamTranslator:
    """Turns one run's canonical events into UI message chunks; keeps the text/step/tool state."""

    message_id: str
    conversation_id: str
    # Tool calls the client already has parts for (a stream that resumes after an approval).
    known_tool_calls: set[str] = field(default_factory=set)
    step_open: bool = False
    _text_id: str | None = None
    _text_count: int = 0
    _streamed_text: bool = False
    _open_tools: set[str] = field(default_factory=set)
    finished: bool = False

    def begin(self, *, conversation_created: bool = False) -> list[Part]:
        parts: list[Part] = [{"type": "start", "messageId": self.message_id,
                              "messageMetadata": {"runId": self.message_id, "conversationId": self.conversation_id}}]
        if conversation_created:
            parts.append({"type": "data-conversation", "data": {"conversationId": self.conversation_id}})
        return parts

    def translate(self, recorded: RecordedEvent) -> list[Part]:
        handler = self._HANDLERS.get(recorded.event)
        return handler(self, recorded) if handler else []

    def close(self) -> list[Part]:
        """Closing chunks when the source ended without ``agent.end`` (never the normal case)."""
        if self.finished:
            return []
        self.finished = True
        return [*self._end_text(), *self._end_step(), {"type": "finish"}]

    # --- state helpers ---------------------------------------------------------------------------
    def _start_step(self) -> list[Part]:
        if self.step_open:
            return []
        self.step_open = True
        return [{"type": "start-step"}]

    def _end_step(self) -> list[Part]:
        if not self.step_open:
            return []
        self.step_open = False
        return [*self._end_text(), {"type": "finish-step"}]

    def _start_text(self) -> list[Part]:
        if self._text_id is not None:
            return []
        self._text_count += 1
        self._text_id = f"text-{self._text_count}"
        return [{"type": "text-start", "id": self._text_id}]

    def _end_text(self) -> list[Part]:
        if self._text_id is None:
            return []
        text_id, self._text_id = self._text_id, None
        return [{"type": "text-end", "id": text_id}]

    def _text(self, text: str) -> list[Part]:
        if not text:
            return []
        self._streamed_text = True
        parts = [*self._start_step(), *self._start_text()]
        parts.append({"type": "text-delta", "id": self._text_id, "delta": text})
        return parts

    # --- one handler per canonical event ---------------------------------------------------------
    def _on_start(self, event: RecordedEvent) -> list[Part]:
        return self._start_step()

    def _on_delta(self, event: RecordedEvent) -> list[Part]:
        return self._text(event.data.text or "")

    def _on_message(self, event: RecordedEvent) -> list[Part]:
        if self._streamed_text:
            return self._end_text()
        return [*self._text(event.data.content or ""), *self._end_text()]

    def _on_tool_state(self, event: RecordedEvent) -> list[Part]:
        call, payload = event.data, event.payload
        call_id, name, status = str(call.tool_call_id or ""), str(call.name or ""), call.status
        parts: list[Part] = []
        if call_id not in self.known_tool_calls:
            # First sight of this call (normally its ``pending`` state; on a mid-run reconnect
            # possibly a later one): the client needs the tool part before any state of it.
            self.known_tool_calls.add(call_id)
            parts += [*self._end_text(), *self._start_step()]
            parts.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name, "dynamic": True})
            parts.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name,
                          "input": call.input or {}, "dynamic": True})
        if status not in ToolStatus.TERMINAL:
            self._open_tools.add(call_id)
        if status == ToolStatus.AWAITING_INPUT and call.confirmation_id:
            parts.append({"type": "tool-approval-request", "approvalId": str(call.confirmation_id),
                          "toolCallId": call_id})
        elif status == ToolStatus.SUCCEEDED:
            parts.append({"type": "tool-output-available", "toolCallId": call_id, "output": call.output,
                          "dynamic": True})
        elif status in (ToolStatus.FAILED, ToolStatus.EXPIRED):
            parts.append({"type": "tool-output-error", "toolCallId": call_id,
                          "errorText": str(call.error or "Tool call failed."), "dynamic": True})
        elif status == ToolStatus.DENIED:
            parts.append({"type": "tool-output-denied", "toolCallId": call_id})
        parts.append({"type": "data-tool-state", "id": call_id, "data": payload})
        if status in ToolStatus.TERMINAL:
            self._open_tools.discard(call_id)
            if not self._open_tools:
                # The model sees the tool results in its next call: that is a new step.
                parts += self._end_step()
        return parts

    def _on_context_patch(self, event: RecordedEvent) -> list[Part]:
        return [{"type": "data-context-patch", "data": event.payload, "transient": True}]

    def _on_error(self, event: RecordedEvent) -> list[Part]:
        message = str(event.data.message or event.data.code or "Run failed.")
        return [{"type": "error", "errorText": message}]

    def _on_end(self, event: RecordedEvent) -> list[Part]:
        end = event.data
        status = str(end.status or "")
        parts = [*self._end_text(), *self._end_step()]
        if status == "cancelled":
            parts.append({"type": "abort", "reason": str(end.error or "cancelled")})
        metadata = {"runId": self.message_id, "conversationId": self.conversation_id, "status": status,
                    "usage": end.usage or {}}
        for key, value in (("messageId", end.message_id), ("error", end.error), ("errorCode", end.error_code)):
            if value:
                metadata[key] = value
        parts.append({"type": "finish", "finishReason": _FINISH_REASONS.get(status, "other"), "messageMetadata": metadata})
        self.finished = True
        return parts

    _HANDLERS: ClassVar[dict[str, Callable[["UiMessageStreamTranslator", RecordedEvent], list[Part]]]] = {
        "agent.start": _on_start,
        "agent.delta": _on_delta,
        "agent.message": _on_message,
        "tool.state": _on_tool_state,
        "context.patch": _on_context_patch,
        "error": _on_error,
        "agent.end": _on_end,
    }


class VercelAiDialect(Dialect):
    """The UI message stream of a run's events (replay then live), ending with ``[DONE]``.

    Options ``known_tool_calls`` / ``resuming``: set when the stream continues a UI message the
    client already holds (after an approval), so its tool parts and open step are not repeated.
    """

    name = "vercel-ai"
    headers = {"x-vercel-ai-ui-message-stream": "v1"}

    def __init__(self, *, known_tool_calls: set[str] | None = None, resuming: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.translator = UiMessageStreamTranslator(message_id=self.run_id, conversation_id=self.conversation_id,
                                                    known_tool_calls=set(known_tool_calls or ()),
                                                    step_open=resuming)

    def opening(self) -> list[str]:
        return [data_frame(part) for part in self.translator.begin(conversation_created=self.conversation_created)]

    def translate(self, event: RecordedEvent) -> list[str]:
        frames = [data_frame(part) for part in self.translator.translate(event)]
        self.finished = self.translator.finished
        return frames

    def closing(self) -> list[str]:
        return [*(data_frame(part) for part in self.translator.close()), DONE_FRAME]


# --- requests --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ApprovalResponse:
    confirmation_id: str
    approved: bool
    reason: str
    tool_call_id: str
    # Also make the decision an approval rule: "conversation" or "agent" (staff), optional pattern.
    remember: str | None = None
    pattern: str | None = None


@dataclass(frozen=True)
class UiChatRequest:
    chat_id: str | None
    # The last user message's text (None when the request is only approval responses).
    input: str | None
    # Earlier user/assistant turns as text, oldest first (used when the chat id is not a
    # conversation of the caller's, i.e. a new conversation).
    history: list[dict[str, str]]
    approvals: list[ApprovalResponse]


def is_ui_chat_request(body: Any) -> bool:
    return isinstance(body, dict) and "messages" in body and "input" not in body


def _is_tool_part(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def _text_of(message: dict[str, Any]) -> str:
    texts = [p["text"] for p in message["parts"] if p.get("type") == "text" and isinstance(p.get("text"), str)]
    return "\n".join(t for t in texts if t.strip())


def _approvals_of(message: dict[str, Any]) -> list[ApprovalResponse]:
    out = []
    for part in message["parts"]:
        if not (_is_tool_part(part) and part.get("state") == "approval-responded"):
            continue
        approval = part.get("approval")
        if not (isinstance(approval, dict) and isinstance(approval.get("id"), str)
                and isinstance(approval.get("approved"), bool)):
            raise InvalidInput("An approval-responded tool part needs approval {id: string, approved: boolean}.",
                               code="invalid_input")
        reason = approval.get("reason")
        remember, pattern = approval.get("remember"), approval.get("pattern")
        if remember not in (None, "conversation", "agent") or not isinstance(pattern, (str, type(None))):
            raise InvalidInput('approval.remember is "conversation" or "agent"; approval.pattern is a string.',
                               code="invalid_input")
        out.append(ApprovalResponse(confirmation_id=approval["id"], approved=approval["approved"],
                                    reason=reason if isinstance(reason, str) else "",
                                    tool_call_id=str(part.get("toolCallId") or ""),
                                    remember=remember, pattern=pattern))
    return out


def parse_chat_request(body: dict[str, Any]) -> UiChatRequest:
    """Reads the AI SDK chat body ``{id?, messages: UIMessage[]}``.

    Raises:
        InvalidInput: not a list of ``{role, parts: [...]}`` messages, or no user text to answer.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list of UI messages.", code="invalid_input")
    for index, message in enumerate(messages):
        if not (isinstance(message, dict) and message.get("role") in ("user", "assistant", "system")
                and isinstance(message.get("parts"), list) and all(isinstance(p, dict) for p in message["parts"])):
            raise InvalidInput(f"messages[{index}] must be {{role: user|assistant|system, parts: [...]}}.",
                               code="invalid_input")
    chat_id = body.get("id") if isinstance(body.get("id"), str) and body.get("id") else None
    last = messages[-1]
    if last["role"] == "assistant":
        approvals = _approvals_of(last)
        if approvals:
            return UiChatRequest(chat_id=chat_id, input=None, history=[], approvals=approvals)
    user_indexes = [i for i, m in enumerate(messages) if m["role"] == "user"]
    text = _text_of(messages[user_indexes[-1]]) if user_indexes else ""
    if not text:
        raise InvalidInput("The last user message has no text part to answer.", code="invalid_input")
    history = [{"role": m["role"], "content": _text_of(m)} for m in messages[: user_indexes[-1]]
               if m["role"] in ("user", "assistant") and _text_of(m)]
    return UiChatRequest(chat_id=chat_id, input=text, history=history, approvals=[])

"""Canonical run events: the one vocabulary engines produce and transports translate.

Each event is a typed dataclass with an ``event`` name and ``to_dict()`` giving its payload in
the seed-001 (camelCase) shape, which is also what the timeline stores. Every client dialect
(``chat_app/sse/*``, the WebSocket consumer, ACP, ``/chat``) is a mapping of this set.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


class ToolStatus:
    PENDING = "pending"
    RUNNING = "running"
    AWAITING_INPUT = "awaiting_input"
    APPROVED = "approved"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    EXPIRED = "expired"
    TERMINAL = frozenset({SUCCEEDED, FAILED, DENIED, EXPIRED})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass
class RunEventBase:
    event: ClassVar[str] = ""
    # Event names that must be on disk before the stream moves on (state changes).
    durable: ClassVar[bool] = True

    def to_dict(self) -> dict[str, Any]:
        return {_camel(f.name): getattr(self, f.name) for f in fields(self)}


@dataclass
class RunStarted(RunEventBase):
    event: ClassVar[str] = "agent.start"
    run_id: str
    conversation_id: str
    agent_role: str
    engine: str
    model: str
    provider: str = ""
    session_id: str = ""
    route_note: str = ""


@dataclass
class TextDelta(RunEventBase):
    event: ClassVar[str] = "agent.delta"
    durable: ClassVar[bool] = False
    text: str
    # Which agent produced the text, for engines that switch agents (Ollama delegation).
    agent: str = ""


@dataclass
class AssistantMessage(RunEventBase):
    event: ClassVar[str] = "agent.message"
    message_id: str
    content: str
    role: str = "assistant"


@dataclass
class ToolCallState(RunEventBase):
    event: ClassVar[str] = "tool.state"
    tool_call_id: str
    name: str
    status: str
    input: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    confirmation_id: str | None = None
    # The approval policy's decision once made: {effect: allow|ask|deny, rule, ruleId}.
    policy: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        return {k: v for k, v in data.items() if v is not None}


@dataclass
class ContextPatch(RunEventBase):
    """Something the run added to the conversation context: a step, a delegation, a tool result."""

    event: ClassVar[str] = "context.patch"
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunEnded(RunEventBase):
    event: ClassVar[str] = "agent.end"
    status: str
    error: str | None = None
    error_code: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    session_id: str = ""
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        return {k: v for k, v in data.items() if v is not None}


@dataclass
class RunError(RunEventBase):
    event: ClassVar[str] = "error"
    code: str
    message: str


EVENT_TYPES: dict[str, type[RunEventBase]] = {
    cls.event: cls for cls in (RunStarted, TextDelta, AssistantMessage, ToolCallState, ContextPatch, RunEnded, RunError)
}


@dataclass(frozen=True)
class RecordedEvent:
    """An event as delivered to subscribers: its place in the run's log and its payload."""

    run_id: str
    seq: int
    event: str
    at: str
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "event": self.event, "at": self.at, "payload": self.payload}

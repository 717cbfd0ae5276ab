"""Canonical run events: the one vocabulary engines produce and every transport translates.

Each event is a typed dataclass with an ``event`` name. ``to_dict()`` gives its payload in the
seed-001 camelCase shape (what the timeline stores and the agent-chat dialect sends) and
``from_dict()`` reads it back, so a replay from the database hands dialects the same typed
objects a live run does. Dialects read attributes (``event.text``), never payload dicts.

:class:`RecordedEvent` is an event with its place in the run's log (``seq``) and its time. Its
payload dict and JSON text are computed at most once, on first use, and shared by the recorder
and every subscriber. ``to_json()`` is the payload's one encoding; :class:`TextDelta` (thousands
a run) gives it directly, byte for byte the generic one, without building the dict. (A live run
keeps its deltas compactly and rebuilds them for readers: see ``chat_app.eventlog``.)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from functools import cache
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


@cache
def _field_keys(cls: type) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, _camel(f.name)) for f in fields(cls))


@dataclass
class RunEventBase:
    event: ClassVar[str] = ""
    # State changes are on disk before the run moves on; text deltas are written in batches.
    durable: ClassVar[bool] = True
    # Keys left out of the payload when their value is None.
    _optional: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for name, key in _field_keys(type(self)):
            value = getattr(self, name)
            if value is None and name in self._optional:
                continue
            out[key] = value
        return out

    def to_json(self) -> str:
        """``to_json(self.to_dict())``: the payload's one encoding (classes may give it faster)."""
        return to_json(self.to_dict())

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> "RunEventBase":
        kwargs = {name: payload[key] for name, key in _field_keys(cls) if key in payload}
        try:
            return cls(**kwargs)
        except TypeError:  # a row written by an older version lacks a required field
            return UnknownEvent(name=cls.event, payload=dict(payload))


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

    def to_json(self) -> str:
        return self.json_of(self.text, self.agent)

    @staticmethod
    def json_of(text: str, agent: str) -> str:
        """The payload's JSON, thousands a second: the same text as ``to_json(to_dict())``
        without the dict (keys in field order, strings escaped by the encoder's own function)."""
        if type(text) is not str or type(agent) is not str:
            return to_json({"text": text, "agent": agent})
        if agent:
            return f'{{"text":{_encode_str(text)},"agent":{_encode_str(agent)}}}'
        return f'{{"text":{_encode_str(text)},"agent":""}}'


@dataclass
class Thought(RunEventBase):
    """Reasoning an engine shows (the Ollama orchestrator's ``thought``); not part of the answer."""

    event: ClassVar[str] = "agent.thought"
    durable: ClassVar[bool] = False
    text: str
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
    _optional: ClassVar[frozenset[str]] = frozenset({"output", "error", "confirmation_id", "policy"})
    tool_call_id: str
    name: str
    status: str
    input: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    confirmation_id: str | None = None
    # Why the call ran, asked or was refused: {"effect": "allow"|"ask"|"deny", "rule": "..."}.
    policy: dict[str, Any] | None = None


@dataclass
class ContextPatch(RunEventBase):
    """Something the run added to the conversation context: a step, a delegation, a tool result."""

    event: ClassVar[str] = "context.patch"
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunEnded(RunEventBase):
    event: ClassVar[str] = "agent.end"
    _optional: ClassVar[frozenset[str]] = frozenset({"error", "error_code", "message_id"})
    status: str
    error: str | None = None
    error_code: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    session_id: str = ""
    text: str = ""


@dataclass
class RunError(RunEventBase):
    event: ClassVar[str] = "error"
    code: str
    message: str


@dataclass
class ProviderAttempt(RunEventBase):
    """One try of a provider when the run failed over: recorded for the failed attempt(s) and
    for the one that ended the run (a run that succeeds at its first try records none)."""

    event: ClassVar[str] = "provider.attempt"
    _optional: ClassVar[frozenset[str]] = frozenset({"error_code", "error", "next", "retry_after"})
    attempt: int
    provider: str
    model: str
    status: str  # "failed" | "succeeded"
    duration_ms: float = 0.0
    error_code: str | None = None
    error: str | None = None
    # "provider/model" the run moves to next (a failed attempt that was failed over).
    next: str | None = None
    retry_after: float | None = None


@dataclass
class UnknownEvent(RunEventBase):
    """A recorded event this version has no class for (or cannot read): passed through as is."""

    name: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def event(self) -> str:  # type: ignore[override]
        return self.name

    def to_dict(self) -> dict[str, Any]:
        return dict(self.payload)


EVENT_TYPES: dict[str, type[RunEventBase]] = {
    cls.event: cls
    for cls in (RunStarted, TextDelta, Thought, AssistantMessage, ToolCallState, ContextPatch, RunEnded, RunError,
                ProviderAttempt)
}


def event_from_dict(name: str, payload: dict[str, Any]) -> RunEventBase:
    cls = EVENT_TYPES.get(name)
    if cls is None or not isinstance(payload, dict):
        return UnknownEvent(name=name, payload=payload if isinstance(payload, dict) else {"value": payload})
    return cls.from_dict(payload)


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# The function _ENCODER escapes every string with (ensure_ascii=False): a string alone, encoded.
_encode_str = json.encoder.encode_basestring


def to_json(value: Any) -> str:
    """Compact JSON, UTF-8 kept as is: the one encoding the wire and the timeline share."""
    return _ENCODER.encode(value)


class RecordedEvent:
    """An event in a run's log: ``seq``, time, the typed event; payload and JSON computed once."""

    __slots__ = ("run_id", "seq", "ts", "data", "_payload", "_json")

    def __init__(self, run_id: str, seq: int, data: RunEventBase, ts: float | None = None,
                 payload: dict[str, Any] | None = None, payload_json: str | None = None):
        self.run_id = run_id
        self.seq = seq
        self.data = data
        self.ts = time.time() if ts is None else ts
        self._payload = payload
        self._json = payload_json

    @classmethod
    def from_payload(cls, run_id: str, seq: int, name: str, payload: dict[str, Any], *,
                     ts: float | None = None) -> "RecordedEvent":
        """An event as stored (name + camelCase payload), e.g. read back from the timeline."""
        return cls(run_id, seq, event_from_dict(name, payload), ts=ts, payload=payload)

    @property
    def event(self) -> str:
        return self.data.event

    @property
    def payload(self) -> dict[str, Any]:
        if self._payload is None:
            self._payload = self.data.to_dict()
        return self._payload

    @property
    def payload_json(self) -> str:
        if self._json is None:
            # A payload read back from the database is encoded as read; a live event, by its class.
            self._json = self.data.to_json() if self._payload is None else to_json(self._payload)
        return self._json

    @property
    def at(self) -> str:
        return datetime.fromtimestamp(self.ts, tz=timezone.utc).isoformat()

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "event": self.event, "at": self.at, "payload": self.payload}

    def __repr__(self) -> str:
        return f"RecordedEvent({self.run_id}#{self.seq} {self.event})"

"""The seed-001 agent-chat SSE dialect (``POST /v1/agent/chat``, ``GET /v1/agent/runs/:id/events``).

Wire format, one SSE message per canonical event, no ``event:`` field (so a browser
``EventSource.onmessage`` sees every message)::

    id: <seq>
    data: {"event":"<name>","data":{...payload...},"id":<seq>}

The payload is the recorded event's camelCase payload unchanged, encoded once and shared with
the timeline, so the stream, the timeline and every reconnect agree byte for byte. ``id`` is the
run-log seq: a client that reconnects with ``Last-Event-ID: <seq>`` gets exactly the events after
it. Consecutive deltas that arrive faster than the client reads are merged into one
``agent.delta`` (its ``id`` the last merged seq).

Two messages are not part of the run's log; they still carry an ``id:`` line, so a browser's
``lastEventId`` is always a seq to resume from (and no message lacks one):

- ``conversation.created`` (``{"conversationId"}``), first, when the request created the
  conversation, with ``id: 0`` (resuming from 0 replays everything);
- ``ping`` (``{"at": <iso time>}``) every ``SSE_PING_INTERVAL`` seconds while the stream is
  open, whether or not other events flowed meanwhile (also while the run waits for a person's
  decision), with the ``id`` of the last run event sent (0 before any).
"""
from __future__ import annotations

from datetime import datetime, timezone

from core.events import RecordedEvent

from .base import Dialect, sse_frame

CONVERSATION_CREATED = "conversation.created"
PING = "ping"


def event_frame(recorded: RecordedEvent) -> str:
    seq = recorded.seq
    return f'id: {seq}\ndata: {{"event":"{recorded.event}","data":{recorded.payload_json},"id":{seq}}}\n\n'


def conversation_created_frame(conversation_id: str) -> str:
    return sse_frame({"event": CONVERSATION_CREATED, "data": {"conversationId": str(conversation_id)}}, id=0)


def ping_frame(last_seq: int = 0) -> str:
    return sse_frame({"event": PING, "data": {"at": datetime.now(timezone.utc).isoformat()}}, id=last_seq)


class AgentChatDialect(Dialect):
    name = "agent-chat"

    def opening(self) -> list[str]:
        return [conversation_created_frame(self.conversation_id)] if self.conversation_created else []

    def translate(self, event: RecordedEvent) -> list[str]:
        if event.event == "agent.end":
            self.finished = True
        return [event_frame(event)]

    def ping(self) -> list[str]:
        return [ping_frame(self.last_seq)]

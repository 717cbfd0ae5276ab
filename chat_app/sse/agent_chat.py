"""The seed-001 agent-chat SSE dialect (``POST /v1/agent/chat``, ``GET /v1/agent/runs/:id/events``).

Wire format, one SSE message per canonical event, no ``event:`` field (so a browser
``EventSource.onmessage`` sees every message)::

    id: <seq>
    data: {"event":"<name>","data":{...payload...},"id":<seq>}

The payload is the recorded event's camelCase payload unchanged (``RecordedEvent.payload``),
so the stream, the timeline and every reconnect agree byte for byte. ``id`` is the run-log seq:
a client that reconnects with ``Last-Event-ID: <seq>`` gets exactly the events after it.

Two messages are not part of the run's log and so carry no ``id:``:

- ``conversation.created`` (``{"conversationId"}``), first, when the request created the
  conversation;
- ``ping`` (``{"at": <iso time>}``) every ``SSE_PING_INTERVAL`` seconds without another event,
  while the run is open (also while it waits for a person's decision).
"""
from __future__ import annotations

from typing import AsyncIterator

from django.utils import timezone

from chat_app.events import RecordedEvent

from .base import sse_frame, with_pings

NAME = "agent-chat"
CONVERSATION_CREATED = "conversation.created"
PING = "ping"
HEADERS: dict[str, str] = {}


def event_frame(recorded: RecordedEvent) -> str:
    return sse_frame({"event": recorded.event, "data": recorded.payload, "id": recorded.seq}, id=recorded.seq)


def conversation_created_frame(conversation_id: str) -> str:
    return sse_frame({"event": CONVERSATION_CREATED, "data": {"conversationId": str(conversation_id)}})


def ping_frame() -> str:
    return sse_frame({"event": PING, "data": {"at": timezone.now().isoformat()}})


async def render(
    events: AsyncIterator[RecordedEvent],
    *,
    run_id: str,
    conversation_id: str,
    conversation_created: bool = False,
    ping_interval: float,
    **_: object,
) -> AsyncIterator[str]:
    """The SSE text of a run's events (replay then live), with pings, until ``agent.end``."""
    if conversation_created:
        yield conversation_created_frame(conversation_id)
    async for item in with_pings(events, ping_interval):
        yield ping_frame() if item is None else event_frame(item)

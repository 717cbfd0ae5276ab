"""Reads for the chat app. Another user's object is reported as not found, never forbidden."""
from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet

from core.errors import NotFound

from .group_commit import wait_written
from .models import Conversation, Message, Run, RunEvent


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError):
        return None


def conversation_list(*, user: Any) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user).select_related("agent").order_by("-updated_at", "-created_at")


def conversation_get(*, user: Any, conversation_id: Any) -> Conversation:
    pk = _uuid_or_none(conversation_id)
    if pk:
        wait_written(pk)  # a run that started it a moment ago in this process
    conversation = Conversation.objects.select_related("agent").filter(id=pk, owner=user).first() if pk else None
    if conversation is None:
        raise NotFound("Conversation not found.", code="conversation_not_found")
    return conversation


def message_list(*, user: Any, conversation_id: Any) -> QuerySet[Message]:
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return conversation.messages.order_by("created_at", "id")


def run_get(*, user: Any, run_id: Any, not_found_code: str = "run_not_found") -> Run:
    pk = _uuid_or_none(run_id)
    if pk:
        wait_written(pk)  # a run that started a moment ago in this process
    run = (
        Run.objects.select_related("conversation", "agent").filter(id=pk, conversation__owner=user).first()
        if pk
        else None
    )
    if run is None:
        raise NotFound("Run not found.", code=not_found_code)
    return run


def run_timeline(*, user: Any, run_id: Any) -> tuple[Run, QuerySet[RunEvent]]:
    run = run_get(user=user, run_id=run_id, not_found_code="run_timeline_not_found")
    return run, run.events.order_by("seq")


def conversation_search(*, user: Any, query: str) -> QuerySet[Conversation]:
    """Your conversations whose title or any message (user, assistant or tool) contains ``query``.

    Case-insensitive substring match (``icontains``: works the same on SQLite and PostgreSQL, and
    for CJK text, which has no word boundaries a full-text index could use). Newest activity first.
    """
    query = (query or "").strip()
    conversations = conversation_list(user=user)
    if not query:
        return conversations
    matching = Message.objects.filter(conversation__owner=user, content__icontains=query).values("conversation_id")
    return conversations.filter(Q(title__icontains=query) | Q(id__in=matching))


# A message a regenerate or an edit replaced (``metadata.superseded``); written as a Q because a
# plain ``exclude(metadata__superseded=True)`` also drops rows without the key (SQL NULL).
NOT_SUPERSEDED = Q(metadata__superseded__isnull=True) | ~Q(metadata__superseded=True)


def conversation_last_turn(*, conversation: Conversation) -> Message | None:
    """The conversation's latest user message that a regenerate has not superseded, or None."""
    return (conversation.messages.filter(NOT_SUPERSEDED, role=Message.Role.USER)
            .order_by("-created_at", "-id").first())

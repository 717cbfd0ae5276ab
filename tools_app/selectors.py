"""Reads for tool confirmations and approval rules. Another user's confirmation is never listed."""
from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from core.errors import InvalidInput

from .models import ToolConfirmation, ToolRule


def tool_confirmation_list(*, user: Any, status: str | None = None) -> QuerySet[ToolConfirmation]:
    """The caller's confirmations, newest first, optionally filtered by status.

    ``pending`` means "still waiting for you": rows whose deadline passed or whose run already
    ended (e.g. the process that ran it stopped) are left out, since deciding them changes nothing.

    Raises:
        InvalidInput: an unknown status.
    """
    qs = ToolConfirmation.objects.filter(run__conversation__owner=user).select_related("run", "decided_by")
    if status is None or status == "":
        return qs.order_by("-created_at")
    if status not in ToolConfirmation.Status.values:
        raise InvalidInput(
            f"Unknown status {status!r}; use one of: {', '.join(ToolConfirmation.Status.values)}.",
            code="invalid_status",
        )
    qs = qs.filter(status=status)
    if status == ToolConfirmation.Status.PENDING:
        from chat_app.models import Run

        qs = qs.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).exclude(run__status__in=Run.TERMINAL)
    return qs.order_by("-created_at")


def tool_confirmation_awaiting_seq(*, confirmation: ToolConfirmation) -> int:
    """The run-log seq of the ``tool.state awaiting_input`` event that asked for this confirmation.

    A stream that resumes a run after a decision starts right after it, so the client sees the
    tool go ``running`` and everything after it, with nothing missed and nothing repeated. 0 when
    the event is not (yet) recorded, which replays the run from its start.
    """
    from chat_app.models import RunEvent

    seq = (
        RunEvent.objects.filter(
            run_id=confirmation.run_id,
            event="tool.state",
            payload__confirmationId=str(confirmation.id),
            payload__status="awaiting_input",
        )
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    return int(seq or 0)


# --- approval rules ------------------------------------------------------------------------------

def tool_rules_for_call(*, agent_id: Any, conversation_id: Any) -> list[ToolRule]:
    """Every rule that applies to a call by this agent in this conversation, in one query."""
    scopes = Q(scope=ToolRule.Scope.GLOBAL)
    if agent_id is not None:
        scopes |= Q(scope=ToolRule.Scope.AGENT, agent_id=agent_id)
    if _uuid_or_none(conversation_id) is not None:
        scopes |= Q(scope=ToolRule.Scope.CONVERSATION, conversation_id=_uuid_or_none(conversation_id))
    return list(ToolRule.objects.filter(scopes).order_by("id"))


def tool_rule_list(*, conversation_id: Any) -> QuerySet[ToolRule]:
    """A conversation's own rules, oldest first (the caller has checked the conversation is theirs)."""
    return ToolRule.objects.filter(scope=ToolRule.Scope.CONVERSATION, conversation_id=conversation_id).order_by(
        "created_at", "id")


def tool_confirmations_still_waiting() -> QuerySet[ToolConfirmation]:
    """Pending confirmations a decision can still change: not past their deadline, run not ended."""
    from chat_app.models import Run

    return ToolConfirmation.objects.filter(status=ToolConfirmation.Status.PENDING).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).exclude(run__status__in=Run.TERMINAL)


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None

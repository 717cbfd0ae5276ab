"""Reads for tool confirmations. Another user's confirmation is never listed."""
from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from core.errors import InvalidInput

from .models import ToolConfirmation


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

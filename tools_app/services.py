"""Tool confirmation services: deciding is atomic, the first decision wins."""
from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from core.doorbell import ring
from core.errors import Conflict, NotFound

from .models import ToolConfirmation
from .permissions import can_decide_confirmation


def tool_confirmation_get(*, user: Any, confirmation_id: str) -> ToolConfirmation:
    confirmation = (
        ToolConfirmation.objects.select_related("run__conversation").filter(id=confirmation_id).first()
        if _is_uuid(confirmation_id)
        else None
    )
    if confirmation is None or not can_decide_confirmation(user=user, confirmation=confirmation):
        raise NotFound("Tool confirmation not found.", code="confirmation_not_found")
    return confirmation


def tool_confirmation_decide(*, user: Any, confirmation_id: str, approved: bool, reason: str = "") -> ToolConfirmation:
    """Approve or deny a pending confirmation, then wake the waiting run.

    Raises:
        NotFound: unknown id, or another user's confirmation.
        Conflict: ``confirmation_expired`` past its ``expiresAt`` or when its run no longer
            executes anywhere (the row becomes ``expired``); ``confirmation_already_decided``
            otherwise. The first decision wins.
    """
    confirmation = tool_confirmation_get(user=user, confirmation_id=confirmation_id)
    _expire_if_stale(confirmation)
    status = ToolConfirmation.Status.APPROVED if approved else ToolConfirmation.Status.DENIED
    with transaction.atomic():
        updated = ToolConfirmation.objects.filter(id=confirmation.id, status=ToolConfirmation.Status.PENDING).update(
            status=status, decided_by=user, decided_at=timezone.now(), reason=reason[:2000]
        )
        if not updated:
            confirmation.refresh_from_db()
            raise Conflict(
                f"Tool confirmation was already {confirmation.status}.",
                code="confirmation_already_decided",
                extra={"status": confirmation.status},
            )
        run_id = str(confirmation.run_id)
        transaction.on_commit(lambda: _ring_sync(run_id, str(confirmation.id)))
    confirmation.refresh_from_db()
    return confirmation


def _expire_if_stale(confirmation: ToolConfirmation) -> None:
    """Nobody approves a ghost: a confirmation past its deadline, or whose run ended or executes
    nowhere any more (lease expired: its server stopped), becomes ``expired`` and says so."""
    run = confirmation.run
    now = timezone.now()
    if confirmation.status == ToolConfirmation.Status.PENDING:
        reason = ""
        if confirmation.expires_at is not None and confirmation.expires_at <= now:
            reason = "nobody decided in time"
        elif run.status in ("succeeded", "failed", "cancelled"):
            reason = f"its run already {run.status}"
        elif run.lease_expires_at is None or run.lease_expires_at <= now:
            reason = "its run no longer executes (the server stopped)"
        if reason and ToolConfirmation.objects.filter(id=confirmation.id, status=ToolConfirmation.Status.PENDING).update(
                status=ToolConfirmation.Status.EXPIRED, decided_at=now, reason=reason):
            confirmation.status = ToolConfirmation.Status.EXPIRED
            confirmation.reason = reason
    if confirmation.status == ToolConfirmation.Status.EXPIRED:
        raise Conflict(f"Tool confirmation expired: {confirmation.reason or 'nobody decided in time'}.",
                       code="confirmation_expired", extra={"status": confirmation.status})


def _ring_sync(run_id: str, confirmation_id: str) -> None:
    async_to_sync(ring)(run_id, "confirmation", key=confirmation_id)


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True

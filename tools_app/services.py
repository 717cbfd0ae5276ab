"""Tool confirmation services: deciding is atomic, the first decision wins."""
from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from chat_app.doorbell import ring
from orchestrator_site.errors import Conflict, NotFound

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
        Conflict: already decided (or expired); the first decision wins.
    """
    confirmation = tool_confirmation_get(user=user, confirmation_id=confirmation_id)
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


def _ring_sync(run_id: str, confirmation_id: str) -> None:
    async_to_sync(ring)(run_id, "confirmation", key=confirmation_id)


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True

"""Permission checks as small functions, called inside services."""
from __future__ import annotations

from typing import Any


def can_decide_confirmation(*, user: Any, confirmation: Any) -> bool:
    """Only the owner of the run's conversation decides its tool calls."""
    return bool(user and user.is_authenticated and confirmation.run.conversation.owner_id == user.id)

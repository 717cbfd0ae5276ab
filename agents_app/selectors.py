"""Reads for agents."""
from __future__ import annotations

from django.db.models import QuerySet

from core.errors import NotFound

from .models import Agent


def agent_list(*, enabled_only: bool = True) -> QuerySet[Agent]:
    qs = Agent.objects.all().order_by("role")
    return qs.filter(enabled=True) if enabled_only else qs


def agent_roles() -> list[str]:
    return list(agent_list().values_list("role", flat=True))


def agent_get_for_run(*, role: str) -> Agent:
    agent = Agent.objects.filter(role=role, enabled=True).first() if isinstance(role, str) else None
    if agent is None:
        roles = agent_roles()
        raise NotFound(
            f"Unknown agent role {role!r}. Valid roles: {', '.join(roles) or 'none'}.",
            code="agent_not_found",
            extra={"valid_roles": roles},
        )
    return agent

"""Reads for agents."""
from __future__ import annotations

import os

from django.db.models import QuerySet

from core.errors import NotFound
from core.refreshing_cache import RefreshingCache, seconds_setting

from .models import Agent
from .specs import AgentSpec, agent_spec


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


# role -> (agent, spec, CLAUDE.md mtime, CLAUDE.md path). Starting a run needs the agent and its frozen spec
# (prompt + CLAUDE.md); both change rarely, and saving an agent clears this at once in this
# process (agents_app/apps.py); other processes see an edit within AGENT_CACHE_SECONDS (an expired
# spec is served once more while it reloads in the background: core/refreshing_cache.py).
_SPECS: RefreshingCache[tuple[Agent, AgentSpec, float | None, str]] = RefreshingCache(
    "agent spec", ttl=seconds_setting("AGENT_CACHE_SECONDS"))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _load_for_run(role: str) -> tuple[Agent, AgentSpec, float | None, str]:
    agent = agent_get_for_run(role=role)
    path = str(agent.workspace_path / "CLAUDE.md")  # kept as text: every run start stats it
    return agent, agent_spec(agent), _mtime(path), path


def agent_for_run(*, role: str) -> tuple[Agent, AgentSpec]:
    """The enabled agent ``role`` and its frozen spec (cached briefly; a CLAUDE.md edit counts).

    Raises:
        NotFound: ``agent_not_found``, listing the valid roles.
    """
    if not isinstance(role, str):
        agent, spec, _, _ = _load_for_run(role)
        return agent, spec
    agent, spec, _, _ = _SPECS.get(role, lambda: _load_for_run(role), valid=lambda hit: hit[2] == _mtime(hit[3]))
    return agent, spec


def agent_cache_clear(**_: object) -> None:
    _SPECS.clear()

"""Reads for agents."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from core.errors import NotFound

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


# role -> (expires, agent, spec, CLAUDE.md mtime). Starting a run needs the agent and its frozen
# spec (prompt + CLAUDE.md); both change rarely, and saving an agent clears this at once in this
# process (agents_app/apps.py); other processes see an edit within AGENT_CACHE_SECONDS.
_SPECS: dict[str, tuple[float, Agent, AgentSpec, float | None]] = {}
_SPECS_LOCK = threading.Lock()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def agent_for_run(*, role: str) -> tuple[Agent, AgentSpec]:
    """The enabled agent ``role`` and its frozen spec (cached briefly; a CLAUDE.md edit counts).

    Raises:
        NotFound: ``agent_not_found``, listing the valid roles.
    """
    ttl = float(getattr(settings, "AGENT_CACHE_SECONDS", 0) or 0)
    hit = _SPECS.get(role) if ttl > 0 and isinstance(role, str) else None
    if hit is not None and hit[0] > time.monotonic() and hit[3] == _mtime(hit[2].workspace_path / "CLAUDE.md"):
        return hit[1], hit[2]
    agent = agent_get_for_run(role=role)
    mtime = _mtime(agent.workspace_path / "CLAUDE.md")
    spec = agent_spec(agent)
    if ttl > 0:
        with _SPECS_LOCK:
            _SPECS[role] = (time.monotonic() + ttl, agent, spec, mtime)
    return agent, spec


def agent_cache_clear(**_: object) -> None:
    with _SPECS_LOCK:
        _SPECS.clear()

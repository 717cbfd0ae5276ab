"""What an engine and a tool runner are told about an agent: a frozen spec, never the ORM row.

Built once, in the run's start burst (:func:`agent_spec`), so executing a run needs no database
read for its agent and cannot write to it. The attribute names match the model's, so code that
reads an agent reads a spec the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Agent


@dataclass(frozen=True)
class AgentSpec:
    id: int | None
    role: str
    engine: str
    model: str
    system_prompt: str  # the effective prompt: the admin's prompt followed by the workspace's CLAUDE.md
    workspace_path: Path
    allowed_tools: tuple[str, ...] = ()
    max_steps: int = 10
    display_name: str = ""

    @property
    def pk(self) -> int | None:
        return self.id

    def effective_system_prompt(self) -> str:
        return self.system_prompt


def agent_spec(agent: "Agent") -> AgentSpec:
    """Freeze an agent row (reads its workspace's CLAUDE.md: call it off the event loop)."""
    return AgentSpec(
        id=agent.pk, role=agent.role, engine=agent.engine, model=agent.model,
        system_prompt=agent.effective_system_prompt(), workspace_path=agent.workspace_path,
        allowed_tools=tuple(agent.allowed_tools or ()),
        max_steps=int(agent.max_steps or 10), display_name=agent.display_name,
    )

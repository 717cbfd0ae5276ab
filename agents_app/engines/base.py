"""The engine interface: given an agent, history and a tool runner, yield canonical events.

Engines register by subclassing :class:`Engine` with a ``name``. They never choose a provider
for themselves (the router does), never touch a transport, and report failures by raising
:class:`EngineError` (or letting a provider SDK error propagate; the run service wraps it with
the agent, engine, model and provider as context).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, ClassVar, Protocol

from core.errors import EngineError, ErrorCode  # noqa: F401  (engines raise these)
from core.events import RunEventBase
from orchestrator_site.registry import register_subclass

if TYPE_CHECKING:
    from agents_app.providers.registry import ProviderTarget
    from agents_app.specs import AgentSpec

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_ENGINES: dict[str, type["Engine"]] = {}


@dataclass
class EngineResult:
    """What an engine yields last: the final answer and what the run should record."""

    text: str
    usage: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    # Where it ran, set by the failover loop (may differ from the run's first choice).
    provider: str = ""
    model: str = ""


class ToolPort(Protocol):
    """What an engine may do with tools: list them, and call one (approvals, recording and the
    ``tool.state`` events happen behind the port; a tool's failure comes back as a result)."""

    def names(self) -> list[str]: ...

    def specs(self) -> list[dict[str, Any]]: ...

    def requires_approval(self, name: str) -> bool: ...

    async def call(self, *, tool_call_id: str, name: str, input: Any) -> Any: ...

    def for_agent(self, agent: "AgentSpec") -> "ToolPort":
        """The same port acting for another agent (its tools, approvals, workspace): delegation."""
        ...


@dataclass
class EngineContext:
    run_id: str
    conversation_id: str
    agent: "AgentSpec"
    model: str
    user_input: str
    # Earlier turns, oldest first: [{"role": "user"|"assistant", "content": str}].
    history: list[dict[str, str]]
    tools: "ToolPort"
    session_id: str = ""
    system_prompt: str = ""
    workspace: Path = Path(".")
    options: dict[str, Any] = field(default_factory=dict)
    # Loads another agent by role (for engines that delegate); None when unknown or disabled.
    load_agent: Callable[[str], Awaitable["AgentSpec | None"]] | None = None
    # The provider the router chose for this attempt (base URL, key, retries); None: the
    # engine's environment configuration (ANTHROPIC_*, OLLAMA_URL).
    provider: "ProviderTarget | None" = None
    # Tokens the provider has reported for this run, for a run that fails or is cancelled before
    # its EngineResult: an engine that can tell adds what it was billed when it stops early (the
    # Claude engine: input and cache tokens from message_start, output tokens as last reported).
    # Shared by every failover attempt; ``spent_on`` is the (provider, model) of the last one.
    spent: dict[str, int] = field(default_factory=dict)
    spent_on: tuple[str, str] | None = None


class Engine:
    name: ClassVar[str] = ""
    provider: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # When this engine is unavailable (e.g. no API key), the router uses this engine instead.
    fallback: ClassVar[str | None] = None
    register: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_subclass(_ENGINES, cls, kind="engine", pattern=_NAME_RE)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this engine cannot run here (missing key, missing package), or None."""
        return None

    @classmethod
    def default_model(cls) -> str:
        return ""

    @classmethod
    def health_details(cls) -> dict[str, Any]:
        """Extra facts for ``/health`` (e.g. a probe's latency); nothing by default."""
        return {}

    def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        raise NotImplementedError


def registered_engines() -> dict[str, type[Engine]]:
    return dict(_ENGINES)

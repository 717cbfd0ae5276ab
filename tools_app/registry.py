"""The tool registry: every tool an engine may offer a model registers here by name.

A tool is a subclass of :class:`Tool`. Subclassing registers it (``__init_subclass__``), so the
list of tools is the registry, never an ``if`` chain. Each tool declares:

- ``name``: validated identifier the model sees (``^[a-z][a-z0-9_]{0,63}$``);
- ``description`` and ``input_schema`` (JSON Schema for the model);
- ``requires_approval``: whether a person must approve a call by default, i.e. the tool's default
  effect (``ask`` or ``allow``) when no approval rule matches (see ``tools_app/policy.py``);
- ``async run(*, input, context)`` returning a :class:`ToolResult`.

Tools never raise for an expected failure (bad path, non-zero exit, HTTP error): they return
``ToolResult(output=..., is_error=True)`` so the model can read what went wrong. Raising
:class:`ToolError` does the same thing from deep inside a helper.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from orchestrator_site.registry import register_subclass

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_REGISTRY: dict[str, type["Tool"]] = {}


class ToolError(Exception):
    """An expected tool failure; its message is shown to the model as the tool's output."""


@dataclass(frozen=True)
class ToolResult:
    output: str
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: never the request, never secrets."""

    workspace: Path
    agent_role: str = ""
    run_id: str = ""
    tool_call_id: str = ""
    # Per-agent tool configuration, e.g. MCP bridge URLs: {"mcp_trader": {"url": ...}}.
    config: dict[str, Any] = field(default_factory=dict)


class Tool:
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    requires_approval: ClassVar[bool] = False
    # Registered tools are offered by name; abstract helpers set register = False.
    register: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_subclass(_REGISTRY, cls, kind="tool", pattern=_NAME_RE)

    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        raise NotImplementedError

    @classmethod
    def spec(cls) -> dict[str, Any]:
        """The Anthropic-style tool definition offered to a model."""
        return {"name": cls.name, "description": cls.description, "input_schema": cls.input_schema}


def get_tool(name: str) -> type[Tool] | None:
    _load_builtin_tools()
    return _REGISTRY.get(name)


def all_tools() -> dict[str, type[Tool]]:
    _load_builtin_tools()
    return dict(sorted(_REGISTRY.items()))


_loaded = False
_load_lock = threading.RLock()


def _load_builtin_tools() -> None:
    global _loaded
    if _loaded:
        return
    with _load_lock:  # concurrent first callers must not see a half-filled registry
        if not _loaded:
            from . import tools  # noqa: F401  (importing registers the built-in tools)

            _loaded = True

"""Agents: who runs (prompt, workspace, engine, model, tools)."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models


def validate_engine_name(value: str) -> None:
    from agents_app.engines import engine_names

    if value not in engine_names():
        raise ValidationError(f"Unknown engine {value!r}; choose one of: {', '.join(engine_names())}.")


def validate_tool_names(value) -> None:
    from tools_app.registry import all_tools

    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("Allowed tools must be a list of tool names.")
    unknown = sorted(set(value) - set(all_tools()))
    if unknown:
        raise ValidationError(f"Unknown tools: {', '.join(unknown)}.")


# Kept for migration 0001, which names it; approval overrides are now agent-scoped ToolRule rows.
def validate_approval_overrides(value) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in value.items()):
        raise ValidationError('Approval overrides must map tool names to true/false, e.g. {"bash": false}.')
    # MCP tools (mcp__<server>__<tool>) exist only while a run has their server connected.
    validate_tool_names([name for name in value if not name.startswith("mcp__")])


class Agent(models.Model):
    """An agent an admin can edit: its prompt, workspace, engine, model and tools.

    Its MCP servers are ``tools_app.McpServer`` rows linked by ``tools_app.AgentMcpServer``
    (``agent.mcp_server_links``), edited inline on the agent's admin page.

    Prompt precedence: the engine's system prompt is ``system_prompt`` followed by the
    workspace's ``CLAUDE.md`` (when the file exists) under a heading, so admins set the role in
    the admin and the workspace file adds project instructions. See :meth:`effective_system_prompt`.
    """

    role = models.SlugField(
        max_length=64,
        unique=True,
        validators=[RegexValidator(r"^[a-z][a-z0-9_]*$", "Use lower-case letters, digits and underscores.")],
        help_text="Stable identifier clients use (agent_role / agentRole).",
    )
    display_name = models.CharField(max_length=120)
    name_zh = models.CharField("Chinese name", max_length=120, blank=True)
    description = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    workspace = models.CharField(
        max_length=500,
        blank=True,
        help_text="Directory the agent's tools are confined to. Blank: WORKSPACES_ROOT/<role>.",
    )
    engine = models.CharField(max_length=40, default="mock", validators=[validate_engine_name])
    model = models.CharField(max_length=200, blank=True, help_text="Blank: the engine's configured default.")
    allowed_tools = models.JSONField(default=list, blank=True, validators=[validate_tool_names])
    max_steps = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1), MaxValueValidator(100)])
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["role"]

    def __str__(self) -> str:
        return f"{self.display_name} ({self.role})"

    @property
    def workspace_path(self) -> Path:
        base = Path(self.workspace) if self.workspace else Path(settings.WORKSPACES_ROOT) / self.role
        return base if base.is_absolute() else Path(settings.WORKSPACES_ROOT) / base

    def claude_md(self) -> str:
        path = self.workspace_path / "CLAUDE.md"
        try:
            return path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            return ""

    def effective_system_prompt(self) -> str:
        parts = [self.system_prompt.strip()]
        claude_md = self.claude_md().strip()
        if claude_md:
            parts.append("# Workspace instructions (CLAUDE.md)\n\n" + claude_md)
        return "\n\n".join(p for p in parts if p)

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


# --- providers: where a model runs (see agents_app/providers/) ----------------------------------

class Provider(models.Model):
    """A model API the router may send runs to. Rows come from ``PROVIDERS_FILE`` (``load_providers``)
    or the admin. The key is never stored: ``api_key_env`` names the environment variable holding
    it, and a provider whose variable is unset is unavailable."""

    class Kind(models.TextChoices):
        ANTHROPIC = "anthropic", "Anthropic-compatible Messages API"
        OLLAMA = "ollama", "Ollama"
        MOCK = "mock", "Offline mock"

    class Auth(models.TextChoices):
        X_API_KEY = "x-api-key", "x-api-key header"
        BEARER = "bearer", "Authorization: Bearer"

    class Source(models.TextChoices):
        FILE = "file", "providers file"
        ADMIN = "admin", "admin"

    name = models.SlugField(max_length=64, unique=True,
                            validators=[RegexValidator(r"^[a-z][a-z0-9_-]*$", "Use lower-case letters, digits, - and _.")])
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ANTHROPIC)
    base_url = models.CharField(max_length=500, blank=True,
                                help_text="Blank: ANTHROPIC_BASE_URL / OLLAMA_URL. ${VAR:-default} is expanded.")
    api_key_env = models.CharField(max_length=120, blank=True,
                                   validators=[RegexValidator(r"^[A-Za-z_][A-Za-z0-9_]*$", "An environment variable name.")],
                                   help_text="Name of the environment variable holding the key (never the key).")
    auth = models.CharField(max_length=16, choices=Auth.choices, default=Auth.X_API_KEY)
    priority = models.IntegerField(default=100, help_text="Lower first among equally good candidates.")
    enabled = models.BooleanField(default=True)
    health_check = models.BooleanField(default=True, help_text="Probe the models list (Ollama: /api/tags).")
    any_model = models.BooleanField(default=False, help_text="Also accept model names not listed below (e.g. a "
                                                             "gateway's own names, the agent's or ANTHROPIC_MODEL).")
    spend_limit = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True,
                                      help_text="USD per spend period; over it the provider is skipped.")
    spend_period = models.CharField(max_length=8, default="month", choices=[("day", "day"), ("week", "week"), ("month", "month")])
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.ADMIN, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "name"]

    def __str__(self) -> str:
        return self.name


class ProviderModel(models.Model):
    class Tier(models.TextChoices):
        FAST = "fast"
        BALANCED = "balanced"
        TOP = "top"

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=10, choices=Tier.choices, default=Tier.BALANCED)
    context_window = models.PositiveIntegerField(default=128_000)
    tags = models.JSONField(default=list, blank=True, help_text='e.g. ["code", "long_context", "cheap"]')
    # USD per million tokens; blank: genai-prices' price for this provider/model (if it knows it).
    input_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    output_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    cache_read_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    cache_write_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["provider", "name"]
        constraints = [models.UniqueConstraint(fields=["provider", "name"], name="unique_provider_model")]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.name}"


class RoutingRule(models.Model):
    """One routing rule: when a task matches (keywords and/or an estimated token count), prefer
    models of ``tier`` and/or with ``tag``. Evaluated by ``order``; the first that matches and
    finds a model wins."""

    name = models.SlugField(max_length=64, unique=True)
    order = models.IntegerField(default=100)
    description = models.CharField(max_length=300, blank=True)
    keywords = models.JSONField(default=list, blank=True, help_text="Whole words or phrases, case-insensitive.")
    min_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="Estimated context at least this.")
    tier = models.CharField(max_length=10, choices=ProviderModel.Tier.choices, blank=True)
    tag = models.CharField(max_length=40, blank=True)
    enabled = models.BooleanField(default=True)
    source = models.CharField(max_length=8, choices=Provider.Source.choices, default=Provider.Source.ADMIN, editable=False)

    class Meta:
        ordering = ["order", "name"]

    def __str__(self) -> str:
        return self.name


class Budget(models.Model):
    """A token and/or cost budget per user (``user`` blank: every user, each on their own) over a
    period. At ``soft_ratio`` of a limit routing takes the cheapest capable model; at the limit
    runs are refused with 429 ``budget_exceeded``."""

    name = models.SlugField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             help_text="Blank: applies to every user separately.")
    period = models.CharField(max_length=8, default="day", choices=[("day", "day"), ("week", "week"), ("month", "month")])
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True, help_text="Input + output tokens.")
    max_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True, help_text="USD.")
    soft_ratio = models.DecimalField(max_digits=4, decimal_places=3, default=0.8,
                                     validators=[MinValueValidator(0), MaxValueValidator(1)],
                                     help_text="From this share of a limit on, the cheapest capable model is used.")
    enabled = models.BooleanField(default=True)
    source = models.CharField(max_length=8, choices=Provider.Source.choices, default=Provider.Source.ADMIN, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

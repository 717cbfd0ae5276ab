from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.utils.html import format_html

from .models import Agent


class AgentAdminForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = "__all__"
        widgets = {
            # A large monospace editor: prompts are long, structured text (headings, lists, code).
            "system_prompt": forms.Textarea(attrs={"rows": 30, "class": "prompt-editor", "spellcheck": "false"}),
            "description": forms.Textarea(attrs={"rows": 2}),
        }


def _copy_role(role: str) -> str:
    base = f"{role}_copy"[:60]
    candidate, n = base, 2
    while Agent.objects.filter(role=candidate).exists():
        candidate, n = f"{base}{n}", n + 1
    return candidate


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentAdminForm
    list_display = ["role", "display_name", "name_zh", "engine", "model", "enabled", "updated_at"]
    list_display_links = ["role", "display_name"]
    list_filter = ["engine", "enabled", "model"]
    search_fields = ["role", "display_name", "name_zh", "description", "system_prompt"]
    actions = ["duplicate_selected"]
    readonly_fields = ["workspace_resolved", "claude_md_preview", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["role", "display_name", "name_zh", "description", "enabled"]}),
        ("Prompt", {
            # One row: the prompt editor with the workspace's CLAUDE.md beside it.
            "fields": [("system_prompt", "claude_md_preview")],
            "classes": ["prompt-row"],
            "description": "The model's system prompt is this prompt followed by the workspace's CLAUDE.md "
                           "(when it exists), so the admin prompt sets the role and CLAUDE.md adds project "
                           "instructions. Edit CLAUDE.md in the workspace itself.",
        }),
        ("Engine", {"fields": ["engine", "model", "max_steps"]}),
        ("Tools", {
            "fields": ["allowed_tools"],
            "description": "MCP servers are registered under Tools › MCP servers and attached below; "
                           "approval rules for this agent are below too.",
        }),
        ("Workspace", {"fields": ["workspace", "workspace_resolved"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]

    class Media:
        css = {"all": ["agents_app/admin.css"]}

    @admin.action(description="Duplicate the selected agents (copies start disabled)", permissions=["add"])
    def duplicate_selected(self, request, queryset) -> None:
        """Copy each agent's own fields under a free ``<role>_copy`` role. Its approval rules and MCP
        links stay with the original (add them on the copy's page): a copy must not widen access."""
        made = []
        with transaction.atomic():
            for agent in queryset:
                agent.pk, agent.id = None, None
                agent.role = _copy_role(agent.role)
                agent.display_name = f"{agent.display_name} (copy)"[:120]
                agent.enabled = False
                agent.save()
                made.append(agent.role)
        self.message_user(request, f"Created {', '.join(made)} (disabled until you enable them).", messages.SUCCESS)

    @admin.display(description="Workspace directory")
    def workspace_resolved(self, obj: Agent) -> str:
        return str(obj.workspace_path) if obj.pk else "-"

    @admin.display(description="Workspace CLAUDE.md (appended after the prompt)")
    def claude_md_preview(self, obj: Agent) -> str:
        text = obj.claude_md() if obj.pk else ""
        if not text:
            return format_html("<em>No CLAUDE.md in {}</em>", obj.workspace_path if obj.pk else "the workspace")
        return format_html('<pre class="claude-md">{}</pre>', text)


# --- providers, routing rules, budgets (agents_app/providers) -----------------------------------

from .models import Budget, Provider, ProviderModel, RoutingRule  # noqa: E402


class ProviderModelInline(admin.TabularInline):
    model = ProviderModel
    extra = 0
    fields = ["name", "tier", "context_window", "tags", "input_price", "output_price", "cache_read_price",
              "cache_write_price", "enabled"]


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "base_url", "api_key_env", "key_set", "health", "priority", "enabled", "source"]
    list_filter = ["kind", "enabled", "source"]
    search_fields = ["name", "base_url"]
    readonly_fields = ["source", "key_set", "health", "created_at", "updated_at"]
    inlines = [ProviderModelInline]
    fieldsets = [
        (None, {"fields": ["name", "kind", "enabled", "priority", "source"]}),
        ("Connection", {
            "fields": ["base_url", "api_key_env", "auth", "key_set", "health_check", "health"],
            "description": "The key is never stored here: name the environment variable that holds it. "
                           "A provider whose variable is unset is unavailable. Rows from the providers file "
                           "are rewritten by load_providers.",
        }),
        ("Spend limit", {"fields": ["spend_limit", "spend_period"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]

    @admin.display(description="Key set", boolean=True)
    def key_set(self, obj: Provider) -> bool | None:
        import os

        if obj.kind != Provider.Kind.ANTHROPIC:
            return None
        return bool(obj.api_key_env and os.environ.get(obj.api_key_env))

    @admin.display(description="Health")
    def health(self, obj: Provider) -> str:
        from .providers import health
        from .providers.registry import provider_registry

        info = provider_registry().get(obj.name) if obj.pk and obj.enabled else None
        if info is None:
            return "disabled" if obj.pk else "-"
        status = health.provider_status(info, check=False)
        extra = status.get("cooldownUntil") or status.get("reason") or ""
        return f"{status['status']}{f' ({extra})' if extra else ''}"

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        from .providers.health import reset_health

        reset_health()  # a changed URL or key variable deserves a fresh look


@admin.register(RoutingRule)
class RoutingRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "order", "keywords", "min_tokens", "tier", "tag", "enabled", "source"]
    list_editable = ["order", "enabled"]
    readonly_fields = ["source"]


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "period", "max_tokens", "max_cost", "soft_ratio", "enabled", "source"]
    list_filter = ["period", "enabled"]
    readonly_fields = ["source"]

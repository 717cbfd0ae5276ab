from django import forms
from django.contrib import admin
from django.utils.html import format_html

from .models import Agent


class AgentAdminForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = "__all__"


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentAdminForm
    list_display = ["role", "display_name", "name_zh", "engine", "model", "enabled", "updated_at"]
    list_filter = ["engine", "enabled"]
    search_fields = ["role", "display_name", "name_zh", "description"]
    readonly_fields = ["workspace_resolved", "claude_md_preview", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["role", "display_name", "name_zh", "description", "enabled"]}),
        ("Prompt", {
            "fields": ["system_prompt", "claude_md_preview"],
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

    @admin.display(description="Workspace directory")
    def workspace_resolved(self, obj: Agent) -> str:
        return str(obj.workspace_path) if obj.pk else "-"

    @admin.display(description="Workspace CLAUDE.md (appended after the prompt)")
    def claude_md_preview(self, obj: Agent) -> str:
        text = obj.claude_md() if obj.pk else ""
        if not text:
            return format_html("<em>No CLAUDE.md in {}</em>", obj.workspace_path if obj.pk else "the workspace")
        return format_html('<pre style="white-space:pre-wrap;max-height:30em;overflow:auto">{}</pre>', text)

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html

from agents_app.admin import AgentAdmin
from agents_app.models import Agent

from core.errors import ApplicationError

from .models import AgentMcpServer, McpServer, ToolConfirmation, ToolRule
from .services import tool_confirmation_admin_decide


@admin.register(ToolConfirmation)
class ToolConfirmationAdmin(admin.ModelAdmin):
    """Pending calls can be approved or denied here (one or many): the waiting runs resume."""

    list_display = ["tool", "status", "input_preview", "owner", "run", "created_at", "decided_by", "decided_at"]
    list_filter = ["status", "tool", "created_at"]
    search_fields = ["tool", "tool_call_id", "run__conversation__owner__username", "run__conversation__title"]
    list_select_related = ["run__conversation__owner", "decided_by"]
    readonly_fields = ["run", "tool_call_id", "tool", "input", "status", "reason", "created_at", "expires_at",
                       "decided_at", "decided_by", "output"]
    actions = ["approve_selected", "deny_selected"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request) -> bool:
        return False  # confirmations are made by runs, never by hand

    @admin.display(description="input")
    def input_preview(self, obj: ToolConfirmation) -> str:
        text = str(obj.input)
        return format_html("<code>{}</code>", text if len(text) <= 120 else text[:120] + "…")

    @admin.display(description="owner", ordering="run__conversation__owner__username")
    def owner(self, obj: ToolConfirmation):
        return obj.run.conversation.owner

    @admin.action(description="Approve the selected pending calls (their runs resume)", permissions=["change"])
    def approve_selected(self, request, queryset) -> None:
        self._decide(request, queryset, approved=True)

    @admin.action(description="Deny the selected pending calls", permissions=["change"])
    def deny_selected(self, request, queryset) -> None:
        self._decide(request, queryset, approved=False)

    def _decide(self, request, queryset, *, approved: bool) -> None:
        done, skipped = 0, []
        for confirmation_id in queryset.values_list("id", flat=True):
            try:
                tool_confirmation_admin_decide(admin=request.user, confirmation_id=str(confirmation_id),
                                               approved=approved, reason="decided in the admin")
                done += 1
            except ApplicationError as exc:
                skipped.append(exc.message)
        verb = "Approved" if approved else "Denied"
        if done:
            self.message_user(request, f"{verb} {done} tool call(s).", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Skipped {len(skipped)}: {'; '.join(sorted(set(skipped)))}", messages.WARNING)


class AgentsOfServerInline(admin.TabularInline):
    model = AgentMcpServer
    extra = 1
    autocomplete_fields = ["agent"]
    verbose_name = "agent that may use this server"
    verbose_name_plural = "Agents that may use this server (always: every run; otherwise when a request names it)"


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    list_display = ["name", "transport", "enabled", "trusted", "requires_approval", "updated_at"]
    list_filter = ["transport", "enabled", "trusted"]
    search_fields = ["name", "description", "url"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [AgentsOfServerInline]
    fieldsets = [
        (None, {"fields": ["name", "transport", "enabled", "description"]}),
        ("stdio", {"fields": ["command", "env", "cwd"],
                   "description": "The process runs as this service's user, in cwd, with env over a minimal environment."}),
        ("Streamable HTTP", {"fields": ["url", "headers", "trusted"]}),
        ("Calls", {"fields": ["timeout", "requires_approval"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]


class ServersOfAgentInline(admin.TabularInline):
    model = AgentMcpServer
    extra = 1
    autocomplete_fields = ["server"]
    verbose_name = "MCP server"
    verbose_name_plural = "MCP servers (always: every run; otherwise when a request names it)"


class ToolRuleAdminForm(forms.ModelForm):
    class Meta:
        model = ToolRule
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if data.get("scope") == ToolRule.Scope.CONVERSATION and not data.get("owner"):
            # The owner is who may list and delete it through the API; tools_app cannot look it up.
            self.add_error("owner", "A conversation rule's owner is the conversation's owner: set it.")
        return data


@admin.register(ToolRule)
class ToolRuleAdmin(admin.ModelAdmin):
    form = ToolRuleAdminForm
    list_display = ["__str__", "effect", "tool", "argument", "scope", "agent", "conversation_id", "owner", "created_at"]
    list_filter = ["effect", "scope"]
    search_fields = ["tool", "argument", "name"]
    raw_id_fields = ["owner"]
    readonly_fields = ["created_at"]
    fields = ["name", "effect", "tool", "argument", "scope", "agent", "conversation_id", "owner", "created_at"]

    def save_model(self, request, obj: ToolRule, form, change: bool) -> None:
        if obj.owner_id is None and obj.scope != ToolRule.Scope.CONVERSATION:
            obj.owner = request.user
        super().save_model(request, obj, form, change)


class _AgentToolRuleForm(forms.ModelForm):
    # Set per request by the inline: who adds a rule owns it.
    creator = None

    class Meta:
        model = ToolRule
        fields = ["effect", "tool", "argument", "name"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Rows of this inline are agent rules (the inline sets the agent); validated as such.
        self.instance.scope = ToolRule.Scope.AGENT
        if self.instance.pk is None and self.creator is not None:
            self.instance.owner = self.creator


class AgentToolRuleInline(admin.TabularInline):
    """The agent's own approval rules, on its admin page (registered by ``agents_app.admin``)."""

    model = ToolRule
    fk_name = "agent"
    form = _AgentToolRuleForm
    extra = 0
    verbose_name = "approval rule"
    verbose_name_plural = "Approval rules for this agent (global rules apply too; deny, then ask, then allow)"

    def has_add_permission(self, request, obj=None) -> bool:
        # A rule names its agent: add rules once the agent is saved.
        return obj is not None and super().has_add_permission(request, obj)

    def get_formset(self, request, obj=None, **kwargs):
        kwargs["form"] = type("AgentToolRuleForm", (_AgentToolRuleForm,), {"creator": request.user})
        return super().get_formset(request, obj, **kwargs)


# The Agent admin lives in agents_app, which does not import tools_app (dependencies point
# agents ← tools); so tools_app adds its inline by registering an extended Agent admin.
admin.site.unregister(Agent)


@admin.register(Agent)
class AgentWithMcpServersAdmin(AgentAdmin):
    inlines = [*AgentAdmin.inlines, ServersOfAgentInline, AgentToolRuleInline]

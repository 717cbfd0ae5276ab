from django.contrib import admin

from agents_app.admin import AgentAdmin
from agents_app.models import Agent

from .models import AgentMcpServer, McpServer, ToolConfirmation


@admin.register(ToolConfirmation)
class ToolConfirmationAdmin(admin.ModelAdmin):
    list_display = ["id", "tool", "status", "run", "created_at", "decided_by", "decided_at"]
    list_filter = ["status", "tool"]
    readonly_fields = ["run", "tool_call_id", "tool", "input", "created_at", "decided_at", "decided_by", "output"]


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


# The Agent admin lives in agents_app, which does not import tools_app (dependencies point
# agents ← tools); so tools_app adds its inline by registering an extended Agent admin.
admin.site.unregister(Agent)


@admin.register(Agent)
class AgentWithMcpServersAdmin(AgentAdmin):
    inlines = [*AgentAdmin.inlines, ServersOfAgentInline]

from django.contrib import admin

from .models import ToolConfirmation


@admin.register(ToolConfirmation)
class ToolConfirmationAdmin(admin.ModelAdmin):
    list_display = ["id", "tool", "status", "run", "created_at", "decided_by", "decided_at"]
    list_filter = ["status", "tool"]
    readonly_fields = ["run", "tool_call_id", "tool", "input", "created_at", "decided_at", "decided_by", "output"]

from django.contrib import admin

from .models import Conversation, Message, Run, RunEvent


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ["created_at", "role", "content", "run"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "owner", "agent", "updated_at"]
    list_filter = ["agent"]
    search_fields = ["title", "id"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["content"]
    readonly_fields = ["created_at"]


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    fields = ["seq", "event", "at", "payload"]
    readonly_fields = fields
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "agent", "engine", "model", "status", "started_at", "ended_at"]
    list_filter = ["status", "engine"]
    readonly_fields = ["started_at", "ended_at", "usage", "cost", "route_note", "error"]
    inlines = [RunEventInline]


# --- usage and cost per provider/model (chat_app/usage.py; the same sums as GET /v1/usage) -------

from .models import RunUsage  # noqa: E402


@admin.register(RunUsage)
class RunUsageAdmin(admin.ModelAdmin):
    """Runs with their tokens and cost; the list's filters also total them per provider and model."""

    list_display = ["started_at", "provider", "model", "agent", "status", "input_tokens", "output_tokens",
                    "cache_read_tokens", "cache_write_tokens", "cost"]
    list_filter = ["provider", "model", "status", "agent"]
    date_hierarchy = "started_at"
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        from django.contrib import messages
        from django.db.models import Sum

        response = super().changelist_view(request, extra_context)
        try:
            rows = response.context_data["cl"].queryset
        except (AttributeError, KeyError):
            return response
        for r in rows.values("provider", "model").annotate(
                i=Sum("input_tokens"), o=Sum("output_tokens"), c=Sum("cost")).order_by("provider", "model"):
            messages.info(request, f"{r['provider'] or '-'} / {r['model'] or '-'}: {r['i'] or 0} input + "
                                   f"{r['o'] or 0} output tokens, {r['c'] or 0} USD")
        return response

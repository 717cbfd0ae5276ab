"""Admin for conversations (messages inline), runs (their event timeline inline) and events.

Everything a run recorded is read only here: the timeline is evidence, not configuration.
"""
import json

from django.contrib import admin
from django.utils.html import format_html

from .models import Conversation, Message, Run, RunEvent


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class MessageInline(_ReadOnlyInline):
    model = Message
    fields = ["created_at", "role", "content", "run", "superseded"]
    readonly_fields = fields
    show_change_link = True

    @admin.display(boolean=True, description="superseded")
    def superseded(self, obj: Message) -> bool:
        return bool((obj.metadata or {}).get("superseded"))


class RunInline(_ReadOnlyInline):
    model = Run
    fields = ["started_at", "status", "engine", "provider", "model", "cost", "ended_at"]
    readonly_fields = fields
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["title", "owner", "agent", "updated_at", "created_at"]
    list_filter = ["agent", "updated_at"]
    search_fields = ["title", "id", "owner__username", "messages__content"]
    list_select_related = ["owner", "agent"]
    readonly_fields = ["id", "owner", "engine_session_id", "created_at", "updated_at"]
    fields = ["id", "title", "owner", "agent", "engine_session_id", "created_at", "updated_at"]
    inlines = [MessageInline, RunInline]

    def get_search_results(self, request, queryset, search_term):
        queryset, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        return queryset.distinct(), False  # the messages join repeats conversations


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["content"]
    readonly_fields = ["created_at"]


class RunEventInline(_ReadOnlyInline):
    model = RunEvent
    fields = ["seq", "event", "at", "payload_pretty"]
    readonly_fields = fields
    ordering = ["seq"]

    @admin.display(description="payload")
    def payload_pretty(self, obj: RunEvent) -> str:
        return format_html('<pre style="white-space:pre-wrap;margin:0;max-width:70em">{}</pre>',
                           json.dumps(obj.payload, ensure_ascii=False, indent=1))


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "agent", "engine", "provider", "model", "status", "cost", "started_at", "ended_at"]
    list_filter = ["status", "engine", "provider", "started_at"]
    search_fields = ["id", "conversation__title", "conversation__owner__username", "model"]
    list_select_related = ["conversation", "agent"]
    date_hierarchy = "started_at"
    readonly_fields = ["conversation", "agent", "engine", "provider", "model", "status", "started_at", "ended_at",
                       "usage", "cost", "route_note", "error", "cancel_requested", "lease_expires_at"]
    inlines = [RunEventInline]

    def has_add_permission(self, request) -> bool:
        return False


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

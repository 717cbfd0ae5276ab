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

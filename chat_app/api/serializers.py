"""Serializers for the chat REST API (seed 001 camelCase field names)."""
from __future__ import annotations

from rest_framework import serializers

from chat_app.models import Conversation, Message, Run, RunEvent


class StrictCharField(serializers.CharField):
    """A string and nothing else: numbers, booleans, lists and objects are 400, not coerced to text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ConversationCreateInput(serializers.Serializer):
    title = StrictCharField(required=False, allow_blank=True, max_length=300, default="")
    agentRole = serializers.SlugField(required=False, max_length=64)


class ConversationUpdateInput(serializers.Serializer):
    title = StrictCharField(allow_blank=True, max_length=300)


class ConversationOutput(serializers.ModelSerializer):
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    agentRole = serializers.SerializerMethodField()
    sessionId = serializers.CharField(source="engine_session_id")

    class Meta:
        model = Conversation
        fields = ["id", "title", "agentRole", "sessionId", "createdAt", "updatedAt"]

    def get_agentRole(self, obj: Conversation) -> str | None:
        return obj.agent.role if obj.agent_id else None


class MessageOutput(serializers.ModelSerializer):
    conversationId = serializers.UUIDField(source="conversation_id")
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = Message
        fields = ["id", "conversationId", "runId", "role", "content", "metadata", "createdAt"]


class RunEventOutput(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "event", "at", "payload"]


class RunTimelineOutput(serializers.Serializer):
    runId = serializers.UUIDField(source="id")
    conversationId = serializers.UUIDField(source="conversation_id")
    status = serializers.CharField()
    engine = serializers.CharField()
    model = serializers.CharField()
    provider = serializers.CharField()
    routeNote = serializers.CharField(source="route_note")
    # A decimal string in USD ("0.004200"), never a float: sums of costs must not drift.
    cost = serializers.DecimalField(max_digits=12, decimal_places=6, coerce_to_string=True)
    startedAt = serializers.DateTimeField(source="started_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    error = serializers.CharField(allow_blank=True)
    usage = serializers.JSONField()
    # Tokens and the price (USD per million) the run's cost was computed with (chat_app/usage.py).
    tokens = serializers.SerializerMethodField()
    pricing = serializers.JSONField()
    events = serializers.SerializerMethodField()

    def get_tokens(self, obj: Run) -> dict:
        return {"input": obj.input_tokens, "output": obj.output_tokens, "cacheRead": obj.cache_read_tokens,
                "cacheWrite": obj.cache_write_tokens}

    def get_events(self, obj: Run) -> list[dict]:
        return RunEventOutput(self.context["events"], many=True).data

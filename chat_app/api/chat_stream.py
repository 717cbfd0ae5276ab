"""Seed 000: ``POST /api/v1/chat/stream`` (server-sent events) and the input it shares with ``/ws/chat``.

The frames are the ``chat-stream`` dialect (``chat_app/transports/chat_stream.py``).
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import JSONParser
from rest_framework.request import Request

from chat_app import services
from chat_app.api.streaming import AsyncApiView
from chat_app.transports.chat_stream import ChatStreamDialect


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers, booleans and objects instead of turning them into text."""

    default_error_messages = {"not_a_string": "Must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class HistoryItemInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=["user", "assistant"])
    content = StrictCharField(allow_blank=True, trim_whitespace=False)


class ChatStreamInput(serializers.Serializer):
    agent_role = StrictCharField(max_length=64)
    message = StrictCharField(trim_whitespace=False, max_length=services.MAX_INPUT_CHARS)
    conversation_history = HistoryItemInput(many=True, required=False, default=list)

    def validate_message(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Must not be blank.")
        return value


def chat_input_validate(data: Any) -> dict[str, Any]:
    """Validated ``{agent_role, message, conversation_history}``; raises DRF ValidationError (400)."""
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    serializer = ChatStreamInput(data=data)
    serializer.is_valid(raise_exception=True)
    values = dict(serializer.validated_data)
    values["conversation_history"] = [dict(item) for item in values.get("conversation_history") or []]
    return values


class ChatStreamApi(AsyncApiView):
    """Validates, starts the run, streams its seed-000 events; the run goes on if the client leaves."""

    parser_classes = [JSONParser]

    @extend_schema(
        request=ChatStreamInput,
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description='Events `data: {"type": ...}`: content_delta, tool_use, tool_result, then done (or error).',
            ),
            400: OpenApiResponse(description="Malformed body or history"),
            404: OpenApiResponse(description="Unknown agent_role (lists valid_roles)"),
        },
        examples=[OpenApiExample("chat", value={
            "agent_role": "dev_efficiency_analyst", "message": "Summarise metrics.csv",
            "conversation_history": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}],
        }, request_only=True)],
        summary="Stream a chat turn with an agent as server-sent events (seed 000)",
    )
    async def post(self, request):
        created = await self.burst(self._create, request)
        return await self.start_stream(created, ChatStreamDialect)

    @staticmethod
    def _create(request: Request) -> services.RunCreated:
        data = chat_input_validate(request.data)
        return services.run_create(user=request.user, input=data["message"], agent_role=data["agent_role"],
                                   history=data["conversation_history"], defer_commit=True)

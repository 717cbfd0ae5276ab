"""Seed 003: ``POST /conversations/<id>/messages/stream`` (also under ``/v1/``).

Body ``{"content": str, "mcpServers": [...]?}`` → ``text/event-stream`` of named events (see
``chat_app/transports/message_stream.py`` for the frames). ``mcpServers`` names registered MCP servers the
conversation's agent may use (``tools_app/mcp_policy.py`` decides). Errors before the stream
starts are JSON with a status: 400 bad body, 401 no credentials, 403 ``mcp_server_not_allowed``,
404 unknown or another user's conversation.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from chat_app import services
from chat_app.api.streaming import AsyncApiView
from chat_app.transports.message_stream import MessageStreamDialect


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into text."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class MessageStreamInput(serializers.Serializer):
    content = StrictCharField(max_length=services.MAX_INPUT_CHARS, trim_whitespace=False)
    mcpServers = serializers.JSONField(required=False, help_text='Registered MCP servers for this message, by name: '
                                       '["name", ...] or [{"name": "..."}] (see tools_app/mcp_policy.py).')

    def validate_content(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("content must not be blank.")
        return value

    def validate_mcpServers(self, value: Any) -> list[Any]:
        # Only the outer shape: which servers (and whether an entry may be more than a name) is
        # the run service's decision, which refuses with 403 before anything starts.
        if not isinstance(value, list) or not all(isinstance(entry, (str, dict)) for entry in value):
            raise serializers.ValidationError('Must be a list of MCP server names: ["name", ...] or [{"name": "..."}].')
        return value


class ConversationMessageStreamApi(AsyncApiView):
    """Send a message and stream the reply; closing the stream cancels the run.

    Disconnect semantics: if the client closes this stream before ``done``/``error``, the run is
    cancelled (``run_cancel``), no partial assistant message is saved, and the user message stays
    so the turn can be retried. ``POST /v1/agent/chat`` is different on purpose: its run belongs
    to the server and finishes (and is saved) after a disconnect; a client reattaches with
    ``GET /v1/agent/runs/<id>/events`` + ``Last-Event-ID`` or reads the timeline.
    """

    @extend_schema(
        request=MessageStreamInput,
        responses={(200, "text/event-stream"): OpenApiResponse(description=(
            "Named events: init {sessionId, conversationId, runId}, assistant {text}, tool_use {id, name, "
            "input, status}, done {messageId, sessionId, text, usage}, error {code, message}."))},
        summary="Send a message and stream the reply as SSE (seed 003); disconnecting cancels the run",
    )
    async def post(self, request, conversation_id: str):
        user, created = await self.burst(lambda drf_request: self._create(drf_request, conversation_id), request)
        return await self.start_stream(created, MessageStreamDialect, user=user)

    @staticmethod
    def _create(request: Request, conversation_id: str) -> tuple[Any, services.RunCreated]:
        data = request.data if isinstance(request.data, dict) else {}
        serializer = MessageStreamInput(data=data)
        serializer.is_valid(raise_exception=True)
        options: dict[str, Any] = {}
        if serializer.validated_data.get("mcpServers"):
            options["mcp_servers"] = serializer.validated_data["mcpServers"]
        return request.user, services.run_create(user=request.user, input=serializer.validated_data["content"],
                                                 conversation_id=conversation_id, options=options, defer_commit=True)

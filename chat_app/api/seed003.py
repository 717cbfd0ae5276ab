"""Seed 003: ``POST /conversations/<id>/messages/stream`` (also under ``/v1/``).

Body ``{"content": str, "mcpServers": [...]?}`` → ``text/event-stream`` of named events (see
``chat_app/sse/seed003.py`` for the frames). ``mcpServers`` names registered MCP servers the
conversation's agent may use (``tools_app/mcp_policy.py`` decides). Errors before the stream
starts are JSON with a status: 400 bad body, 401 no credentials, 403 ``mcp_server_not_allowed``,
404 unknown or another user's conversation.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from chat_app import services
from chat_app.sse.base import EventStreamRenderer, event_stream_response, launch_run, with_pings
from chat_app.sse.seed003 import PING_FRAME, Seed003Dialect
from orchestrator_site.errors import ApplicationError

logger = logging.getLogger("orchestrator.sse")

# Cancellations started by a disconnect keep a reference here until they finish.
_CANCELLING: set[asyncio.Task] = set()


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


class ConversationMessageStreamApi(APIView):
    """Send a message and stream the reply; closing the stream cancels the run.

    Disconnect semantics: if the client closes this stream before ``done``/``error``, the run is
    cancelled (``run_cancel``), no partial assistant message is saved, and the user message stays
    so the turn can be retried. ``POST /v1/agent/chat`` is different on purpose: its run belongs
    to the server and finishes (and is saved) after a disconnect; a client reattaches with
    ``GET /v1/agent/runs/<id>/events`` + ``Last-Event-ID`` or reads the timeline.
    """

    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        request=MessageStreamInput,
        responses={(200, "text/event-stream"): OpenApiResponse(description=(
            "Named events: init {sessionId, conversationId, runId}, assistant {text}, tool_use {id, name, "
            "input, status}, done {messageId, sessionId, text, usage}, error {code, message}."))},
        summary="Send a message and stream the reply as SSE (seed 003); disconnecting cancels the run",
    )
    def post(self, request: Request, conversation_id: str):
        data = request.data if isinstance(request.data, dict) else {}
        serializer = MessageStreamInput(data=data)
        serializer.is_valid(raise_exception=True)
        options: dict[str, Any] = {}
        if serializer.validated_data.get("mcpServers"):
            options["mcp_servers"] = serializer.validated_data["mcpServers"]
        created = services.run_create(user=request.user, input=serializer.validated_data["content"],
                                      conversation_id=conversation_id, options=options)
        launch_run(created)
        return event_stream_response(stream_cancelling_on_disconnect(user=request.user, run_id=str(created.run.id)))


async def stream_cancelling_on_disconnect(*, user: Any, run_id: str) -> AsyncIterator[str]:
    """The run's seed-003 frames; if the reader goes away first, the run is cancelled."""
    dialect = Seed003Dialect()
    try:
        async for item in with_pings(services.run_subscribe(run_id=run_id), float(settings.SSE_PING_INTERVAL)):
            if item is None:
                yield PING_FRAME
                continue
            frame = dialect.render(item)
            if frame:
                yield frame
            if item.event == "agent.end":
                return
    finally:
        # Under ASGI a disconnect arrives here as CancelledError (Django cancels the response
        # task) or GeneratorExit (the iterator is closed); either way the run must stop.
        if not dialect.finished:
            await _cancel_detached(user=user, run_id=run_id)


async def _cancel_detached(*, user: Any, run_id: str) -> None:
    """Cancel the run in its own task, so this (possibly cancelled) coroutine cannot cut it short."""
    task = asyncio.ensure_future(_cancel(user=user, run_id=run_id))
    _CANCELLING.add(task)
    task.add_done_callback(_CANCELLING.discard)
    try:
        await asyncio.shield(task)
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the stream is closing anyway
        pass


async def _cancel(*, user: Any, run_id: str) -> None:
    try:
        await services.run_cancel(user=user, run_id=run_id)
        logger.info("seed-003 stream for run %s closed early: run cancelled", run_id)
    except ApplicationError:
        pass  # already finished (Conflict) or gone: nothing to cancel

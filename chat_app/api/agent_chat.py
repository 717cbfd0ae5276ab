"""The agent-chat SSE endpoints (seed 001, CHAT-030 … CHAT-070).

- ``POST /v1/agent/chat[?format=agent-chat|vercel-ai]``: start a run and stream it;
- ``GET /v1/agent/runs/:runId/events[?format=…][&after=<seq>]`` (or ``Last-Event-ID: <seq>``):
  (re)attach to a run: the events after ``seq`` from its log, then the live ones;
- ``POST /v1/agent/runs/:runId/cancel``: stop a run (``agent.end`` with status ``cancelled``).

The run belongs to the server: a client that goes away only stops reading. Input errors are
JSON ``{code, message}`` with a 4xx status before any stream starts. The wire formats are
documented in ``chat_app/sse/agent_chat.py`` and ``chat_app/sse/vercel_ai.py``.
"""
from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat_app import selectors, services
from chat_app.api.serializers import StrictCharField
from chat_app.sse import agent_chat, vercel_ai
from chat_app.sse.base import EventStreamRenderer, event_stream_response, launch_run
from orchestrator_site.errors import InvalidInput, NotFound
from tools_app.selectors import tool_confirmation_awaiting_seq
from tools_app.services import tool_confirmation_decide, tool_confirmation_get

# ``?format=`` picks the stream dialect; the default is the seed-001 dialect.
DIALECTS: dict[str, ModuleType] = {"": agent_chat, agent_chat.NAME: agent_chat, vercel_ai.NAME: vercel_ai}


class DialectNegotiation(DefaultContentNegotiation):
    """``?format=`` names the stream dialect here, not a DRF renderer, so DRF must ignore it."""

    settings = SimpleNamespace(URL_FORMAT_OVERRIDE=None)


class AgentChatInput(serializers.Serializer):
    conversationId = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    input = StrictCharField(trim_whitespace=False, max_length=services.MAX_INPUT_CHARS)
    agentRole = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    engine = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=40)
    model = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=200)


class AiSdkChatOptionsInput(AgentChatInput):
    """The AI SDK body's extra fields (``useChat({ body })``); the input comes from ``messages``."""

    input = None  # type: ignore[assignment]


def _dialect(request: Request) -> ModuleType:
    name = request.query_params.get("format", "")
    dialect = DIALECTS.get(name)
    if dialect is None:
        raise InvalidInput(f"Unknown stream format {name!r}; use one of: {', '.join(n for n in DIALECTS if n)}.",
                           code="unknown_format")
    return dialect


def _stream(dialect: ModuleType, *, run_id: str, conversation_id: str, after_seq: int = 0,
            **render_kwargs: Any) -> StreamingHttpResponse:
    body = dialect.render(
        services.run_subscribe(run_id=run_id, after_seq=after_seq),
        run_id=run_id, conversation_id=conversation_id,
        ping_interval=float(settings.SSE_PING_INTERVAL), **render_kwargs,
    )
    return event_stream_response(body, headers={**dialect.HEADERS, "X-Run-Id": run_id,
                                                 "X-Conversation-Id": conversation_id})


def _blank_to_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (v or None) for k, v in data.items()}


_SSE_RESPONSES = {
    (200, "text/event-stream"): OpenApiResponse(description="The run's events as SSE (see the format)."),
}


class AgentChatApi(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]
    content_negotiation_class = DialectNegotiation

    @extend_schema(
        request=AgentChatInput,
        parameters=[OpenApiParameter("format", str, enum=[n for n in DIALECTS if n],
                                     description="Stream dialect: agent-chat (default) or vercel-ai")],
        responses=_SSE_RESPONSES,
        summary="Run an agent and stream its events (SSE; also takes the AI SDK {id, messages} body)",
    )
    def post(self, request: Request) -> StreamingHttpResponse:
        dialect = _dialect(request)
        body = request.data
        if vercel_ai.is_ui_chat_request(body):
            return self._ai_sdk_request(request, dialect, body)
        if not isinstance(body, dict):
            raise InvalidInput("The body must be a JSON object {conversationId?, input, agentRole?, engine?, model?}.",
                               code="invalid_input")
        serializer = AgentChatInput(data=body)
        serializer.is_valid(raise_exception=True)
        data = _blank_to_none(serializer.validated_data)
        return self._start(request, dialect, input=serializer.validated_data["input"],
                           conversation_id=data.get("conversationId"), agent_role=data.get("agentRole"),
                           engine=data.get("engine"), model=data.get("model"))

    def _start(self, request: Request, dialect: ModuleType, **run_args: Any) -> StreamingHttpResponse:
        created = services.run_create(user=request.user, **run_args)
        launch_run(created)
        return _stream(dialect, run_id=str(created.run.id), conversation_id=str(created.conversation.id),
                       conversation_created=created.conversation_created)

    def _ai_sdk_request(self, request: Request, dialect: ModuleType, body: dict[str, Any]) -> StreamingHttpResponse:
        ui = vercel_ai.parse_chat_request(body)
        if ui.approvals:
            return self._continue_after_decisions(request, dialect, ui)
        options = AiSdkChatOptionsInput(data=body)
        options.is_valid(raise_exception=True)
        data = _blank_to_none(options.validated_data)
        conversation_id, history = data.get("conversationId"), None
        if conversation_id is None and ui.chat_id:
            # The chat id continues one of the caller's conversations; any other id starts a new
            # one (announced by data-conversation), seeded with the turns the client sent.
            try:
                conversation_id = str(selectors.conversation_get(user=request.user, conversation_id=ui.chat_id).id)
            except NotFound:
                conversation_id = None
        if conversation_id is None:
            history = ui.history or None
        return self._start(request, dialect, input=ui.input, conversation_id=conversation_id, history=history,
                           agent_role=data.get("agentRole"), engine=data.get("engine"), model=data.get("model"))

    def _continue_after_decisions(self, request: Request, dialect: ModuleType,
                                  ui: vercel_ai.UiChatRequest) -> StreamingHttpResponse:
        # A body that only answers approvals decides them, then streams the rest of that run
        # (right after its awaiting_input event), continuing the client's UI message.
        decided, covered = [], set()
        for a in ui.approvals:
            if a.confirmation_id in covered:  # an earlier remembered decision in this body decided it
                decided.append(tool_confirmation_get(user=request.user, confirmation_id=a.confirmation_id))
                continue
            confirmation = tool_confirmation_decide(user=request.user, confirmation_id=a.confirmation_id,
                                                    approved=a.approved, reason=a.reason, remember=a.remember,
                                                    pattern=a.pattern)
            covered.update(confirmation.also_decided)
            decided.append(confirmation)
        run = selectors.run_get(user=request.user, run_id=decided[-1].run_id)
        same_run = [c for c in decided if c.run_id == run.id]
        after = min(tool_confirmation_awaiting_seq(confirmation=c) for c in same_run)
        return _stream(dialect, run_id=str(run.id), conversation_id=str(run.conversation_id), after_seq=after,
                       known_tool_calls={c.tool_call_id for c in same_run}, resuming=after > 0)


def _after_seq(request: Request) -> int:
    raw = request.META.get("HTTP_LAST_EVENT_ID") or request.query_params.get("after") or "0"
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidInput(f"Last-Event-ID / after must be a non-negative event seq, got {raw!r}.",
                           code="invalid_last_event_id")
    return value


class RunEventsApi(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]
    content_negotiation_class = DialectNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=[n for n in DIALECTS if n]),
            OpenApiParameter("after", int, description="Replay events after this seq (or send Last-Event-ID)"),
            OpenApiParameter("Last-Event-ID", str, location=OpenApiParameter.HEADER, required=False),
        ],
        responses={**_SSE_RESPONSES, 204: OpenApiResponse(description="The run ended and nothing follows `after`.")},
        summary="(Re)attach to a run's event stream: missed events, then live ones",
    )
    def get(self, request: Request, run_id: str) -> StreamingHttpResponse | HttpResponse:
        dialect = _dialect(request)
        run = selectors.run_get(user=request.user, run_id=run_id)
        after = _after_seq(request)
        if after and run.events.filter(event="agent.end", seq__lte=after).exists():
            # The client already has agent.end: 204 tells a browser EventSource to stop reconnecting.
            return HttpResponse(status=204)
        return _stream(dialect, run_id=str(run.id), conversation_id=str(run.conversation_id), after_seq=after)


class RunCancelOutput(serializers.Serializer):
    runId = serializers.UUIDField(source="id")
    status = serializers.CharField()


class RunCancelApi(APIView):
    @extend_schema(request=None, responses=RunCancelOutput,
                   summary="Cancel a running run (409 when it already ended)")
    def post(self, request: Request, run_id: str) -> Response:
        run = async_to_sync(services.run_cancel)(user=request.user, run_id=run_id)
        return Response(RunCancelOutput(run).data)

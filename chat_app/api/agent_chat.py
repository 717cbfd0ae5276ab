"""The agent-chat SSE endpoints (seed 001, CHAT-030 … CHAT-070).

- ``POST /v1/agent/chat[?format=agent-chat|vercel-ai]``: start a run and stream it;
- ``GET /v1/agent/runs/:runId/events[?format=…][&after=<seq>]`` (or ``Last-Event-ID: <seq>``):
  (re)attach to a run: the events after ``seq`` from its log, then the live ones;
- ``POST /v1/agent/runs/:runId/cancel``: stop a run (``agent.end`` with status ``cancelled``).

The run belongs to the server: a client that goes away only stops reading. Input errors are
JSON ``{code, message}`` with a 4xx status before any stream starts. The wire formats are
documented in ``chat_app/transports/agent_chat.py`` and ``chat_app/transports/vercel_ai.py``.
"""
from __future__ import annotations

from typing import Any

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from chat_app import selectors, services
from chat_app.api.serializers import StrictCharField, fast_validated_data
from chat_app.api.streaming import AsyncApiView
from chat_app.models import RunEvent
from chat_app.transports import Dialect, get_dialect
from chat_app.transports import vercel_ai
from core.errors import InvalidInput, NotFound
from tools_app.selectors import tool_confirmation_awaiting_seq
from tools_app.services import tool_confirmation_decide, tool_confirmation_get

# ``?format=`` picks the stream dialect; the default is the seed-001 dialect.
FORMATS = ("agent-chat", "vercel-ai")


class AgentChatInput(serializers.Serializer):
    conversationId = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    input = StrictCharField(required=False, trim_whitespace=False, max_length=services.MAX_INPUT_CHARS)
    agentRole = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    engine = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=40)
    model = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=200)
    provider = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    # Regenerate (no input) or edit-and-resend (input) the conversation's last turn.
    regenerate = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("regenerate"):
            if not attrs.get("conversationId"):
                raise serializers.ValidationError({"conversationId": "regenerate needs the conversationId."})
        elif "input" not in attrs:
            raise serializers.ValidationError({"input": "This field is required."})
        return attrs


class AiSdkChatOptionsInput(AgentChatInput):
    """The AI SDK body's extra fields (``useChat({ body })``); the input comes from ``messages``."""

    input = None  # type: ignore[assignment]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return attrs


def _dialect(request: Request) -> type[Dialect]:
    # (No query string, the common case: no QueryDict is built to find that out.)
    name = (request.query_params.get("format", "") if request._request.META.get("QUERY_STRING") else "") or "agent-chat"
    if name not in FORMATS:
        raise InvalidInput(f"Unknown stream format {name!r}; use one of: {', '.join(FORMATS)}.",
                           code="unknown_format")
    return get_dialect(name)  # type: ignore[return-value]


def _validated(serializer_cls: type[serializers.Serializer], body: dict[str, Any]) -> dict[str, Any]:
    """The serializer's validated data: computed cheaply for a plain body, else by the serializer."""
    data = fast_validated_data(serializer_cls, body)
    if data is None:
        serializer = serializer_cls(data=body)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
    return data


def _blank_to_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (v or None) for k, v in data.items()}


_SSE_RESPONSES = {
    (200, "text/event-stream"): OpenApiResponse(description="The run's events as SSE (see the format)."),
}


class AgentChatApi(AsyncApiView):
    @extend_schema(
        request=AgentChatInput,
        parameters=[OpenApiParameter("format", str, enum=list(FORMATS),
                                     description="Stream dialect: agent-chat (default) or vercel-ai")],
        responses=_SSE_RESPONSES,
        summary="Run an agent and stream its events (SSE; also takes the AI SDK {id, messages} body)",
    )
    async def post(self, request) -> StreamingHttpResponse:
        dialect, outcome = await self.burst(self._start, request)
        if isinstance(outcome, services.RunCreated):
            return await self.start_stream(outcome, dialect)
        return self.stream(dialect, **outcome)  # decisions on an AI SDK approval: the rest of that run

    def _start(self, request: Request) -> tuple[type[Dialect], Any]:
        dialect = _dialect(request)
        body = request.data
        if vercel_ai.is_ui_chat_request(body):
            return dialect, self._ai_sdk_request(request, body)
        if not isinstance(body, dict):
            raise InvalidInput("The body must be a JSON object {conversationId?, input, agentRole?, engine?, model?}.",
                               code="invalid_input")
        valid = _validated(AgentChatInput, body)
        data = _blank_to_none(valid)
        if data.get("regenerate"):
            return dialect, services.run_create_again(
                user=request.user, conversation_id=data["conversationId"], input=valid.get("input"),
                agent_role=data.get("agentRole"), engine=data.get("engine"), model=data.get("model"),
                provider=data.get("provider"))
        return dialect, services.run_create(
            user=request.user, input=valid["input"], conversation_id=data.get("conversationId"),
            agent_role=data.get("agentRole"), engine=data.get("engine"), model=data.get("model"),
            provider=data.get("provider"), defer_commit=True)

    def _ai_sdk_request(self, request: Request, body: dict[str, Any]) -> Any:
        ui = vercel_ai.parse_chat_request(body)
        if ui.approvals:
            return self._decide(request, ui)
        data = _blank_to_none(_validated(AiSdkChatOptionsInput, body))
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
        return services.run_create(user=request.user, input=ui.input, conversation_id=conversation_id,
                                   history=history, agent_role=data.get("agentRole"), engine=data.get("engine"),
                                   model=data.get("model"), provider=data.get("provider"), defer_commit=True)

    @staticmethod
    def _decide(request: Request, ui: vercel_ai.UiChatRequest) -> dict[str, Any]:
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
        return {"run_id": str(run.id), "conversation_id": str(run.conversation_id), "after_seq": after,
                "known_tool_calls": {c.tool_call_id for c in same_run}, "resuming": after > 0}


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


class RunEventsApi(AsyncApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=list(FORMATS)),
            OpenApiParameter("after", int, description="Replay events after this seq (or send Last-Event-ID)"),
            OpenApiParameter("Last-Event-ID", str, location=OpenApiParameter.HEADER, required=False),
        ],
        responses={**_SSE_RESPONSES, 204: OpenApiResponse(description="The run ended and nothing follows `after`.")},
        summary="(Re)attach to a run's event stream: missed events, then live ones",
    )
    async def get(self, request, run_id: str) -> StreamingHttpResponse | HttpResponse:
        # A run that started a moment ago, here or in another process, is waited for.
        outcome = await services.run_read(lambda: self.burst(lambda drf_request: self._find(drf_request, run_id), request),
                                          run_id=run_id)
        if outcome is None:
            # The client already has agent.end: 204 tells a browser EventSource to stop reconnecting.
            return HttpResponse(status=204)
        return self.stream(**outcome)

    @staticmethod
    def _find(request: Request, run_id: str) -> dict[str, Any] | None:
        dialect = _dialect(request)
        run = selectors.run_get(user=request.user, run_id=run_id)
        after = _after_seq(request)
        if after and RunEvent.objects.filter(run=run, event="agent.end", seq__lte=after).exists():
            return None
        return {"dialect_cls": dialect, "run_id": str(run.id), "conversation_id": str(run.conversation_id),
                "after_seq": after}


class RunCancelOutput(serializers.Serializer):
    runId = serializers.UUIDField(source="id")
    status = serializers.CharField()


class RunCancelApi(AsyncApiView):
    @extend_schema(request=None, responses=RunCancelOutput,
                   summary="Cancel a running run (409 when it already ended)")
    async def post(self, request, run_id: str) -> JsonResponse:
        user = await self.burst(lambda drf_request: drf_request.user, request)
        run = await services.run_cancel(user=user, run_id=run_id)
        return JsonResponse(RunCancelOutput(run).data)

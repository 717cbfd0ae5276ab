"""``POST /chat``: seed 004's non-streaming assistant-ui endpoint, over the run service.

Request (seed 004 §8.2)::

    {"messages": [{"role": "user", "content": [{"type": "text", "text": "..."}]}]}

``content`` may also be a plain string. Like the seed, the text is the latest user message that
has text (its first ``text`` part); none → ``"No text content provided."``. Earlier messages of
the request become the run's history. Optional ``conversationId`` continues a stored
conversation instead (its stored turns are then the history).

Response 200: ``{"answer", "events": [{step, agent, action, tool, target_agent, thought}],
"runId", "conversationId"}``. The run is an ordinary run of the ``orchestrator`` agent on its
configured engine, so it is persisted and its timeline is at ``/v1/agent/runs/<runId>/timeline``.
Errors are JSON ``{code, message}``: malformed body 400; a provider failure (Ollama down, model
missing) 502 naming the model and endpoint; run timeout 504; cancelled 409; other failures 500.
"""
from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from chat_app import services
from chat_app.api.streaming import AsyncApiView
from chat_app.executor import get_executor
from core.events import ContextPatch, RunEnded

PLACEHOLDER = "No text content provided."
CHAT_AGENT_ROLE = "orchestrator"

# Run failure codes → HTTP status; anything unlisted is 500.
_FAILURE_STATUS = {"model_not_found": 502, "run_timeout": 504, "cancelled": 409}


class AssistantUiMessageInput(serializers.Serializer):
    role = serializers.CharField(required=False, allow_blank=True, default="")
    content = serializers.JSONField(required=False, default=list, allow_null=True,
                                    help_text='A list of parts ([{"type": "text", "text": "..."}]) or a plain string.')


class AssistantUiChatInput(serializers.Serializer):
    messages = AssistantUiMessageInput(many=True)
    conversationId = serializers.UUIDField(required=False)


class AssistantUiEventOutput(serializers.Serializer):
    step = serializers.IntegerField()
    agent = serializers.CharField()
    action = serializers.CharField(allow_null=True)
    tool = serializers.CharField(allow_null=True)
    target_agent = serializers.CharField(allow_null=True)
    thought = serializers.CharField(allow_blank=True)


class AssistantUiChatOutput(serializers.Serializer):
    answer = serializers.CharField(allow_blank=True)
    events = AssistantUiEventOutput(many=True)
    runId = serializers.UUIDField()
    conversationId = serializers.UUIDField()


def message_text(content: Any) -> str:
    """A message's text: a plain string, or the first ``{"type": "text"}`` part of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                return part["text"]
    return ""


def split_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """The latest user text (or the seed's placeholder) and the text turns before it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            text = message_text(messages[index].get("content"))
            if text.strip():
                history = []
                for earlier in messages[:index]:
                    role, said = earlier.get("role"), message_text(earlier.get("content"))
                    if role in ("user", "assistant") and said.strip():
                        history.append({"role": role, "content": said})
                return text, history
    return PLACEHOLDER, []


async def _await_outcome(run_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read the run until it ends: the seed's step events and the ``agent.end`` payload."""
    steps: list[dict[str, Any]] = []
    end: dict[str, Any] = {}
    async for recorded in get_executor().subscribe(run_id):
        data = recorded.data
        if isinstance(data, ContextPatch) and data.kind == "step":
            steps.append({key: (data.data or {}).get(key)
                          for key in ("step", "agent", "action", "tool", "target_agent", "thought")})
        elif isinstance(data, RunEnded):
            end = recorded.payload
    return steps, end


class AssistantUiChatApi(AsyncApiView):
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]

    @extend_schema(
        request=AssistantUiChatInput,
        responses={
            200: AssistantUiChatOutput,
            400: OpenApiResponse(description="Malformed body: {code, message}"),
            502: OpenApiResponse(description="The model provider failed (e.g. Ollama down): {code, message, runId, conversationId}"),
            504: OpenApiResponse(description="The run timed out: {code, message, runId, conversationId}"),
        },
        summary="Seed 004 /chat: run the orchestrator on assistant-ui messages, return answer + step events",
    )
    async def post(self, request) -> JsonResponse:
        created = await self.burst(self._create, request)
        get_executor().submit(created.launch)
        steps, end = await _await_outcome(created.launch.run_id)
        ids = {"runId": created.launch.run_id, "conversationId": created.launch.conversation_id}
        if end.get("status") != "succeeded":
            code = end.get("errorCode") or ("run_" + str(end.get("status") or "lost"))
            status = _FAILURE_STATUS.get(code, 502 if code.startswith("provider_") else 500)
            message = end.get("error") or f"The run ended {end.get('status') or 'without a result'}."
            return JsonResponse({"code": code, "message": message, **ids, "events": steps}, status=status)
        return JsonResponse({"answer": end.get("text", ""), "events": steps, **ids},
                            json_dumps_params={"ensure_ascii": False})

    @staticmethod
    def _create(request: Request) -> services.RunCreated:
        data = request.data
        serializer = AssistantUiChatInput(data=data if isinstance(data, dict) else {"messages": None})
        serializer.is_valid(raise_exception=True)
        conversation_id = serializer.validated_data.get("conversationId")
        text, history = split_messages(serializer.validated_data["messages"])
        return services.run_create(
            user=request.user, input=text, agent_role=CHAT_AGENT_ROLE,
            conversation_id=str(conversation_id) if conversation_id else None,
            history=None if conversation_id else history, defer_commit=True,
        )

"""REST views for conversations and messages (seed 001, CHAT-010/020). Thin: one service call each."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.selectors import agent_get_for_run
from chat_app import selectors, services

from .serializers import ConversationCreateInput, ConversationOutput, MessageOutput, RunTimelineOutput


class ConversationListCreateApi(APIView):
    @extend_schema(responses=ConversationOutput(many=True), summary="List your conversations, newest activity first")
    def get(self, request: Request) -> Response:
        conversations = selectors.conversation_list(user=request.user)
        return Response(ConversationOutput(conversations, many=True).data)

    @extend_schema(request=ConversationCreateInput, responses=ConversationOutput, summary="Create a conversation")
    def post(self, request: Request) -> Response:
        data = request.data if request.data is not None else {}
        serializer = ConversationCreateInput(data=data if isinstance(data, dict) else {"title": []})
        serializer.is_valid(raise_exception=True)
        role = serializer.validated_data.get("agentRole")
        agent = agent_get_for_run(role=role) if role else None
        conversation = services.conversation_create(user=request.user, title=serializer.validated_data["title"], agent=agent)
        return Response(ConversationOutput(conversation).data, status=200)


class ConversationMessagesApi(APIView):
    @extend_schema(responses=MessageOutput(many=True), summary="A conversation's messages, oldest first")
    def get(self, request: Request, conversation_id: str) -> Response:
        messages = selectors.message_list(user=request.user, conversation_id=conversation_id)
        return Response(MessageOutput(messages, many=True).data)


class RunTimelineApi(APIView):
    @extend_schema(responses=RunTimelineOutput, summary="A run's complete, ordered event timeline (CHAT-080)")
    def get(self, request: Request, run_id: str) -> Response:
        run, events = selectors.run_timeline(user=request.user, run_id=run_id)
        return Response(RunTimelineOutput(run, context={"events": events}).data)

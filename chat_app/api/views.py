"""REST views for conversations and messages (seed 001, CHAT-010/020). Thin: one service call each."""
from __future__ import annotations

from asgiref.sync import async_to_sync
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.selectors import agent_get_for_run
from chat_app import selectors, services

from core.errors import InvalidInput

from .serializers import (ConversationCreateInput, ConversationOutput, ConversationUpdateInput, MessageOutput,
                          RunTimelineOutput)


class ConversationListCreateApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("q", str, description="Only those whose title or any message contains this "
                                                           "(case-insensitive)")],
        responses=ConversationOutput(many=True), summary="List your conversations, newest activity first")
    def get(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        if len(query) > 200:
            raise InvalidInput("q is longer than 200 characters.", code="invalid_input")
        conversations = selectors.conversation_search(user=request.user, query=query)
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


class ConversationApi(APIView):
    @extend_schema(responses=ConversationOutput, summary="One conversation")
    def get(self, request: Request, conversation_id: str) -> Response:
        return Response(ConversationOutput(selectors.conversation_get(user=request.user,
                                                                      conversation_id=conversation_id)).data)

    @extend_schema(request=ConversationUpdateInput, responses=ConversationOutput, summary="Rename a conversation")
    def patch(self, request: Request, conversation_id: str) -> Response:
        selectors.conversation_get(user=request.user, conversation_id=conversation_id)  # 404 before 400
        if not isinstance(request.data, dict):
            raise InvalidInput("The body must be a JSON object {title}.", code="invalid_input")
        serializer = ConversationUpdateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation = services.conversation_rename(user=request.user, conversation_id=conversation_id,
                                                    title=serializer.validated_data["title"])
        return Response(ConversationOutput(conversation).data)

    @extend_schema(request=None, responses={204: None},
                   summary="Delete a conversation (its live runs are cancelled first)")
    def delete(self, request: Request, conversation_id: str) -> Response:
        async_to_sync(services.conversation_delete)(user=request.user, conversation_id=conversation_id)
        return Response(status=204)


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

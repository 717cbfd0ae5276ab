"""A conversation's own approval rules: ``GET/POST /v1/conversations/:id/tool-rules`` and
``DELETE /v1/conversations/:id/tool-rules/:ruleId``.

The conversation is looked up as the caller's (another user's answers 404, as everywhere); the
rules themselves are tools_app's (``ToolRule`` with scope ``conversation``). Agent and global
rules are made in the admin, or by staff with ``remember: "agent"`` on a decision.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat_app import selectors
from chat_app.api.serializers import StrictCharField
from orchestrator_site.errors import InvalidInput
from tools_app.api import ToolRuleOutput
from tools_app.models import ToolRule
from tools_app.selectors import tool_rule_list
from tools_app.services import tool_rule_create, tool_rule_delete


class ToolRuleInput(serializers.Serializer):
    effect = serializers.ChoiceField(choices=[e.value for e in ToolRule.Effect])
    tool = StrictCharField(max_length=100, help_text="Tool name or glob, e.g. bash or mcp__filesystem__*.")
    argument = StrictCharField(required=False, allow_blank=True, max_length=500, default="",
                               help_text="Pattern on the tool's main argument (git status*, src/**, *.example.com).")
    name = StrictCharField(required=False, allow_blank=True, max_length=200, default="")


class ConversationToolRulesApi(APIView):
    @extend_schema(responses=ToolRuleOutput(many=True), summary="A conversation's own approval rules, oldest first")
    def get(self, request: Request, conversation_id: str) -> Response:
        conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
        return Response(ToolRuleOutput(tool_rule_list(conversation_id=conversation.id), many=True).data)

    @extend_schema(request=ToolRuleInput, responses={201: ToolRuleOutput},
                   summary="Add an allow, ask or deny rule for this conversation")
    def post(self, request: Request, conversation_id: str) -> Response:
        conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
        if not isinstance(request.data, dict):
            raise InvalidInput("The body must be a JSON object {effect, tool, argument?, name?}.", code="invalid_input")
        serializer = ToolRuleInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        rule = tool_rule_create(user=request.user, scope=ToolRule.Scope.CONVERSATION, conversation_id=conversation.id,
                                owner=conversation.owner, **serializer.validated_data)
        return Response(ToolRuleOutput(rule).data, status=201)


class ConversationToolRuleApi(APIView):
    @extend_schema(request=None, responses={204: None}, summary="Delete one of this conversation's rules")
    def delete(self, request: Request, conversation_id: str, rule_id: str) -> Response:
        conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
        tool_rule_delete(user=request.user, rule_id=rule_id, conversation_id=conversation.id)
        return Response(status=204)

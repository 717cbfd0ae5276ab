"""REST views for tool confirmations (seed 001, CHAT-050). Thin: one service or selector call each."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat_app.api.serializers import StrictCharField

from . import selectors, services
from .models import ToolConfirmation, ToolRule


class ToolConfirmationOutput(serializers.ModelSerializer):
    runId = serializers.UUIDField(source="run_id")
    conversationId = serializers.UUIDField(source="run.conversation_id")
    toolCallId = serializers.CharField(source="tool_call_id")
    decidedBy = serializers.CharField(source="decided_by.username", allow_null=True, default=None)
    decidedAt = serializers.DateTimeField(source="decided_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    expiresAt = serializers.DateTimeField(source="expires_at", allow_null=True)

    class Meta:
        model = ToolConfirmation
        fields = ["id", "runId", "conversationId", "toolCallId", "tool", "input", "status", "reason", "output",
                  "decidedBy", "decidedAt", "createdAt", "expiresAt"]


class ToolRuleOutput(serializers.ModelSerializer):
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = ToolRule
        fields = ["id", "effect", "tool", "argument", "scope", "name", "createdAt"]


class ToolConfirmationDecisionInput(serializers.Serializer):
    reason = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")
    remember = serializers.ChoiceField(choices=list(services.REMEMBER_SCOPES), required=False, allow_null=True,
                                       default=None, help_text="Also make this decision a rule (agent: staff only).")
    pattern = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=500, default=None,
                              help_text="With remember: the rule's pattern on the tool's main argument.")


class ToolConfirmationDecisionOutput(ToolConfirmationOutput):
    # With remember: the rule made, and the other pending confirmations it decided.
    rule = ToolRuleOutput(source="remembered_rule", allow_null=True, default=None)
    alsoDecided = serializers.ListField(child=serializers.CharField(), source="also_decided", default=list)

    class Meta(ToolConfirmationOutput.Meta):
        fields = [*ToolConfirmationOutput.Meta.fields, "rule", "alsoDecided"]


class ToolConfirmationListApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=list(ToolConfirmation.Status.values),
                                     description="pending = still waiting for your decision")],
        responses=ToolConfirmationOutput(many=True),
        summary="Your tool confirmations, newest first",
    )
    def get(self, request: Request) -> Response:
        confirmations = selectors.tool_confirmation_list(user=request.user, status=request.query_params.get("status"))
        return Response(ToolConfirmationOutput(confirmations, many=True).data)


class _DecideApi(APIView):
    approved: bool

    def post(self, request: Request, confirmation_id: str) -> Response:
        data = request.data if isinstance(request.data, dict) else {"reason": []}
        serializer = ToolConfirmationDecisionInput(data=data)
        serializer.is_valid(raise_exception=True)
        confirmation = services.tool_confirmation_decide(
            user=request.user, confirmation_id=confirmation_id, approved=self.approved,
            reason=serializer.validated_data["reason"], remember=serializer.validated_data["remember"],
            pattern=serializer.validated_data["pattern"],
        )
        return Response(ToolConfirmationDecisionOutput(confirmation).data)


class ToolConfirmationApproveApi(_DecideApi):
    approved = True

    @extend_schema(request=ToolConfirmationDecisionInput, responses=ToolConfirmationDecisionOutput,
                   summary="Approve a pending tool call (first decision wins; 409 after)")
    def post(self, request: Request, confirmation_id: str) -> Response:
        return super().post(request, confirmation_id)


class ToolConfirmationDenyApi(_DecideApi):
    approved = False

    @extend_schema(request=ToolConfirmationDecisionInput, responses=ToolConfirmationDecisionOutput,
                   summary="Deny a pending tool call (first decision wins; 409 after)")
    def post(self, request: Request, confirmation_id: str) -> Response:
        return super().post(request, confirmation_id)

"""Usage and cost (``GET /v1/usage``) and routing recommendations (``POST /v1/providers/recommend``)."""
from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.router import route_run
from agents_app.selectors import agent_for_run
from core.errors import InvalidInput

from ..usage import GROUPS, RunSpend, usage_report


class UsageApi(APIView):
    @extend_schema(
        responses=OpenApiTypes.OBJECT,
        summary="Tokens and cost summed per provider, model, agent, conversation or day (staff: everyone's)",
        parameters=[OpenApiParameter("group_by", str, enum=list(GROUPS)),
                    OpenApiParameter("from", str, description="UTC date, inclusive (YYYY-MM-DD)"),
                    OpenApiParameter("to", str, description="UTC date, inclusive (YYYY-MM-DD)")],
    )
    def get(self, request: Request) -> Response:
        q = request.query_params
        return Response(usage_report(user=request.user, group_by=q.get("group_by") or "provider",
                                     date_from=q.get("from"), date_to=q.get("to")))


class RecommendInput(serializers.Serializer):
    task = serializers.CharField(max_length=200_000, trim_whitespace=False)
    agentRole = serializers.CharField(required=False, allow_blank=True, max_length=64)
    provider = serializers.CharField(required=False, allow_blank=True, max_length=64)
    model = serializers.CharField(required=False, allow_blank=True, max_length=200)


class ProviderRecommendApi(APIView):
    @extend_schema(request=RecommendInput, summary="Where a task would run and why; nothing is started "
                                                   "(seed 002 provider_recommend)",
                   responses=inline_serializer("Recommendation", {
                       "engine": serializers.CharField(), "provider": serializers.CharField(),
                       "model": serializers.CharField(), "rationale": serializers.CharField(),
                       "fallbacks": serializers.ListField(child=serializers.CharField())}))
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise InvalidInput("The body must be a JSON object {task, agentRole?, provider?, model?}.")
        data = RecommendInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        agent, _ = agent_for_run(role=v.get("agentRole") or settings.DEFAULT_AGENT_ROLE)
        route = route_run(agent=agent, task=v["task"], provider=v.get("provider") or None,
                          model=v.get("model") or None, user=request.user, spend=RunSpend())
        return Response({"engine": route.engine, "provider": route.provider, "model": route.model,
                         "rationale": route.note, "fallbacks": [f"{p}/{m}" for p, m in route.fallbacks]})

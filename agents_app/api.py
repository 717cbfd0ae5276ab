"""Seed-000 basics: health and the agent list."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tools_app.registry import all_tools

from .router import engine_status, provider_status_list
from .selectors import agent_list


class AgentOutput(serializers.Serializer):
    role = serializers.CharField()
    name = serializers.CharField(source="name_zh")
    display_name = serializers.CharField()
    description = serializers.CharField()
    workspace = serializers.CharField(source="workspace_path")
    engine = serializers.CharField()
    model = serializers.CharField()
    tools = serializers.ListField(source="allowed_tools", child=serializers.CharField())


class HealthApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        summary="Service health: agent count, tools, and which engines are live or mocked",
        responses=inline_serializer("Health", {
            "status": serializers.CharField(), "agent_count": serializers.IntegerField(),
            "tools": serializers.ListField(child=serializers.CharField()), "engines": serializers.DictField(),
            "providers": serializers.ListField(child=serializers.DictField()),
        }),
    )
    def get(self, request: Request) -> Response:
        return Response({
            "status": "ok",
            "agent_count": agent_list().count(),
            "tools": list(all_tools()),
            "engines": engine_status(),
            # Status only (no URLs, no key variables): this endpoint is public.
            "providers": [{k: p[k] for k in ("name", "kind", "status", "latencyMs", "recentErrors", "rateLimited",
                                             "cooldownUntil")} for p in provider_status_list()],
        })


class AgentListApi(APIView):
    @extend_schema(responses=AgentOutput(many=True), summary="All enabled agents")
    def get(self, request: Request) -> Response:
        return Response(AgentOutput(agent_list(), many=True).data)

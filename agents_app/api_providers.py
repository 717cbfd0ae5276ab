"""Provider endpoints: the status of every provider, and of one (checked now).

What they show never includes a key: only the name of the variable that holds it.
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import NotFound

from .router import provider_status_list


class ProviderListApi(APIView):
    @extend_schema(operation_id="providers_list", responses=OpenApiTypes.OBJECT, summary="Providers: models, prices, status, latency, recent errors, rate limits, cooldowns "
                           "(seed 002 provider_list)")
    def get(self, request: Request) -> Response:
        return Response({"providers": provider_status_list()})


class ProviderDetailApi(APIView):
    @extend_schema(operation_id="provider_status", responses=OpenApiTypes.OBJECT, summary="One provider's status, checked now (seed 002 provider_status)")
    def get(self, request: Request, name: str) -> Response:
        from .providers import health
        from .providers.registry import provider_registry

        info = provider_registry().get(name)
        if info is None:
            raise NotFound(f"No provider {name!r}.", code="provider_not_found")
        health.PROBE.forget(name)  # "check provider status" means now, not the cached answer
        return Response(next(p for p in provider_status_list() if p["name"] == name))

"""The Claude tool-use engine (official ``anthropic`` SDK). The loop lands with the seed-000 work."""
from __future__ import annotations

from typing import AsyncIterator

from django.conf import settings

from chat_app.events import RunEventBase

from .base import Engine, EngineContext, EngineError, EngineResult


class ClaudeEngine(Engine):
    name = "claude"
    provider = "anthropic"
    description = "Claude tool-use loop through the official anthropic SDK."
    fallback = "mock"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not settings.ANTHROPIC_API_KEY:
            return "no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN configured"
        return None

    @classmethod
    def default_model(cls) -> str:
        return settings.ANTHROPIC_MODEL

    async def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        raise EngineError("The Claude engine is not implemented yet.", code="not_implemented")
        yield  # pragma: no cover

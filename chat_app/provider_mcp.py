"""The provider management tools over MCP (seed 002): ``provider_list``, ``provider_status``,
``provider_recommend``, served by ``manage.py mcp_providers`` over stdio for Claude Code or any
MCP client (``claude mcp add providers -- .venv/bin/python manage.py mcp_providers``).

They answer what ``GET /v1/providers``, ``GET /v1/providers/:name`` and
``POST /v1/providers/recommend`` answer, as JSON text; nothing here starts a run, and no key is
ever shown. The process acts as one user (``--user``) for budgets.
"""
from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from agents_app.router import provider_status_list, route_run
from agents_app.selectors import agent_for_run
from core.errors import ApplicationError

from .usage import RunSpend


def build_provider_server(*, user: Any = None) -> MCPServer:
    server = MCPServer("orchestrator-providers", instructions=(
        "Providers this orchestrator can run agents on: list them with models, prices and health; "
        "check one now; ask where a task would run and why."))

    def dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, indent=1)

    @server.tool(description="All configured providers: models (tier, context window, tags, price per million "
                             "tokens), status, latency, recent errors, rate limit and cooldown.")
    async def provider_list() -> str:
        return dumps(await sync_to_async(provider_status_list, thread_sensitive=False)())

    @server.tool(description="One provider's status, health-checked now: status, latency, rate-limit state, "
                             "recent error count, cooldown end.")
    async def provider_status(name: str) -> str:
        def status() -> Any:
            from agents_app.providers import health

            health.PROBE.forget(name)
            found = [p for p in provider_status_list() if p["name"] == name]
            if not found:
                raise ToolError(f"No provider {name!r}; known: {', '.join(p['name'] for p in provider_status_list())}.")
            return found[0]

        return dumps(await sync_to_async(status, thread_sensitive=False)())

    @server.tool(description="Where a task would run (engine, provider, model, fallbacks) and the routing "
                             "rationale. Optional: agent_role, provider, model overrides. Nothing is started.")
    async def provider_recommend(task: str, agent_role: str = "", provider: str = "", model: str = "") -> str:
        def recommend() -> dict[str, Any]:
            try:
                agent, _ = agent_for_run(role=agent_role or settings.DEFAULT_AGENT_ROLE)
                route = route_run(agent=agent, task=task, provider=provider or None, model=model or None,
                                  user=user, spend=RunSpend())
            except ApplicationError as exc:
                raise ToolError(f"{exc.code}: {exc.message}") from exc
            return {"engine": route.engine, "provider": route.provider, "model": route.model,
                    "rationale": route.note, "fallbacks": [f"{p}/{m}" for p, m in route.fallbacks]}

        return dumps(await sync_to_async(recommend, thread_sensitive=False)())

    return server

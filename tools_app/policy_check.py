"""The approval policy at call time: load the rules that apply (one query) and evaluate them.

The tool runner calls :func:`tool_call_policy` once per tool call, so a rule added while a run
is going (a remembered decision) counts from the next call on. :func:`tool_needs_person` is the
same check without arguments, for engines whose tools run where nobody can be asked.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from .policy import PolicyDecision, policy_allows_unconditionally, policy_evaluate, tool_default_effect
from .selectors import tool_rules_for_call


async def tool_call_policy(*, agent: Any, conversation_id: str, tool_name: str, tool_input: Any, tool: Any,
                           workspace: Path) -> PolicyDecision:
    """Allow, ask or deny this call, and the rule (or default) that decided it."""
    rules = await sync_to_async(tool_rules_for_call)(agent_id=getattr(agent, "pk", None), conversation_id=conversation_id)
    return policy_evaluate(tool_name=tool_name, tool_input=tool_input, rules=rules,
                           default_effect=tool_default_effect(tool), workspace=workspace)


def tool_needs_person(*, agent: Any, conversation_id: str, tool_name: str, tool: Any) -> bool:
    """True unless every call of the tool would run without a person (a deny counts as needing one)."""
    rules = _blocking(tool_rules_for_call, agent_id=getattr(agent, "pk", None), conversation_id=conversation_id)
    return not policy_allows_unconditionally(tool_name=tool_name, rules=rules, default_effect=tool_default_effect(tool))


def _blocking(function: Any, **kwargs: Any) -> Any:
    """Run a sync ORM read from sync code that may be running inside the event loop.

    Engines build their options synchronously inside their async ``run`` (claude_agent_sdk), where
    Django refuses ORM calls: there the read runs on a short-lived thread (its own connection,
    closed after). A one-off at run start, not per call.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return function(**kwargs)

    def read() -> Any:
        from django.db import connections

        try:
            return function(**kwargs)
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(read).result()

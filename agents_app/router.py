"""The router: picks the engine, provider and model for a run. Engines never pick for themselves.

Order: an explicit ``provider``/``engine``/``model`` override on the request, else budgets, the
routing rules and the agent's setting (see :mod:`agents_app.providers.routing`), among the
providers of the kind the engine speaks that have their key set. The chosen candidate comes with
its fallbacks (other providers) for failover, and a rationale recorded on the run
(``route_note``, ``routeNote`` in ``agent.start``).

An engine with no usable provider here (e.g. ``claude`` without any API key, ``ollama`` with no
Ollama answering) falls back to its declared fallback (``mock``), with a warning logged once per
process and a note recorded on the run.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from core.errors import InvalidInput

from .engines import engine_names, get_engine
from .health import health_generation
from .models import Agent
from .providers import budgets, health
from .providers.registry import ModelInfo, provider_registry
from .providers.routing import estimate_tokens, route_providers

logger = logging.getLogger("orchestrator.router")
_warned: set[str] = set()


@dataclass(frozen=True)
class Route:
    engine: str
    provider: str
    model: str
    note: str = ""
    # Failover candidates after the chosen one: ((provider, model), ...), best first.
    fallbacks: tuple[tuple[str, str], ...] = ()
    # Every candidate with its provider's data (no key), the chosen one first; empty: no
    # provider routing (the engine's own configuration, e.g. the mock fallback).
    candidates: tuple[tuple[Any, str], ...] = ()


def route_run(*, agent: Agent, engine: str | None = None, model: str | None = None, provider: str | None = None,
              user: Any = None, task: str = "", history: list[dict[str, str]] | None = None,
              spend: Any = None) -> Route:
    """Choose where a run executes (see :func:`_decide`; a decision may come from the memo below)."""
    registry = provider_registry()
    tokens = estimate_tokens(task, agent.system_prompt or "", *((h.get("content") or "") for h in (history or [])))
    key = _memo_key(registry, agent=agent, engine=engine, model=model, provider=provider, tokens=tokens)
    if key is not None:
        hit = _MEMO.get(key)
        if hit is not None and hit[0] is registry and hit[1] > time.monotonic():
            return hit[2]

    def decide() -> Route:
        return _decide(registry, tokens, agent=agent, engine=engine, model=model, provider=provider, user=user,
                       task=task, spend=spend)

    route = decide()
    if key is not None and key[-1] != health_generation():
        # Health changed while deciding (this decision's own first probes, say): decide again on
        # what is known now, and remember that only if nothing changed meanwhile.
        key = (*key[:-1], health_generation())
        route = decide()
        if key[-1] != health_generation():
            key = None
    if key is not None and not any(health.cooldown_until(p.name) for p in registry.providers):
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = (registry, time.monotonic() + float(getattr(settings, "ROUTE_MEMO_SECONDS", 0) or 0), route)
    return route


def _decide(registry: Any, tokens: int, *, agent: Agent, engine: str | None, model: str | None,
            provider: str | None, user: Any, task: str, spend: Any) -> Route:
    """Choose where a run executes.

    Args:
        provider: an explicit provider name (request ``provider``, ACP ``--provider``); pins it.
        task: the user's input, classified by the routing rules.
        spend: a :class:`~agents_app.providers.budgets.SpendPort` for budgets and spend limits.

    Raises:
        InvalidInput: unknown engine, provider or model.
        ApplicationError: 429 ``budget_exceeded``; 503 ``provider_unavailable`` (a pinned provider without its key).
    """
    requested = engine or agent.engine
    if provider and (pinned := registry.get(provider)) is not None and pinned.engine:
        requested = pinned.engine  # a provider speaks one protocol: its engine runs it
    engine_cls = get_engine(requested)
    if engine_cls is None:
        raise InvalidInput(
            f"Unknown engine {requested!r}; available: {', '.join(engine_names())}.",
            code="unknown_engine",
            extra={"engines": engine_names()},
        )
    budget = budgets.budget_state(user=user, spend=spend) if spend is not None and registry.has_budgets else None
    if budget is not None and budget.over:
        budget.refuse()
    if provider and registry.get(provider) is not None and registry.get(provider).kind == "mock":
        return Route(engine=engine_cls.name, provider=provider, model=model or engine_cls.default_model(),
                     note=f"provider {provider} requested")
    # An Ollama that does not answer at all is "not running here" (the engine's fallback applies),
    # not a failing provider to try anyway.
    usable = registry
    if not provider:
        answering = tuple(p for p in registry.providers if not (
            p.kind == "ollama" and (r := health.probe(p)) is not None and not r.ok))
        if len(answering) != len(registry.providers):
            usable = _without_silent(registry, answering)
    decision = route_providers(
        registry=usable, engine=requested, agent_model=model or agent.model or engine_cls.default_model(),
        task=task, tokens=tokens, provider=provider, model=model, budget=budget,
        provider_over_limit=budgets.provider_over_limit(spend) if spend is not None else (lambda p: None))
    if decision is not None:
        first, rest = decision.candidates[0], decision.candidates[1:]
        return Route(engine=first.provider.engine or requested, provider=first.provider.name, model=first.model.name,
                     note=decision.rationale[:1000], fallbacks=tuple((c.provider.name, c.model.name) for c in rest),
                     candidates=tuple((c.provider, c.model.name) for c in decision.candidates))
    note = ""
    reason = engine_cls.unavailable_reason()
    if reason and engine_cls.fallback:
        fallback_cls = get_engine(engine_cls.fallback)
        assert fallback_cls is not None
        note = f"{requested} unavailable ({reason}): using {fallback_cls.name}"
        if requested not in _warned:
            _warned.add(requested)
            logger.warning("engine %s is unavailable (%s); runs fall back to the %s engine", requested, reason, fallback_cls.name)
        return Route(engine=fallback_cls.name, provider=fallback_cls.provider, model=fallback_cls.default_model(), note=note)
    chosen_model = model or agent.model or engine_cls.default_model()
    return Route(engine=engine_cls.name, provider=engine_cls.provider, model=chosen_model, note=note)


# --- the router's decision, remembered briefly ---------------------------------------------------
# After DRF, the router was the largest part of a chat start's view time (~28 us hot, several
# times that under load, on every start). Its decision depends on the request's engine, model and
# provider, the agent's engine and model, the registry (an immutable snapshot, replaced when
# anything in it is saved or reloaded), the providers' keys, their health, budgets and spend
# limits, the routing rules (which read the task) and the context size (which decides which
# models fit). It is remembered when none of the volatile parts takes part — no budget and no
# spend limit configured, no rule consulted (the request names a model, or no model is catalogued
# with a tier), no provider cooling down — keyed on the rest (the context size as which context
# windows it fits), for ROUTE_MEMO_SECONDS (1 s by default; 0: off). Any change of provider health
# (a failure, a probe's new answer, a reset) or of a setting forgets it at once; a probe or a
# cooldown that merely runs out of time is seen within those seconds.
_MEMO: dict[tuple, tuple[Any, float, Route]] = {}
_MEMO_MAX = 1024
# (registry, its distinct context windows, whether the memo may serve it at all): the last registry.
_SHAPE: list[tuple[Any, tuple[int, ...], bool]] = []


def _memo_key(registry: Any, *, agent: Agent, engine: str | None, model: str | None, provider: str | None,
              tokens: int) -> tuple | None:
    if not getattr(settings, "ROUTE_MEMO_SECONDS", 0):
        return None
    shape = _SHAPE[0] if _SHAPE and _SHAPE[0][0] is registry else None
    if shape is None:
        windows = {m.context_window for p in registry.providers for m in p.models} | {ModelInfo("", "").context_window}
        catalogued = any(m.tier for p in registry.providers for m in p.models)
        volatile = registry.has_budgets or any(p.spend_limit is not None for p in registry.providers)
        shape = (registry, tuple(sorted(windows)), None if volatile else catalogued)
        _SHAPE[:] = [shape]
    if shape[2] is None or (shape[2] and not model):
        return None  # budgets or spend limits take part, or the routing rules read the task
    keys = tuple(bool(os.environ.get(p.api_key_env)) for p in registry.providers if p.api_key_env)
    # The health generation last: a decision re-made after a health change is kept under the new one.
    return (id(registry), engine, model, provider, agent.engine, agent.model, tuple(w >= tokens for w in shape[1]),
            keys, health_generation())


def route_memo_clear(**_: Any) -> None:
    _MEMO.clear()


setting_changed.connect(route_memo_clear, dispatch_uid="router-memo-settings")


# (registry, the providers that answer, the registry of those): the last one made, reused while
# both are the same objects (a silent Ollama stays silent for many run starts).
_USABLE: list[tuple[Any, tuple[Any, ...], Any]] = []


def _without_silent(registry: Any, answering: tuple[Any, ...]) -> Any:
    last = _USABLE[0] if _USABLE else None
    if last is not None and last[0] is registry and len(last[1]) == len(answering) and all(
            a is b for a, b in zip(last[1], answering)):
        return last[2]
    usable = dataclasses.replace(registry, providers=answering)
    _USABLE[:] = [(registry, answering, usable)]
    return usable


def engine_status() -> dict[str, dict[str, str | bool]]:
    """For health output: which engines are live and which fall back (are mocked)."""
    from .engines import all_engines

    out: dict[str, dict[str, str | bool]] = {}
    for name, cls in all_engines().items():
        reason = cls.unavailable_reason()
        out[name] = {"live": reason is None, "provider": cls.provider, **cls.health_details()}
        if reason:
            out[name]["reason"] = reason
            if cls.fallback:
                out[name]["fallback"] = cls.fallback
    return out


def provider_status_list(*, check: bool = True) -> list[dict[str, Any]]:
    """Every provider (configured and implicit) with its models, prices and health; never keys."""
    from .providers.pricing import model_price

    out = []
    for p in provider_registry().providers:
        models = []
        for m in p.models:
            price = model_price(p, m)
            models.append({"name": m.name, "tier": m.tier or None, "contextWindow": m.context_window,
                           "tags": list(m.tags), "price": price.to_dict() if price is not None else None})
        out.append({"name": p.name, "kind": p.kind, "baseUrl": p.display_url(), "apiKeyEnv": p.api_key_env or None,
                    "implicit": p.implicit, "priority": p.priority,
                    "spendLimit": None if p.spend_limit is None else str(p.spend_limit), "spendPeriod": p.spend_period,
                    "models": models, **health.provider_status(p, check=check)})
    return out

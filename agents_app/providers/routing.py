"""Provider-aware routing: classify the task, apply the rules, honour budgets, order candidates.

Order of decisions (each adds to the rationale recorded on the run as ``route_note``):

1. An explicit override — ``provider`` and/or ``model`` in the request, ``--provider`` /
   ``--model`` in ACP — is used regardless of rules (an unknown provider is 400
   ``unknown_provider``; a model no candidate serves is 400 ``unknown_model``).
2. Budgets (:mod:`.budgets`): over a hard limit → 429 ``budget_exceeded``; past a budget's soft
   share → the cheapest capable model. Providers over their spend limit are left out.
3. Rules, first match wins (``RoutingRule`` rows, else :data:`DEFAULT_RULES`): a rule matches
   when all its conditions hold — any of its ``keywords`` as a whole word/phrase in the task,
   and/or the estimated context ≥ ``min_tokens`` — and it picks models of its ``tier`` and/or
   with its ``tag``. A rule whose selection finds no model is passed over (and said so).
4. No rule: the agent's model when a candidate serves it, else the provider's first model.

Candidates are the enabled providers of the kind the agent's engine speaks (``claude`` →
Anthropic-compatible, ``ollama`` → Ollama), with their key set, ordered healthy first, then by
``priority``, then by price. After the chosen model come fallbacks on *other* providers
(same selection first, then any model whose context fits), at most ``PROVIDER_MAX_ATTEMPTS`` in
all: failover moves along this list.

Token estimate: characters of input, history and system prompt divided by 4 (a common rule of
thumb for English and code; no tokenizer download).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable

from django.conf import settings

from core.errors import ApplicationError, InvalidInput

from . import health
from .budgets import BudgetState
from .pricing import model_price
from .registry import KIND_FOR_ENGINE, ModelInfo, ProviderInfo, Registry


@dataclass(frozen=True)
class Rule:
    name: str
    keywords: tuple[str, ...] = ()
    min_tokens: int | None = None
    tier: str = ""
    tag: str = ""
    description: str = ""

    def match(self, task: str, tokens: int) -> str | None:
        """The reason this rule matches, or None."""
        reasons = []
        if self.keywords:
            hit = next((k for k in self.keywords if _word(k).search(task)), None)
            if hit is None:
                return None
            reasons.append(f"keyword {hit!r}")
        if self.min_tokens is not None:
            if tokens < self.min_tokens:
                return None
            reasons.append(f"~{tokens} tokens >= {self.min_tokens}")
        return ", ".join(reasons) if reasons else None

    def selects(self, model: ModelInfo) -> bool:
        return (not self.tier or model.tier == self.tier) and (not self.tag or self.tag in model.tags)

    @property
    def wants(self) -> str:
        return " + ".join(p for p in (f"tier {self.tier}" if self.tier else "", f"tag {self.tag}" if self.tag else "") if p)


# The shipped rules (also in providers.yaml); used when no RoutingRule row exists.
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("long_context", min_tokens=50_000, tag="long_context", description="estimated context over 50K tokens"),
    Rule("simple", keywords=("lint", "linting", "format", "formatting", "reformat", "typo", "typos", "prettier",
                             "whitespace", "sort imports"), tier="fast", description="simple tasks"),
    Rule("code", keywords=("refactor", "refactoring", "rewrite", "restructure", "port", "migrate", "extract method",
                           "dead code"), tag="code", description="code-heavy refactoring"),
    Rule("top", keywords=("plan", "planning", "research", "review", "architecture", "design doc", "audit",
                          "threat model"), tier="top", description="planning, research and review"),
    Rule("complex", keywords=("multi-file", "multiple files", "across files", "several files", "complex",
                              "implement", "feature", "debug"), tier="balanced", description="multi-file or complex work"),
)


def _word(phrase: str) -> re.Pattern:
    return re.compile(r"(?<![\w-])" + re.escape(phrase.lower()).replace(r"\ ", r"[\s_-]+") + r"(?![\w-])", re.I)


def estimate_tokens(*texts: str) -> int:
    return sum(len(t or "") for t in texts) // 4


def routing_rules(registry: Registry) -> tuple[Rule, ...]:
    """The registry's RoutingRule rows (in order), or the built-in rules when there are none."""
    if not registry.rules:
        return DEFAULT_RULES
    return tuple(Rule(name=r["name"], keywords=tuple(str(k) for k in (r["keywords"] or [])), min_tokens=r["min_tokens"],
                      tier=r["tier"], tag=r["tag"], description=r["description"]) for r in registry.rules if r["enabled"])


@dataclass(frozen=True)
class Candidate:
    provider: ProviderInfo
    model: ModelInfo

    @property
    def ref(self) -> str:
        return f"{self.provider.name}/{self.model.name}"


@dataclass
class Decision:
    candidates: list[Candidate]
    notes: list[str] = field(default_factory=list)

    @property
    def rationale(self) -> str:
        return "; ".join(n for n in self.notes if n)


def _price_key(c: Candidate) -> Decimal:
    price = model_price(c.provider, c.model)
    return price.blended if price is not None else Decimal("1e9")  # unknown: ranked last by price


def route_providers(*, registry: Registry, engine: str, agent_model: str, task: str, tokens: int,
                    provider: str | None = None, model: str | None = None,
                    budget: BudgetState | None = None,
                    provider_over_limit: Callable[[ProviderInfo], str | None] = lambda p: None) -> Decision | None:
    """The candidates for a run, best first, with the rationale; None when no provider routing
    applies (an engine without providers, or no provider of its kind has its key: the caller
    keeps the engine's own fallback)."""
    notes: list[str] = []
    if provider:
        pinned = registry.get(provider)
        if pinned is None:
            raise InvalidInput(f"Unknown provider {provider!r}; known: {', '.join(registry.names())}.",
                               code="unknown_provider", extra={"providers": registry.names()})
        reason = pinned.unavailable_reason()
        if reason:
            raise ApplicationError(f"Provider {provider!r} is unavailable: {reason}.", code="provider_unavailable",
                                   status=503, extra={"provider": provider})
        pool = [pinned]
        notes.append(f"provider {provider} requested")
    else:
        kind = KIND_FOR_ENGINE.get(engine)
        if kind is None:
            return None
        pool = [p for p in registry.of_kind(kind) if not p.unavailable_reason()]
        if not pool:
            return None
    if budget is not None and budget.over:
        budget.refuse()
    # Spend limits.
    kept = []
    for p in pool:
        over = provider_over_limit(p)
        if over:
            notes.append(f"skipped {p.name} ({over})")
        else:
            kept.append(p)
    if not kept:
        from .budgets import budget_exceeded

        raise budget_exceeded("Every candidate provider is over its spend limit.", "; ".join(notes))
    pool = kept
    # Health: healthy first; cooling or unhealthy providers only when nothing else is left.
    healthy, sick = [], []
    for p in pool:
        why = health.skip_reason(p)
        (sick if why else healthy).append((p, why))
    for p, why in sick:
        notes.append(f"skipped {p.name} ({why})" if healthy else f"{p.name} {why}, tried anyway")
    ordered = [p for p, _ in healthy] + [p for p, _ in sorted(sick, key=lambda x: health.cooldown_until(x[0].name) or 0)]
    order = {p.name: i for i, p in enumerate(ordered)}

    def all_models(providers: list[ProviderInfo]) -> list[Candidate]:
        out = [Candidate(p, m) for p in providers for m in p.models]
        # A provider that lists no models but runs any (an Ollama) offers the agent's model.
        out += [Candidate(p, m) for p in providers if not p.models and p.open_models
                and (m := p.model(agent_model or p.default_model)) is not None]
        if len(out) < 2:
            return out  # nothing to order (one implicit provider with its one model: the common case)
        return sorted(out, key=lambda c: (order[c.provider.name], c.provider.priority, _price_key(c), c.model.name))

    everything = all_models(ordered)
    if not everything and not model:
        return None  # nothing to choose from: the engine's own configuration and fallback apply
    fits = [c for c in everything if c.model.context_window >= tokens] or everything
    chosen: Candidate | None = None
    selection: Callable[[Candidate], bool] = lambda c: True
    if model:
        # The catalogued model of that name, else (ACP's ``--model haiku``) the catalogued model
        # whose name contains it, else a provider that runs any model.
        served = [Candidate(p, m) for p in ordered for m in p.models if m.name == model] or \
            [c for c in everything if c.model.tier and model.lower() in c.model.name.lower()] or \
            [Candidate(p, m) for p in ordered if p.open_models and (m := p.model(model)) is not None]
        if not served:
            raise InvalidInput(f"No available provider serves model {model!r}.", code="unknown_model",
                               extra={"models": sorted({c.model.name for c in everything})})
        chosen = served[0]
        selection = lambda c, name=chosen.model.name: c.model.name == name  # noqa: E731
        shown = model if chosen.model.name == model else f"{model} ({chosen.model.name})"
        notes.append(f"model {shown} requested")
    elif budget is not None and budget.soft:
        chosen = min(fits, key=lambda c: (_price_key(c), order[c.provider.name]))
        notes.append(f"{budget.note}: cheapest capable model")
        selection = lambda c: True  # noqa: E731
    else:
        # Rules choose among catalogued models (with a tier); the environment's implicit
        # providers alone have none, and then the agent's model stands.
        catalogued = any(c.model.tier for c in everything)
        for rule in routing_rules(registry) if catalogued else ():
            why = rule.match(task, tokens)
            if why is None:
                continue
            picked = [c for c in fits if rule.selects(c.model)]
            if not picked:
                notes.append(f"rule {rule.name} ({why}) found no model with {rule.wants}")
                continue
            chosen = picked[0]
            selection = lambda c, r=rule: r.selects(c.model)  # noqa: E731
            notes.append(f"rule {rule.name} ({why}) -> {rule.wants}")
            break
        if chosen is None:
            served = [c for c in fits if c.model.name == agent_model] if agent_model else []
            if not served and agent_model:
                served = [Candidate(p, m) for p in ordered if p.open_models and (m := p.model(agent_model))]
            if served:
                chosen = served[0]
                notes.append(f"no rule matched: agent model {agent_model}")
            else:
                chosen = fits[0]
                notes.append("no rule matched: first available model")
    # Fallbacks: other providers, same selection first, then anything that fits.
    limit = max(1, int(settings.PROVIDER_MAX_ATTEMPTS))
    candidates = [chosen]
    used = {chosen.provider.name}
    if not provider:
        for group in ([c for c in fits if selection(c)], fits):
            for c in group:
                if len(candidates) >= limit:
                    break
                if c.provider.name not in used:
                    candidates.append(c)
                    used.add(c.provider.name)
    notes.insert(0, f"{chosen.ref}")
    if len(candidates) > 1:
        notes.append("fallbacks: " + ", ".join(c.ref for c in candidates[1:]))
    return Decision(candidates=candidates, notes=notes)

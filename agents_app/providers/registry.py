"""The provider registry: database rows plus the implicit providers the environment configures.

Everything here is plain frozen data read in one short burst (two queries), so the router and
``/v1/providers`` never hold ORM rows. Keys are read from the environment only when a run
connects (:meth:`ProviderInfo.target`) and never leave this process: not stored, not logged,
not shown.

Implicit providers keep the environment configuration working as before: ``anthropic`` (the
``ANTHROPIC_API_KEY``/``ANTHROPIC_AUTH_TOKEN``/``ANTHROPIC_BASE_URL``/``ANTHROPIC_MODEL``
settings) and ``ollama`` (``OLLAMA_URL``/``OLLAMA_MODEL``). A configured provider with the same
name replaces the implicit one. Implicit providers accept any model name (``open_models``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings

from core.refreshing_cache import RefreshingCache, seconds_setting

# Which engine runs a provider of each kind, and the reverse.
ENGINE_FOR_KIND = {"anthropic": "claude", "ollama": "ollama", "mock": "mock"}
KIND_FOR_ENGINE = {"claude": "anthropic", "ollama": "ollama"}
TIERS = ("fast", "balanced", "top")
IMPLICIT_PRIORITY = 1000

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str) -> str:
    """``${VAR}`` and ``${VAR:-default}`` in a base URL, from the environment."""
    return _VAR.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value or "")


@dataclass(frozen=True)
class ProviderTarget:
    """What an engine needs to reach one provider. ``api_key`` never appears in a repr."""

    name: str
    kind: str
    base_url: str | None
    api_key: str = field(default="", repr=False)
    bearer: bool = False
    # None: the engine's configured default (ANTHROPIC_MAX_RETRIES); 0 when the router fails over.
    max_retries: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    provider: str
    name: str
    tier: str = "balanced"
    context_window: int = 128_000
    tags: tuple[str, ...] = ()
    input_price: Decimal | None = None
    output_price: Decimal | None = None
    cache_read_price: Decimal | None = None
    cache_write_price: Decimal | None = None

    @property
    def ref(self) -> str:
        return f"{self.provider}/{self.name}"


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    kind: str
    base_url: str = ""
    api_key_env: str = ""
    auth: str = "x-api-key"
    priority: int = 100
    health_check: bool = True
    spend_limit: Decimal | None = None
    spend_period: str = "month"
    models: tuple[ModelInfo, ...] = ()
    implicit: bool = False
    open_models: bool = False
    default_model: str = ""

    @property
    def engine(self) -> str:
        return ENGINE_FOR_KIND.get(self.kind, "")

    def resolved_base_url(self) -> str | None:
        if self.base_url:
            return expand_env(self.base_url).rstrip("/") or None
        if self.kind == "anthropic":
            return settings.ANTHROPIC_BASE_URL or None
        if self.kind == "ollama":
            return settings.OLLAMA_URL
        return None

    def display_url(self) -> str:
        return self.resolved_base_url() or ("https://api.anthropic.com" if self.kind == "anthropic" else "")

    def _key(self) -> str:
        if self.implicit and self.kind == "anthropic":
            return settings.ANTHROPIC_API_KEY or ""
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def unavailable_reason(self) -> str | None:
        """Why this provider cannot take runs whatever its health (no key), or None."""
        if self.kind != "anthropic":
            return None
        if self.implicit:
            return None if settings.ANTHROPIC_API_KEY else "no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN configured"
        if not self.api_key_env:
            return "no api_key_env configured"
        return None if os.environ.get(self.api_key_env) else f"{self.api_key_env} is not set"

    def auth_headers(self) -> dict[str, str]:
        key = self._key()
        if not key:
            return {}
        return {"Authorization": f"Bearer {key}"} if self._bearer() else {"x-api-key": key}

    def _bearer(self) -> bool:
        if self.implicit and self.kind == "anthropic":
            return bool(getattr(settings, "ANTHROPIC_AUTH_IS_BEARER", False))
        return self.auth == "bearer"

    def target(self, *, max_retries: int | None = None) -> ProviderTarget:
        return ProviderTarget(name=self.name, kind=self.kind, base_url=self.resolved_base_url(), api_key=self._key(),
                              bearer=self._bearer(), max_retries=max_retries)

    def model(self, name: str) -> ModelInfo | None:
        for m in self.models:
            if m.name == name:
                return m
        if self.open_models and name:
            return ModelInfo(provider=self.name, name=name, tier="")
        return None


@dataclass(frozen=True)
class Registry:
    providers: tuple[ProviderInfo, ...]
    # RoutingRule rows as dicts, in order (empty: the built-in rules), and whether budgets exist.
    rules: tuple[dict, ...] = ()
    has_budgets: bool = False
    disabled: tuple[str, ...] = ()  # configured providers switched off (they hide their implicit namesake)

    def get(self, name: str) -> ProviderInfo | None:
        return next((p for p in self.providers if p.name == name), None)

    def of_kind(self, kind: str) -> list[ProviderInfo]:
        return [p for p in self.providers if p.kind == kind]

    def names(self) -> list[str]:
        return [p.name for p in self.providers]


def _implicit() -> list[ProviderInfo]:
    anthropic_model = settings.ANTHROPIC_MODEL
    ollama_model = settings.OLLAMA_MODEL
    return [
        ProviderInfo(name="anthropic", kind="anthropic", priority=IMPLICIT_PRIORITY, health_check=False,
                     implicit=True, open_models=True, default_model=anthropic_model,
                     models=(ModelInfo(provider="anthropic", name=anthropic_model, tier="", context_window=200_000),)),
        ProviderInfo(name="ollama", kind="ollama", priority=IMPLICIT_PRIORITY, implicit=True, open_models=True,
                     default_model=ollama_model, models=(ModelInfo(provider="ollama", name=ollama_model, tier=""),)),
    ]


def _dec(value) -> Decimal | None:
    return None if value is None else Decimal(value)


# The configured part of the registry (one key). Saving a provider, model, rule or budget, or
# loading the file, clears it in that process; other processes see a change within
# AGENT_CACHE_SECONDS (served once more while it reloads in the background:
# core/refreshing_cache.py).
_CACHE: RefreshingCache[Registry] = RefreshingCache(
    "provider registry", ttl=seconds_setting("AGENT_CACHE_SECONDS"))


def registry_cache_clear(*args, **kwargs) -> None:
    """Drop the cached registry (a provider, model, rule or budget was saved; the file was loaded)."""
    _CACHE.clear()


def provider_registry() -> Registry:
    """Enabled configured providers (with their enabled models), then implicit ones not shadowed.

    Cached for ``AGENT_CACHE_SECONDS`` like agent specs (a run's start burst stays short); saving
    a provider, model, rule or budget, or loading the file, clears it in that process. The
    implicit providers read the settings on every use, so they are never stale.
    """
    return _with_fresh_implicit(_CACHE.get("registry", _load_registry))


# (the cached registry, the settings the implicit providers read) -> the registry with them: the
# last one made, as long as neither changed (a run's start asks for the registry each time).
_FRESH: list[tuple[Registry, tuple[str, str], Registry]] = []


def _with_fresh_implicit(registry: Registry) -> Registry:
    from dataclasses import replace

    read = (settings.ANTHROPIC_MODEL, settings.OLLAMA_MODEL)
    last = _FRESH[0] if _FRESH else None
    if last is not None and last[0] is registry and last[1] == read:
        return last[2]
    configured = [p for p in registry.providers if not p.implicit]
    shadowed = {p.name for p in configured} | set(registry.disabled)
    fresh = replace(registry, providers=tuple(configured + [p for p in _implicit() if p.name not in shadowed]))
    _FRESH[:] = [(registry, read, fresh)]
    return fresh


def _load_registry() -> Registry:
    from agents_app.models import Budget, Provider, ProviderModel, RoutingRule

    rows = list(Provider.objects.filter(enabled=True).order_by("priority", "name"))
    models: dict[int, list[ModelInfo]] = {}
    for m in ProviderModel.objects.filter(enabled=True, provider__enabled=True).select_related("provider").order_by("name"):
        models.setdefault(m.provider_id, []).append(ModelInfo(
            provider=m.provider.name, name=m.name, tier=m.tier, context_window=m.context_window,
            tags=tuple(str(t) for t in (m.tags or [])), input_price=_dec(m.input_price),
            output_price=_dec(m.output_price), cache_read_price=_dec(m.cache_read_price),
            cache_write_price=_dec(m.cache_write_price)))
    configured = [ProviderInfo(
        name=p.name, kind=p.kind, base_url=p.base_url, api_key_env=p.api_key_env, auth=p.auth, priority=p.priority,
        health_check=p.health_check, spend_limit=_dec(p.spend_limit), spend_period=p.spend_period,
        models=tuple(models.get(p.pk, ())), default_model=(models.get(p.pk) or [ModelInfo("", "")])[0].name,
        # Ollama runs whatever model is pulled: an agent's model need not be listed.
        open_models=p.kind == "ollama" or p.any_model,
    ) for p in rows]
    # A configured provider replaces the implicit one of its name only while it can take runs:
    # the shipped file's `anthropic` (ANTHROPIC_API_KEY) must not hide a working
    # ANTHROPIC_AUTH_TOKEN configuration. Disabling it in the admin hides both.
    taken = {p.name for p in configured if not p.unavailable_reason()}
    taken |= set(Provider.objects.filter(enabled=False).values_list("name", flat=True))
    configured = [p for p in configured if p.name in taken or p.name not in {i.name for i in _implicit()}]
    rules = tuple(RoutingRule.objects.values("name", "keywords", "min_tokens", "tier", "tag", "description", "enabled"))
    return Registry(tuple(configured + [p for p in _implicit() if p.name not in taken]), rules=rules,
                    has_budgets=Budget.objects.filter(enabled=True).exists(),
                    disabled=tuple(Provider.objects.filter(enabled=False).values_list("name", flat=True)))

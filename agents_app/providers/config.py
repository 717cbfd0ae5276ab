"""The providers file (``PROVIDERS_FILE``, YAML) and its idempotent import.

Shape (see the shipped ``providers.yaml``)::

    providers:
      - name: anthropic
        kind: anthropic            # anthropic (any Anthropic-compatible Messages API) | ollama | mock
        base_url: https://api.anthropic.com     # ${VAR:-default} is expanded when used
        api_key_env: ANTHROPIC_API_KEY          # the variable's name, never the key
        auth: x-api-key                         # or bearer (Authorization: Bearer)
        priority: 10                            # lower first among equal candidates
        any_model: false                        # true: also accept names not listed (a gateway's own)
        health_check: true                      # probe GET /v1/models (Ollama: /api/tags)
        spend_limit: 50                         # USD per spend_period (day|week|month)
        models:
          - {name: claude-haiku-4-5, tier: fast, context_window: 200000, input_price: 1.0, output_price: 5.0, tags: [cheap]}
    routing:
      rules:
        - {name: simple, keywords: [lint, format], tier: fast}
    budgets:
      - {name: daily, period: day, max_cost: 5, soft_ratio: 0.8}         # every user
      - {name: alice, user: alice, period: day, max_tokens: 200000}

:func:`providers_load` makes the database match the file: rows it created earlier and no longer
lists are deleted, rows created in the admin are left alone (a file entry with the same name
takes the row over). Running it twice changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from core.errors import InvalidInput

from .registry import TIERS

_PROVIDER_KEYS = {"name", "kind", "base_url", "api_key_env", "auth", "priority", "enabled", "health_check", "any_model",
                  "spend_limit", "spend_period", "models"}
_MODEL_KEYS = {"name", "tier", "context_window", "tags", "input_price", "output_price", "cache_read_price",
               "cache_write_price", "enabled"}
_RULE_KEYS = {"name", "order", "description", "keywords", "min_tokens", "tier", "tag", "enabled"}
_BUDGET_KEYS = {"name", "user", "period", "max_tokens", "max_cost", "soft_ratio", "enabled"}
_PERIODS = ("day", "week", "month")


@dataclass(frozen=True)
class LoadResult:
    providers: int
    models: int
    rules: int
    budgets: int
    deleted: int


def _fail(where: str, message: str) -> InvalidInput:
    return InvalidInput(f"{where}: {message}", code="invalid_providers_file")


def _check_keys(where: str, item: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _fail(where, "must be a mapping")
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    if not isinstance(item.get("name"), str) or not item["name"].strip():
        raise _fail(where, "name is required")
    return item


def _decimal(where: str, value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise _fail(where, f"{value!r} is not a number") from None
    if d < 0:
        raise _fail(where, "must not be negative")
    return d


def _choice(where: str, value: Any, choices: tuple[str, ...], default: str) -> str:
    value = default if value is None else value
    if value not in choices:
        raise _fail(where, f"{value!r} is not one of {', '.join(choices)}")
    return value


def parse_providers_file(text: str, *, source: str = "providers file") -> dict[str, list[dict[str, Any]]]:
    """Validate the file; returns normalised providers, rules and budgets. Raises InvalidInput."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise _fail(source, f"not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise _fail(source, "the top level must be a mapping with providers:, routing:, budgets:")
    unknown = sorted(set(data) - {"providers", "routing", "budgets"})
    if unknown:
        raise _fail(source, f"unknown top-level key(s) {', '.join(unknown)}")
    providers, names = [], set()
    for i, raw in enumerate(data.get("providers") or []):
        p = _check_keys(f"providers[{i}]", raw, _PROVIDER_KEYS)
        where = f"provider {p['name']}"
        if p["name"] in names:
            raise _fail(where, "listed twice")
        names.add(p["name"])
        kind = _choice(where + " kind", p.get("kind"), ("anthropic", "ollama", "mock"), "anthropic")
        env = p.get("api_key_env") or ""
        if kind == "anthropic" and not env:
            raise _fail(where, "api_key_env is required for kind anthropic (the variable holding the key)")
        if env and not (isinstance(env, str) and env.replace("_", "a").isalnum() and not env[0].isdigit()):
            raise _fail(where, f"api_key_env {env!r} is not an environment variable name")
        models, model_names = [], set()
        for j, rawm in enumerate(p.get("models") or []):
            m = _check_keys(f"{where} models[{j}]", rawm, _MODEL_KEYS)
            mw = f"{where} model {m['name']}"
            if m["name"] in model_names:
                raise _fail(mw, "listed twice")
            model_names.add(m["name"])
            tags = m.get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise _fail(mw, "tags must be a list of strings")
            window = m.get("context_window", 128_000)
            if not isinstance(window, int) or window <= 0:
                raise _fail(mw, "context_window must be a positive integer")
            models.append({"name": m["name"], "tier": _choice(mw + " tier", m.get("tier"), TIERS, "balanced"),
                           "context_window": window, "tags": tags, "enabled": bool(m.get("enabled", True)),
                           **{k: _decimal(f"{mw} {k}", m.get(k)) for k in
                              ("input_price", "output_price", "cache_read_price", "cache_write_price")}})
        priority = p.get("priority", 100)
        if not isinstance(priority, int):
            raise _fail(where, "priority must be an integer")
        providers.append({
            "name": p["name"], "kind": kind, "base_url": p.get("base_url") or "", "api_key_env": env,
            "auth": _choice(where + " auth", p.get("auth"), ("x-api-key", "bearer"), "x-api-key"),
            "priority": priority, "enabled": bool(p.get("enabled", True)),
            "health_check": bool(p.get("health_check", True)), "any_model": bool(p.get("any_model", False)),
            "spend_limit": _decimal(where + " spend_limit", p.get("spend_limit")),
            "spend_period": _choice(where + " spend_period", p.get("spend_period"), _PERIODS, "month"),
            "models": models,
        })
    routing = data.get("routing") or {}
    if not isinstance(routing, dict):
        raise _fail("routing", "must be a mapping with rules:")
    rules = []
    for i, raw in enumerate(routing.get("rules") or []):
        r = _check_keys(f"routing.rules[{i}]", raw, _RULE_KEYS)
        where = f"rule {r['name']}"
        keywords = r.get("keywords") or []
        if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
            raise _fail(where, "keywords must be a list of words")
        if not keywords and r.get("min_tokens") is None:
            raise _fail(where, "needs keywords and/or min_tokens")
        if not r.get("tier") and not r.get("tag"):
            raise _fail(where, "needs a tier and/or a tag to select models")
        rules.append({"name": r["name"], "order": int(r.get("order", (i + 1) * 10)), "description": r.get("description") or "",
                      "keywords": keywords, "min_tokens": r.get("min_tokens"),
                      "tier": _choice(where + " tier", r.get("tier") or "", TIERS + ("",), ""),
                      "tag": r.get("tag") or "", "enabled": bool(r.get("enabled", True))})
    budgets = []
    for i, raw in enumerate(data.get("budgets") or []):
        b = _check_keys(f"budgets[{i}]", raw, _BUDGET_KEYS)
        where = f"budget {b['name']}"
        if b.get("max_tokens") is None and b.get("max_cost") is None:
            raise _fail(where, "needs max_tokens and/or max_cost")
        if b.get("max_tokens") is not None and (not isinstance(b["max_tokens"], int) or b["max_tokens"] < 0):
            raise _fail(where, "max_tokens must be a non-negative integer")
        ratio = _decimal(where + " soft_ratio", b.get("soft_ratio", 0.8))
        if ratio is None or ratio > 1:
            raise _fail(where, "soft_ratio must be between 0 and 1")
        budgets.append({"name": b["name"], "user": b.get("user"), "period": _choice(where + " period", b.get("period"), _PERIODS, "day"),
                        "max_tokens": b.get("max_tokens"), "max_cost": _decimal(where + " max_cost", b.get("max_cost")),
                        "soft_ratio": ratio, "enabled": bool(b.get("enabled", True))})
    return {"providers": providers, "rules": rules, "budgets": budgets}


def providers_load(*, path: Path | str) -> LoadResult:
    """Import the providers file into the database (idempotent). Raises InvalidInput."""
    from django.contrib.auth import get_user_model

    from agents_app.models import Budget, Provider, ProviderModel, RoutingRule

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(str(path), f"cannot read ({exc.strerror or exc})") from exc
    parsed = parse_providers_file(text, source=str(path))
    file_source = Provider.Source.FILE
    n_models = deleted = 0
    with transaction.atomic():
        for p in parsed["providers"]:
            models = p.pop("models")
            row, _ = Provider.objects.update_or_create(name=p["name"], defaults={**p, "source": file_source})
            keep = []
            for m in models:
                ProviderModel.objects.update_or_create(provider=row, name=m["name"], defaults=m)
                keep.append(m["name"])
                n_models += 1
            deleted += ProviderModel.objects.filter(provider=row).exclude(name__in=keep).delete()[0]
        deleted += Provider.objects.filter(source=file_source).exclude(
            name__in=[p["name"] for p in parsed["providers"]]).delete()[0]
        for r in parsed["rules"]:
            RoutingRule.objects.update_or_create(name=r["name"], defaults={**r, "source": file_source})
        deleted += RoutingRule.objects.filter(source=file_source).exclude(
            name__in=[r["name"] for r in parsed["rules"]]).delete()[0]
        users = get_user_model()
        for b in parsed["budgets"]:
            username = b.pop("user")
            user = None
            if username:
                user = users.objects.filter(**{users.USERNAME_FIELD: username}).first()
                if user is None:
                    raise _fail(f"budget {b['name']}", f"no user {username!r}")
            Budget.objects.update_or_create(name=b["name"], defaults={**b, "user": user, "source": file_source})
        deleted += Budget.objects.filter(source=file_source).exclude(
            name__in=[b["name"] for b in parsed["budgets"]]).delete()[0]
    from . import health
    from .registry import registry_cache_clear

    registry_cache_clear()  # queryset deletes send no signals
    health.reset_health()
    return LoadResult(providers=len(parsed["providers"]), models=n_models, rules=len(parsed["rules"]),
                      budgets=len(parsed["budgets"]), deleted=deleted)

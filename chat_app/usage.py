"""Usage and cost: what a finished run records, the sums ``/v1/usage`` reports, and the spend
figures budgets read (handed to the router as its :class:`SpendPort`)."""
from __future__ import annotations

from datetime import date, datetime, time as dt_time, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce, TruncDate

from agents_app.providers.pricing import cost_of, model_price, usage_tokens
from core.errors import InvalidInput

from .models import Run

if TYPE_CHECKING:
    from agents_app.engines import EngineResult

    from .executor import RunLaunch

GROUPS = {"provider": "provider", "model": "model", "agent": "agent__role", "conversation": "conversation_id",
          "day": "day"}


def run_cost_fields(launch: "RunLaunch", result: "EngineResult") -> dict[str, Any]:
    """The run's tokens and cost at today's price for where it actually ran (after failover)."""
    tokens = usage_tokens(result.usage or {})
    provider, model = result.provider or launch.provider, result.model or launch.model
    info = None
    for candidate, name in getattr(launch.route, "candidates", ()) or ():
        if candidate.name == provider:
            info = candidate
            break
    price = None
    if info is not None:
        model_info = info.model(model)
        price = model_price(info, model_info) if model_info is not None else None
    elif launch.engine in ("mock",) or provider in ("local", "ollama"):
        from agents_app.providers.pricing import FREE

        price = FREE
    return {"provider": provider, "model": model, **tokens, "cost": cost_of(tokens, price),
            "pricing": price.to_dict() if price is not None else {"source": "unknown"}}


class RunSpend:
    """The router's view of recorded spend (agents_app.providers.budgets.SpendPort)."""

    def user_usage(self, *, user: Any, since: datetime) -> tuple[int, Decimal]:
        row = Run.objects.filter(conversation__owner=user, started_at__gte=since).aggregate(
            tokens=Coalesce(Sum(F("input_tokens") + F("output_tokens")), 0), cost=Coalesce(Sum("cost"), Decimal(0)))
        return int(row["tokens"]), Decimal(row["cost"])

    def provider_spend(self, *, provider: str, since: datetime) -> Decimal:
        row = Run.objects.filter(provider=provider, started_at__gte=since).aggregate(cost=Coalesce(Sum("cost"), Decimal(0)))
        return Decimal(row["cost"])


def _parse_day(name: str, value: str | None) -> date | None:
    if value in (None, ""):
        return None
    try:
        return date.fromisoformat(value) if len(value) <= 10 else datetime.fromisoformat(value).date()
    except ValueError:
        raise InvalidInput(f"{name} must be a date (YYYY-MM-DD), got {value!r}.", code="invalid_date") from None


def usage_report(*, user: Any, group_by: str = "provider", date_from: str | None = None,
                 date_to: str | None = None) -> dict[str, Any]:
    """Sums of tokens, cost and runs per group; the caller's runs (staff: everyone's).

    ``from``/``to`` are UTC dates, both inclusive. Raises InvalidInput for a bad group or date.
    """
    if group_by not in GROUPS:
        raise InvalidInput(f"group_by must be one of {', '.join(GROUPS)}.", code="invalid_group_by",
                           extra={"allowed": list(GROUPS)})
    start, end = _parse_day("from", date_from), _parse_day("to", date_to)
    if start and end and start > end:
        raise InvalidInput("from is after to.", code="invalid_date")
    rows = Run.objects.all()
    if not getattr(user, "is_staff", False):
        rows = rows.filter(conversation__owner=user)
    if start:
        rows = rows.filter(started_at__gte=datetime.combine(start, dt_time.min, tzinfo=dt_timezone.utc))
    if end:
        rows = rows.filter(started_at__lt=datetime.combine(end + timedelta(days=1), dt_time.min, tzinfo=dt_timezone.utc))
    if group_by == "day":
        rows = rows.annotate(day=TruncDate("started_at", tzinfo=dt_timezone.utc))
    key = GROUPS[group_by]
    sums = rows.values(key).annotate(
        runs=Count("id"), failed=Count("id", filter=Q(status=Run.Status.FAILED)),
        input_tokens_sum=Coalesce(Sum("input_tokens"), 0), output_tokens_sum=Coalesce(Sum("output_tokens"), 0),
        cache_read_sum=Coalesce(Sum("cache_read_tokens"), 0), cache_write_sum=Coalesce(Sum("cache_write_tokens"), 0),
        cost_sum=Coalesce(Sum("cost"), Decimal(0)),
    ).order_by(key)
    groups = []
    total = {"runs": 0, "inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0, "cacheWriteTokens": 0,
             "cost": Decimal(0)}
    for r in sums:
        value = r[key]
        item = {"key": None if value is None else str(value), "runs": r["runs"], "failedRuns": r["failed"],
                "inputTokens": r["input_tokens_sum"], "outputTokens": r["output_tokens_sum"],
                "cacheReadTokens": r["cache_read_sum"], "cacheWriteTokens": r["cache_write_sum"],
                "cost": str(Decimal(r["cost_sum"]).quantize(Decimal("0.000001")))}
        groups.append(item)
        total["runs"] += r["runs"]
        total["inputTokens"] += r["input_tokens_sum"]
        total["outputTokens"] += r["output_tokens_sum"]
        total["cacheReadTokens"] += r["cache_read_sum"]
        total["cacheWriteTokens"] += r["cache_write_sum"]
        total["cost"] += Decimal(r["cost_sum"])
    total["cost"] = str(Decimal(total["cost"]).quantize(Decimal("0.000001")))
    return {"groupBy": group_by, "from": start.isoformat() if start else None, "to": end.isoformat() if end else None,
            "scope": "all" if getattr(user, "is_staff", False) else "own", "currency": "USD",
            "groups": groups, "total": total}

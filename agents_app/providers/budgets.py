"""Budgets: per-user token/cost budgets and per-provider spend limits over a period.

A :class:`~agents_app.models.Budget` applies to one user, or (``user`` blank) to every user
separately. Its period (``day``/``week``/``month``) is the current calendar period in UTC. Usage
is what the user's finished runs recorded (tokens in + out, cost). From ``soft_ratio`` of a limit
on, routing takes the cheapest capable model; at the limit, runs are refused with HTTP 429
``budget_exceeded``. A provider's ``spend_limit`` (USD per its ``spend_period``, all users)
takes it out of routing when reached; when every candidate is out, the run is refused the same way.

Usage totals come from the run records (chat_app), handed in as a :class:`SpendPort` because
agents_app does not import chat_app.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import Any, Protocol

from core.errors import ApplicationError


class SpendPort(Protocol):
    def user_usage(self, *, user: Any, since: datetime) -> tuple[int, Decimal]: ...

    def provider_spend(self, *, provider: str, since: datetime) -> Decimal: ...


def period_start(period: str, now: datetime | None = None) -> datetime:
    now = now or datetime.now(dt_timezone.utc)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return day


def budget_exceeded(message: str, detail: str = "") -> ApplicationError:
    return ApplicationError(message + (f" ({detail})" if detail else ""), code="budget_exceeded", status=429)


@dataclass
class BudgetState:
    over: bool = False
    soft: bool = False
    note: str = ""

    def refuse(self) -> None:
        raise budget_exceeded(f"Budget exceeded: {self.note}.")


def budget_state(*, user: Any, spend: SpendPort) -> BudgetState | None:
    """The tightest of the user's budgets, or None when none applies."""
    from django.db.models import Q

    from agents_app.models import Budget

    if user is None or not getattr(user, "pk", None):
        return None
    budgets = list(Budget.objects.filter(Q(user__isnull=True) | Q(user=user), enabled=True))
    if not budgets:
        return None
    state = BudgetState()
    worst = Decimal(-1)
    for b in budgets:
        tokens, cost = spend.user_usage(user=user, since=period_start(b.period))
        for used, limit, unit in ((Decimal(tokens), b.max_tokens, "tokens"), (cost, b.max_cost, "USD")):
            if limit is None:
                continue
            limit = Decimal(limit)
            share = used / limit if limit > 0 else Decimal(1)
            if share <= worst:
                continue
            worst = share
            shown = f"{used:.4f}" if unit == "USD" else str(int(used))
            state.note = f"budget {b.name}: {shown} of {limit.normalize():f} {unit} this {b.period} ({share:.0%})"
            state.over = share >= 1
            state.soft = not state.over and share >= Decimal(b.soft_ratio)
    return state if (state.over or state.soft) else BudgetState(note=state.note)


def provider_over_limit(spend: SpendPort):
    def check(info) -> str | None:
        if info.spend_limit is None:
            return None
        spent = spend.provider_spend(provider=info.name, since=period_start(info.spend_period))
        if spent >= info.spend_limit:
            return f"spend limit {info.spend_limit.normalize():f} USD this {info.spend_period} reached: {spent:.4f}"
        return None

    return check

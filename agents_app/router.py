"""The router: picks the engine, provider and model for a run. Engines never pick for themselves.

Order: an explicit ``engine``/``model`` override on the request, else the agent's setting, else
the engine's default model. An engine that cannot run here (e.g. ``claude`` without an API key)
falls back to its declared fallback (``mock``), with a warning logged once per process and a
note recorded on the run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from core.errors import InvalidInput

from .engines import engine_names, get_engine
from .models import Agent

logger = logging.getLogger("orchestrator.router")
_warned: set[str] = set()


@dataclass(frozen=True)
class Route:
    engine: str
    provider: str
    model: str
    note: str = ""


def route_run(*, agent: Agent, engine: str | None = None, model: str | None = None) -> Route:
    requested = engine or agent.engine
    engine_cls = get_engine(requested)
    if engine_cls is None:
        raise InvalidInput(
            f"Unknown engine {requested!r}; available: {', '.join(engine_names())}.",
            code="unknown_engine",
            extra={"engines": engine_names()},
        )
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

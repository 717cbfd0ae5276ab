"""Engine registry. Each engine is one module here; importing it registers it."""
from __future__ import annotations

import importlib
import logging
import threading

from .base import Engine, EngineContext, EngineError, EngineResult, registered_engines

logger = logging.getLogger("orchestrator.engines")

# Optional engines import only when their extra is installed; a failed import leaves them out.
_BUILTIN = ["mock", "claude", "ollama"]
_OPTIONAL = ["claude_agent_sdk"]
_loaded = False
_load_lock = threading.RLock()


def _load() -> None:
    global _loaded
    if _loaded:
        return
    # Request threads may ask at the same time: none may see a half-filled registry.
    with _load_lock:
        if not _loaded:
            _import_engines()
            _loaded = True


def _import_engines() -> None:
    for name in _BUILTIN:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    for name in _OPTIONAL:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ImportError as exc:
            logger.debug("optional engine %s not available: %s", name, exc)


def get_engine(name: str) -> type[Engine] | None:
    _load()
    return registered_engines().get(name)


def engine_names() -> list[str]:
    _load()
    return sorted(registered_engines())


def all_engines() -> dict[str, type[Engine]]:
    _load()
    return dict(sorted(registered_engines().items()))


__all__ = ["Engine", "EngineContext", "EngineError", "EngineResult", "get_engine", "engine_names", "all_engines"]

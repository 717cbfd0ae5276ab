"""Registration by subclassing, shared by the tool and engine registries."""
from __future__ import annotations

import re
from typing import Any


def register_subclass(registry: dict[str, Any], cls: type, *, kind: str, pattern: re.Pattern[str]) -> None:
    """Add ``cls`` under its ``name`` unless it sets ``register = False`` in its own body.

    Raises:
        ValueError: the name does not match ``pattern``, or another class already has it.
    """
    if not cls.__dict__.get("register", True):
        return
    name = getattr(cls, "name", "") or ""
    if not pattern.match(name):
        raise ValueError(f"invalid {kind} name {name!r} on {cls.__qualname__}")
    if registry.get(name, cls) is not cls:
        raise ValueError(f"{kind} {name!r} registered twice")
    registry[name] = cls

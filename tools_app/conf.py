"""Settings access that also works when Django settings are not configured (plain unit tests)."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def setting(name: str, default: Any) -> Any:
    """Return ``settings.<name>``, or ``default`` when unset or when Django is not configured."""
    try:
        return getattr(settings, name, default)
    except ImproperlyConfigured:
        return default

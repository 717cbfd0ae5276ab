"""Work that blocks (the network, another thread) refuses to run on the event loop, as the ORM does."""
from __future__ import annotations

import asyncio
import os

from django.core.exceptions import SynchronousOnlyOperation


def refuse_on_event_loop(message: str, *, escape_hatch: bool = True) -> None:
    """Raise Django's ``SynchronousOnlyOperation`` when called on a running event loop.

    Callers that try their work on the loop first (``AsyncApiView.burst``) catch it and run the
    work again in a thread. ``escape_hatch``: honour ``DJANGO_ALLOW_ASYNC_UNSAFE`` as Django
    does (never for a wait that the loop itself must end: it would wait on itself).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if escape_hatch and os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    raise SynchronousOnlyOperation(message)

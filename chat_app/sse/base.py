"""What every SSE dialect shares: the response, keep-alive pings, launching from a sync view.

SSE views are DRF views (auth, parsing, errors and the OpenAPI schema stay uniform) that return
a ``StreamingHttpResponse`` over an *async* iterator, so under ASGI each event is sent as it is
produced. The run itself is launched on the server's event loop (``launch_run``), so it belongs
to the server: a client that goes away stops reading, and the run goes on unless the dialect
cancels it.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

from chat_app.events import RecordedEvent

SSE_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}


class EventStreamRenderer(BaseRenderer):
    """Lets DRF content negotiation accept ``Accept: text/event-stream`` on streaming views."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        # Only errors are rendered through DRF on these views; send them as one SSE error event.
        return f"event: error\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def sse_frame(data: Any, *, event: str | None = None, id: Any = None, retry: int | None = None) -> str:
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event:
        lines.append(f"event: {event}")
    if retry is not None:
        lines.append(f"retry: {retry}")
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    lines.extend(f"data: {line}" for line in payload.split("\n"))
    return "\n".join(lines) + "\n\n"


def event_stream_response(body: AsyncIterator[str], *, headers: dict[str, str] | None = None,
                          content_type: str = "text/event-stream; charset=utf-8") -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type=content_type)
    for key, value in {**SSE_HEADERS, **(headers or {})}.items():
        response[key] = value
    return response


async def with_pings(source: AsyncIterator[RecordedEvent], interval: float) -> AsyncIterator[RecordedEvent | None]:
    """Yields the source's events, and ``None`` whenever ``interval`` seconds pass without one."""
    iterator = source.__aiter__()
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except (RuntimeError, asyncio.CancelledError):
                pass


def launch_run(created: Any) -> None:
    """Start a created run on the server's event loop from a sync (DRF) view."""
    from chat_app.services import run_launch

    async_to_sync(run_launch)(run=created.run)

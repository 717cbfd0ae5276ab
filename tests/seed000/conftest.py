"""Seed-000 fixtures: the Claude engine pointed at the scripted Anthropic server, stream readers."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import AsyncClient

ANALYST = "dev_efficiency_analyst"
MODEL = "saas/claude-sonnet-4.5"


@pytest.fixture
def analyst_workspace(agents) -> Path:
    path = agents[ANALYST].workspace_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def parse_sse(raw: str) -> list[dict[str, Any]]:
    """Seed-000 frames: exactly ``data: <json>`` blocks separated by a blank line (pings skipped)."""
    assert raw.endswith("\n\n"), raw[-200:]
    events = []
    for frame in raw.split("\n\n")[:-1]:
        if frame.startswith(":"):
            continue
        assert frame.startswith("data: ") and "\n" not in frame, frame
        events.append(json.loads(frame[len("data: "):]))
    return events


async def post_stream(token: str, body: Any, *, raw_body: str | None = None):
    """POST /api/v1/chat/stream through the ASGI handler; returns (response, events or JSON)."""
    client = AsyncClient()
    response = await client.post(
        "/api/v1/chat/stream",
        data=raw_body if raw_body is not None else json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Token {token}"},
    )
    if not response.streaming:
        return response, json.loads(response.content)
    chunks = [chunk async for chunk in response.streaming_content]
    text = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    return response, parse_sse(text)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]

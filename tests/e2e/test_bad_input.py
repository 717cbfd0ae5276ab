"""Bad input on every POST endpoint of the real server: a JSON {code, message} error, never a 500.

Each malformed body is sent as JSON, as text and as a form; a request that happens to be valid
(the server accepts odd-but-legal input) must stream or answer normally instead.
"""
from __future__ import annotations

import pytest
import requests

BODIES = [
    "[]", '"text"', "123", "null", "{bad json", '{"input": 5}', '{"input": ""}', '{"messages": 5}',
    '{"messages": [1, 2]}', '{"content": null}', '{"agent_role": [], "message": {}}', '{"title": {"a": 1}}',
    '{"input": "x", "conversationId": 7}', '{"input": "x", "conversationId": "not-a-uuid"}',
    '{"input": "x", "engine": "warp-drive"}', '{"id": 5, "messages": [{"role": "user", "parts": 3}]}',
    '{"messages": [{"role": "assistant", "parts": [{"type": "tool-x", "state": "approval-responded", "approval": 5}]}]}',
    '{"content": "hi", "mcpServers": "x"}', '{"content": "hi", "mcpServers": [{"name": "a"}]}',
    '{"agent_role": "coder", "message": "hi", "conversation_history": [{"role": "robot", "content": 1}]}',
]
CONTENT_TYPES = ["application/json", "text/plain", "application/x-www-form-urlencoded"]


@pytest.fixture(scope="module")
def paths(daphne_server) -> list[str]:
    conversation = requests.post(f"{daphne_server.url}/v1/conversations", headers=daphne_server.auth, timeout=10).json()
    return [
        "/v1/conversations", "/v1/agent/chat", "/v1/agent/chat?format=vercel-ai", "/v1/agent/chat?format=nope",
        "/api/v1/chat/stream", "/chat", f"/conversations/{conversation['id']}/messages/stream",
        "/v1/tool-confirmations/abc/approve", "/v1/tool-confirmations/00000000-0000-0000-0000-000000000000/deny",
        "/v1/agent/runs/abc/cancel", "/v1/agent/runs/abc/events", "/health",
    ]


def test_bad_input_never_500_or_html(daphne_server, paths):
    problems = []
    for path in paths:
        for body in BODIES:
            for content_type in CONTENT_TYPES:
                with requests.post(daphne_server.url + path, data=body.encode(), stream=True, timeout=20,
                                   headers={**daphne_server.auth, "Content-Type": content_type}) as response:
                    kind = response.headers.get("Content-Type", "")
                    if response.status_code >= 500 or not kind.startswith(("application/json", "text/event-stream")):
                        problems.append((path, body, content_type, response.status_code, kind))
                    elif kind.startswith("application/json") and response.status_code >= 400:
                        error = response.json()
                        if not (isinstance(error.get("code"), str) and isinstance(error.get("message"), str)):
                            problems.append((path, body, content_type, response.status_code, error))
    assert problems == []

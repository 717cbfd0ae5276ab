"""Seed 000 end to end: daphne on a free port, ``POST /api/v1/chat/stream`` over real HTTP."""
from __future__ import annotations

import json
import time

import requests

from tests.fakes.anthropic_server import FakeAnthropicServer, stall, text_reply


def _frames(response: requests.Response):
    """Seed-000 events as they arrive (``data: <json>`` blocks; ``: ping`` comments skipped)."""
    buffer = ""
    for chunk in response.iter_content(chunk_size=None, decode_unicode=True):
        buffer += chunk
        while "\n\n" in buffer:
            frame, buffer = buffer.split("\n\n", 1)
            if frame.startswith(":"):
                continue
            assert frame.startswith("data: ") and "\n" not in frame, frame
            yield json.loads(frame[len("data: "):])


def test_e2e_chat_stream_over_real_http_on_mock_engine(daphne_server):
    response = requests.post(
        f"{daphne_server.url}/api/v1/chat/stream",
        json={"agent_role": "coder", "message": "hello over the wire",
              "conversation_history": [{"role": "user", "content": "before"}]},
        headers=daphne_server.auth, stream=True, timeout=30,
    )
    with response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
        assert "no-cache" in response.headers["Cache-Control"]
        assert "Content-Encoding" not in response.headers
        events = list(_frames(response))
    assert [e["type"] for e in events][-1] == "done"
    assert {e["type"] for e in events[:-1]} == {"content_delta"}
    text = "".join(e["content"] for e in events[:-1])
    assert text == events[-1]["content"] == "Mock reply from coder: hello over the wire"
    assert events[-1]["run_id"] and events[-1]["conversation_id"]

    health = requests.get(f"{daphne_server.url}/health", timeout=5).json()
    assert health["status"] == "ok" and health["agent_count"] == 4

    bad = requests.post(f"{daphne_server.url}/api/v1/chat/stream", json={"agent_role": "ghost", "message": "x"},
                        headers=daphne_server.auth, timeout=10)
    assert bad.status_code == 404 and "coder" in bad.json()["valid_roles"]


def test_e2e_chat_stream_is_not_buffered_against_fake_anthropic(start_daphne_server):
    """The first delta reaches the client while the provider is still stalled mid-answer."""
    with FakeAnthropicServer() as provider:
        reply = stall(text_reply(["First ", "second"]))
        provider.script(reply)
        server = start_daphne_server(env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": provider.url,
                                        "ANTHROPIC_MODEL": "saas/claude-sonnet-4.5", "ANTHROPIC_MAX_RETRIES": "0"})
        response = requests.post(f"{server.url}/api/v1/chat/stream",
                                 json={"agent_role": "dev_efficiency_analyst", "message": "hi"},
                                 headers=server.auth, stream=True, timeout=30)
        with response:
            assert response.status_code == 200
            frames = _frames(response)
            first = next(frames)
            assert first == {"type": "content_delta", "content": "First "}
            assert not reply.release.is_set()  # the provider is still holding the rest back
            time.sleep(0.1)
            reply.release.set()
            rest = list(frames)
        assert rest[-1]["type"] == "done" and rest[-1]["content"] == "First second"
        request = provider.requests[0]
        assert request.json["model"] == "saas/claude-sonnet-4.5" and request.api_key == "test-key"

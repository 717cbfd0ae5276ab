"""Self-tests: real `requests` clients parse FakeOllamaServer's output."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from .fixtures import ollama_server  # noqa: F401  (fixture)
from .ollama_server import (
    FakeOllamaServer,
    action,
    action_json,
    disconnect,
    error,
    model_not_found,
    reply,
    stall,
    stream_error,
)

@pytest.fixture(autouse=True)
def _isolated_settings():
    """These self-tests never touch Django: shadow the project-wide autouse settings
    fixture so they also run with ``-p no:django``."""
    yield None


MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


def chat(server, timeout=5, **body):
    body.setdefault("model", "llama3.2")
    body.setdefault("messages", MSGS)
    return requests.post(f"{server.url}/api/chat", json=body, stream=True, timeout=timeout)


def test_streaming_ndjson_with_iter_lines(ollama_server):  # noqa: F811
    ollama_server.script(reply("Hello, world!", chunks=4, prompt_eval_count=21, eval_count=9))
    resp = chat(ollama_server, options={"temperature": 0.1}, format="json")  # stream omitted -> streams
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert len(lines) == 5
    for line in lines[:-1]:
        assert line["done"] is False and line["model"] == "llama3.2"
        assert line["message"]["role"] == "assistant" and line["created_at"].endswith("Z")
    assert "".join(line["message"]["content"] for line in lines[:-1]) == "Hello, world!"
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["prompt_eval_count"] == 21 and final["eval_count"] == 9 and final["total_duration"] > 0

    (req,) = ollama_server.requests
    assert req.method == "POST" and req.path == "/api/chat"
    assert req.json["model"] == "llama3.2" and req.json["messages"] == MSGS
    assert req.json["options"] == {"temperature": 0.1} and req.json["format"] == "json"
    assert "stream" not in req.json


def test_non_streaming(ollama_server):  # noqa: F811
    ollama_server.script(reply("whole answer", chunks=3, model="served-model"))
    resp = requests.post(
        f"{ollama_server.url}/api/chat", json={"model": "m", "messages": MSGS, "stream": False}, timeout=5
    )
    body = resp.json()
    assert body["message"] == {"role": "assistant", "content": "whole answer"}
    assert body["done"] is True and body["done_reason"] == "stop" and body["model"] == "served-model"
    assert body["eval_count"] == 3


def test_action_reply_is_parseable_json(ollama_server):  # noqa: F811
    ollama_server.script(
        action(thought="use a tool", action="tool", tool="read_file", args={"path": "/x"}),
        action(thought="done", answer="42"),
        action(thought="ask", action="delegate", target_agent="coder", chunks=1),
    )
    contents = []
    for _ in range(3):
        lines = [json.loads(x) for x in chat(ollama_server).iter_lines() if x]
        contents.append(json.loads("".join(x["message"]["content"] for x in lines)))
    assert contents[0] == {"thought": "use a tool", "action": "tool", "tool": "read_file", "args": {"path": "/x"}}
    assert contents[1] == {"thought": "done", "action": "final", "answer": "42"}
    assert contents[2] == {"thought": "ask", "action": "delegate", "target_agent": "coder"}
    assert json.loads(action_json("t", extra_field=None)) == {"thought": "t", "action": "final", "extra_field": None}


def test_tool_calls_are_passed_through(ollama_server):  # noqa: F811
    calls = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    ollama_server.script(reply("", tool_calls=calls), reply("x", tool_calls=calls))
    lines = [json.loads(x) for x in chat(ollama_server).iter_lines() if x]
    assert lines[0]["message"]["tool_calls"] == calls and lines[-1]["done"] is True
    body = chat(ollama_server, stream=False).json()
    assert body["message"]["tool_calls"] == calls


def test_tags(ollama_server):  # noqa: F811
    ollama_server.models = ["gpt-oss-20b:latest", "llama3.2:latest"]
    body = requests.get(f"{ollama_server.url}/api/tags", timeout=5).json()
    assert [m["name"] for m in body["models"]] == ["gpt-oss-20b:latest", "llama3.2:latest"]
    assert all(m["model"] == m["name"] and "details" in m for m in body["models"])
    ollama_server.tags_error = error(500, "tags broken")
    resp = requests.get(f"{ollama_server.url}/api/tags", timeout=5)
    assert resp.status_code == 500 and resp.json() == {"error": "tags broken"}
    assert ollama_server.pending == 0  # /api/tags never consumes the chat script


def test_http_errors(ollama_server):  # noqa: F811
    ollama_server.script(model_not_found(), error(500, "llama runner process has terminated"))
    resp = chat(ollama_server, model="missing:7b")
    assert resp.status_code == 404 and resp.json() == {"error": "model 'missing:7b' not found"}
    resp = chat(ollama_server)
    assert resp.status_code == 500 and resp.json() == {"error": "llama runner process has terminated"}
    with pytest.raises(requests.HTTPError):
        resp.raise_for_status()


def test_missing_model_is_400_and_not_consumed(ollama_server):  # noqa: F811
    ollama_server.script(reply("kept"))
    resp = requests.post(f"{ollama_server.url}/api/chat", json={"messages": MSGS}, timeout=5)
    assert resp.status_code == 400 and resp.json() == {"error": "model is required"}
    assert ollama_server.pending == 1


def test_mid_stream_error_line(ollama_server):  # noqa: F811
    ollama_server.script(stream_error("out of memory"))
    resp = chat(ollama_server)
    assert resp.status_code == 200
    lines = [json.loads(x) for x in resp.iter_lines() if x]
    assert lines[-1] == {"error": "out of memory"} and lines[0]["done"] is False
    assert not any(line.get("done") for line in lines)


def test_default_reply_and_strict_mode(ollama_server):  # noqa: F811
    body = chat(ollama_server, stream=False).json()
    assert body["message"]["content"] == "OK"
    assert len(ollama_server.unscripted_requests) == 1
    with FakeOllamaServer(default=None) as strict:
        resp = chat(strict)
        assert resp.status_code == 500 and "no scripted response" in resp.json()["error"]


def test_repeated_response_times(ollama_server):  # noqa: F811
    ollama_server.script(error(503, "busy", times=2), reply("ok now"))
    assert [chat(ollama_server).status_code for _ in range(2)] == [503, 503]
    assert chat(ollama_server, stream=False).json()["message"]["content"] == "ok now"


def test_stall_trips_read_timeout_and_close_is_fast():
    server = FakeOllamaServer().start()
    try:
        server.script(stall())
        with pytest.raises(requests.exceptions.ReadTimeout):
            chat(server, timeout=0.3, stream=False)
        server.script(stall())
        resp = chat(server, timeout=0.3)
        lines = resp.iter_lines()
        assert json.loads(next(lines))["done"] is False
        with pytest.raises(requests.exceptions.ConnectionError):  # urllib3 read timeout while streaming
            next(lines)
    finally:
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 2


def test_stall_then_release(ollama_server):  # noqa: F811
    release = threading.Event()
    ollama_server.script(reply("abc", chunks=3).with_stall(after=2, release=release))
    resp = chat(ollama_server)
    lines = resp.iter_lines()
    first = [json.loads(next(lines)) for _ in range(2)]
    release.set()
    rest = [json.loads(x) for x in lines if x]
    assert "".join(x["message"]["content"] for x in first + rest) == "abc" and rest[-1]["done"] is True


def test_disconnect_mid_stream(ollama_server):  # noqa: F811
    ollama_server.script(disconnect())
    resp = chat(ollama_server)
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        list(resp.iter_lines())


def test_wait_for_requests_from_another_thread(ollama_server):  # noqa: F811
    ollama_server.script(reply("x"))
    t = threading.Thread(target=lambda: chat(ollama_server, stream=False))
    t.start()
    reqs = ollama_server.wait_for_requests(1, timeout=5)
    t.join(5)
    assert reqs[0].path == "/api/chat"
    with pytest.raises(TimeoutError):
        ollama_server.wait_for_requests(2, timeout=0.05)


def test_version_and_root(ollama_server):  # noqa: F811
    assert requests.get(ollama_server.url, timeout=5).text == "Ollama is running"
    assert "version" in requests.get(f"{ollama_server.url}/api/version", timeout=5).json()


def test_bad_script_entry_is_reported(ollama_server):  # noqa: F811
    ollama_server.script(object())
    resp = chat(ollama_server, stream=False)
    assert resp.status_code == 500 and "fake server error" in resp.json()["error"]
    assert isinstance(ollama_server.errors[0], TypeError)

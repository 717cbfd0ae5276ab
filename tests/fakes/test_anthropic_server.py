"""Self-tests: the real anthropic SDK (2.12.0) parses FakeAnthropicServer's output."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time

import anthropic
import httpx2
import pytest
import pytest_asyncio

from .anthropic_server import (
    FakeAnthropicServer,
    disconnect,
    http_error,
    max_tokens_reply,
    message_reply,
    mid_stream_error,
    raw_stream,
    stall,
    text_block,
    text_reply,
    tool_use_block,
    tool_use_reply,
)
from .fixtures import anthropic_server  # noqa: F401  (fixture)

@pytest.fixture(autouse=True)
def _isolated_settings():
    """These self-tests never touch Django: shadow the project-wide autouse settings
    fixture so they also run with ``-p no:django``."""
    yield None


MODEL = "claude-test-model"
USER = [{"role": "user", "content": "hi"}]


def client_for(server: FakeAnthropicServer, **kwargs) -> anthropic.AsyncAnthropic:
    kwargs.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(api_key="test-key", base_url=server.url, **kwargs)


@pytest_asyncio.fixture
async def make_client():
    """Build AsyncAnthropic clients bound to a fake server; closed after the test."""
    made: list[anthropic.AsyncAnthropic] = []

    def make(server: FakeAnthropicServer, **kwargs) -> anthropic.AsyncAnthropic:
        made.append(client_for(server, **kwargs))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def stream_final(client: anthropic.AsyncAnthropic, **kwargs):
    """Stream a request, return (event types seen, final message)."""
    seen = []
    async with client.messages.stream(model=MODEL, max_tokens=256, messages=USER, **kwargs) as s:
        async for event in s:
            seen.append(event.type)
        final = await s.get_final_message()
    return seen, final


def raw_post(server: FakeAnthropicServer, body: dict, headers: dict | None = None):
    """POST with http.client and return (status, headers, raw body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        hdrs = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
        hdrs.update(headers or {})
        conn.request("POST", "/v1/messages", body=json.dumps(body), headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def parse_sse(raw: bytes) -> list[tuple[str, dict]]:
    frames = raw.decode("utf-8").split("\n\n")
    assert frames[-1] == "", "stream must end with a blank line"
    out = []
    for frame in frames[:-1]:
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


# ---------------------------------------------------------------------------
# wire format
# ---------------------------------------------------------------------------


def test_raw_sse_wire_format_is_exact():
    with FakeAnthropicServer() as server:
        server.script(text_reply(["Hel", "lo"], usage={"input_tokens": 7, "output_tokens": 3}))
        status, headers, raw = raw_post(server, {"model": MODEL, "max_tokens": 5, "messages": USER, "stream": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    events = parse_sse(raw)
    assert [n for n, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["type"] == "message" and start["role"] == "assistant" and start["model"] == MODEL
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["usage"] == {"input_tokens": 7, "output_tokens": 1}
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert events[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 3},
    }
    assert events[7][1] == {"type": "message_stop"}


def test_raw_tool_use_fragments_only_form_json_together():
    payload = {"path": "/tmp/a b.txt", "lines": [1, 2, 3], "flag": True}
    with FakeAnthropicServer() as server:
        server.script(tool_use_reply("read_file", payload, id="toolu_X", json_chunks=4))
        _, _, raw = raw_post(server, {"model": MODEL, "max_tokens": 5, "messages": USER, "stream": True})
    events = parse_sse(raw)
    start = [d for n, d in events if n == "content_block_start"][0]
    assert start["content_block"] == {"type": "tool_use", "id": "toolu_X", "name": "read_file", "input": {}}
    frags = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert all(d["delta"]["type"] == "input_json_delta" for n, d in events if n == "content_block_delta")
    assert frags[0] == "" and len(frags) == 5
    for frag in frags:
        with pytest.raises(ValueError):
            json.loads(frag)
    assert json.loads("".join(frags)) == payload
    delta = [d for n, d in events if n == "message_delta"][0]
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_request_validation_does_not_consume_script():
    with FakeAnthropicServer() as server:
        server.script(text_reply("scripted"))
        status, _, raw = raw_post(server, {"max_tokens": 5, "messages": USER})
        assert status == 400
        assert json.loads(raw)["error"] == {"type": "invalid_request_error", "message": "model: Field required"}
        status, _, raw = raw_post(server, {"model": MODEL, "max_tokens": 5, "messages": USER}, {"x-api-key": ""})
        assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error"
        assert server.pending == 1
        status, _, raw = raw_post(server, {"model": MODEL, "max_tokens": 5, "messages": USER})
        assert status == 200 and json.loads(raw)["content"] == [{"type": "text", "text": "scripted"}]
        assert len(server.requests) == 3


# ---------------------------------------------------------------------------
# the real SDK: successful replies
# ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sdk_streams_text(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(text_reply(["Hel", "lo", " world"], usage={"input_tokens": 12, "output_tokens": 5}))
    client = make_client(anthropic_server)
    seen, final = await stream_final(client, system="be nice")
    assert final.content[0].type == "text" and final.content[0].text == "Hello world"
    assert final.stop_reason == "end_turn" and final.model == MODEL and final.role == "assistant"
    assert final.usage.input_tokens == 12 and final.usage.output_tokens == 5
    assert seen[0] == "message_start" and seen[-1] == "message_stop"
    assert seen.count("text") == 3  # SDK-synthesised TextEvents, one per delta

    (req,) = anthropic_server.requests
    assert req.method == "POST" and req.path == "/v1/messages"
    assert req.json["model"] == MODEL and req.json["stream"] is True
    assert req.json["messages"] == USER and req.json["system"] == "be nice"
    assert req.api_key == "test-key"
    assert req.header("authorization") == "Bearer test-key"  # 2.12.0 sends api_key as a Bearer token
    assert req.header("anthropic-version")


@pytest.mark.asyncio
async def test_sdk_text_stream_helper(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(text_reply(["a", "b", "c"]))
    client = make_client(anthropic_server)
    async with client.messages.stream(model=MODEL, max_tokens=10, messages=USER) as s:
        pieces = [t async for t in s.text_stream]
        assert s.request_id and s.request_id.startswith("req_")
    assert pieces == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_sdk_parses_tool_use(anthropic_server, make_client):  # noqa: F811
    tool_input = {"query": "weather in Paris", "limit": 3, "nested": {"a": [1, "x"]}, "unicode": "é✓"}
    anthropic_server.script(tool_use_reply("search", tool_input, json_chunks=5))
    client = make_client(anthropic_server)
    seen, final = await stream_final(client, tools=[{"name": "search", "input_schema": {"type": "object"}}])
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "search" and block.input == tool_input
    assert block.id.startswith("toolu_")
    assert seen.count("input_json") == 6  # SDK events per partial_json fragment (incl. the empty first one)
    assert anthropic_server.last_request.json["tools"][0]["name"] == "search"


@pytest.mark.asyncio
async def test_sdk_text_then_tool_use(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(tool_use_reply("calc", {"expr": "1+1"}, id="toolu_fixed", text_before=["Let me ", "compute."]))
    _, final = await stream_final(make_client(anthropic_server))
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me compute."
    assert final.content[1].id == "toolu_fixed" and final.content[1].input == {"expr": "1+1"}


@pytest.mark.asyncio
async def test_sdk_two_tool_uses(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(
        message_reply(
            text_block("Two calls."),
            tool_use_block("a", {"x": 1}),
            tool_use_block("b", {"y": [2]}, json_chunks=2),
        )
    )
    _, final = await stream_final(make_client(anthropic_server))
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "name", None)) for b in final.content] == [("text", None), ("tool_use", "a"), ("tool_use", "b")]
    assert final.content[1].input == {"x": 1} and final.content[2].input == {"y": [2]}
    assert final.content[1].id != final.content[2].id


@pytest.mark.asyncio
async def test_sdk_max_tokens(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(max_tokens_reply(["cut ", "off"], usage={"output_tokens": 2}))
    _, final = await stream_final(make_client(anthropic_server))
    assert final.stop_reason == "max_tokens" and final.content[0].text == "cut off"
    assert final.usage.output_tokens == 2


@pytest.mark.asyncio
async def test_sdk_non_streaming_create(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(tool_use_reply("t", {"k": "v"}, text_before="hi", usage={"input_tokens": 3, "output_tokens": 4}))
    msg = await make_client(anthropic_server).messages.create(model="other-model", max_tokens=10, messages=USER)
    assert msg.model == "other-model" and msg.stop_reason == "tool_use"
    assert msg.content[0].text == "hi" and msg.content[1].input == {"k": "v"}
    assert msg.usage.input_tokens == 3 and msg.usage.output_tokens == 4
    assert "stream" not in anthropic_server.last_request.json


@pytest.mark.asyncio
async def test_script_queue_order_and_default(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(text_reply("one"), text_reply("two"))
    client = make_client(anthropic_server)
    texts = []
    for _ in range(3):
        _, final = await stream_final(client)
        texts.append(final.content[0].text)
    assert texts == ["one", "two", "OK"]  # empty queue -> default text reply
    assert len(anthropic_server.unscripted_requests) == 1


@pytest.mark.asyncio
async def test_default_none_gives_fast_500(make_client):
    with FakeAnthropicServer(default=None) as server:
        client = make_client(server, max_retries=2)
        with pytest.raises(anthropic.InternalServerError):
            await client.messages.create(model=MODEL, max_tokens=10, messages=USER)
        assert len(server.requests) == 1  # x-should-retry: false -> no SDK retries


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "status,exc,etype",
    [
        (401, anthropic.AuthenticationError, "authentication_error"),
        (403, anthropic.PermissionDeniedError, "permission_error"),
        (404, anthropic.NotFoundError, "not_found_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
async def test_sdk_http_errors(anthropic_server, status, exc, etype, make_client):  # noqa: F811
    anthropic_server.script(http_error(status, "nope"))
    client = make_client(anthropic_server)
    with pytest.raises(exc) as info:
        async with client.messages.stream(model=MODEL, max_tokens=10, messages=USER) as s:
            await s.get_final_message()
    err = info.value
    assert err.status_code == status and err.type == etype and err.api_message == "nope"
    assert err.body["type"] == "error" and err.body["error"] == {"type": etype, "message": "nope"}
    assert err.request_id and err.request_id.startswith("req_")
    if status == 429:
        assert err.response.headers["retry-after"] == "1"
    if status == 529:
        assert isinstance(err, anthropic.InternalServerError)


@pytest.mark.asyncio
async def test_sdk_retries_repeated_errors(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(http_error(529, times=2, retry_after_ms=1), text_reply("finally"))
    client = make_client(anthropic_server, max_retries=2)
    _, final = await stream_final(client)
    assert final.content[0].text == "finally"
    reqs = anthropic_server.requests
    assert len(reqs) == 3
    assert [r.header("x-stainless-retry-count") for r in reqs] == ["0", "1", "2"]


@pytest.mark.asyncio
async def test_sdk_retries_exhausted(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(http_error(429, times=3, retry_after_ms=1))
    with pytest.raises(anthropic.RateLimitError):
        await make_client(anthropic_server, max_retries=2).messages.create(model=MODEL, max_tokens=1, messages=USER)
    assert len(anthropic_server.requests) == 3 and anthropic_server.pending == 0


@pytest.mark.asyncio
async def test_sdk_mid_stream_error_event(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(mid_stream_error())
    client = make_client(anthropic_server)
    texts = []
    with pytest.raises(anthropic.APIStatusError) as info:
        async with client.messages.stream(model=MODEL, max_tokens=10, messages=USER) as s:
            async for event in s:
                if event.type == "text":
                    texts.append(event.text)
    err = info.value
    # anthropic 2.12.0 maps by HTTP status, which is 200 here: a plain APIStatusError.
    assert type(err) is anthropic.APIStatusError
    assert err.status_code == 200 and err.type == "overloaded_error" and err.api_message == "Overloaded"
    assert err.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert texts == ["Hel"]


@pytest.mark.asyncio
async def test_sdk_stall_trips_deadline_and_close_is_fast(anthropic_server, make_client):  # noqa: F811
    reply = stall()
    anthropic_server.script(reply)
    client = make_client(anthropic_server)
    got = []

    async def consume():
        async with client.messages.stream(model=MODEL, max_tokens=10, messages=USER) as s:
            async for event in s:
                if event.type == "text":
                    got.append(event.text)

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(consume(), timeout=0.3)
    assert got == ["Hel"]
    started = time.monotonic()
    anthropic_server.close()  # the handler is still stalled: close must not wait on it
    assert time.monotonic() - started < 2
    assert reply.release.is_set()


@pytest.mark.asyncio
async def test_sdk_stall_then_release_finishes(anthropic_server, make_client):  # noqa: F811
    release = threading.Event()
    anthropic_server.script(text_reply(["slow", " reply"]).with_stall(after=2, release=release))
    client = make_client(anthropic_server)

    async def consume():
        return await stream_final(client)

    task = asyncio.create_task(consume())
    await asyncio.to_thread(anthropic_server.wait_for_requests, 1, 5)
    release.set()
    _, final = await asyncio.wait_for(task, timeout=5)
    assert final.content[0].text == "slow reply"


@pytest.mark.asyncio
async def test_sdk_disconnect_mid_stream(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(disconnect())
    client = make_client(anthropic_server)
    # not wrapped by the SDK: the transport error escapes stream iteration as-is
    with pytest.raises(httpx2.RemoteProtocolError):
        await stream_final(client)


@pytest.mark.asyncio
async def test_sdk_disconnect_non_streaming_is_connection_error(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(disconnect())
    with pytest.raises(anthropic.APIConnectionError):
        await make_client(anthropic_server).messages.create(model=MODEL, max_tokens=1, messages=USER)


@pytest.mark.asyncio
async def test_raw_stream_escape_hatch(anthropic_server, make_client):  # noqa: F811
    anthropic_server.script(
        raw_stream(
            [
                ("message_start", {"type": "message_start", "message": {
                    "id": "msg_raw", "type": "message", "role": "assistant", "model": MODEL, "content": [],
                    "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": 1}}),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    _, final = await stream_final(make_client(anthropic_server))
    assert final.id == "msg_raw" and final.content == []


def test_wait_for_requests_times_out():
    with FakeAnthropicServer() as server:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            server.wait_for_requests(1, timeout=0.05)
        assert time.monotonic() - started < 1

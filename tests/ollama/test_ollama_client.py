"""The Ollama client against the scripted server: payload, NDJSON streaming, errors, /api/tags."""
from __future__ import annotations

import asyncio
import threading

import pytest

from agents_app.engines.base import EngineError
from agents_app.ollama_client import OllamaClient
from tests.fakes.ollama_server import disconnect, error, model_not_found, reply, stall, stream_error

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


async def _collect(client: OllamaClient, model: str = "m1") -> list:
    return [chunk async for chunk in client.stream_chat(MESSAGES, model=model)]


def test_ollama_client_chat_sends_seed_payload_with_json_format(ollama_server):
    ollama_server.script(reply('{"action": "final"}', 2, prompt_eval_count=7, eval_count=3))
    result = OllamaClient(base_url=ollama_server.url, timeout=5).chat(MESSAGES, model="m1")
    assert result.content == '{"action": "final"}' and result.done
    assert result.usage == {"input_tokens": 7, "output_tokens": 3}
    sent = ollama_server.chat_requests()[0].json
    assert sent == {"model": "m1", "messages": MESSAGES, "stream": False, "format": "json",
                    "options": {"temperature": 0.2}}


async def test_ollama_client_stream_yields_chunks_in_order_then_done(ollama_server):
    ollama_server.script(reply(["{", '"a"', ": 1}"], eval_count=3))
    chunks = await _collect(OllamaClient(base_url=ollama_server.url, timeout=5))
    assert [c.content for c in chunks] == ["{", '"a"', ": 1}", ""]
    assert [c.done for c in chunks] == [False, False, False, True]
    assert chunks[-1].usage["output_tokens"] == 3
    assert ollama_server.chat_requests()[0].json["stream"] is True


async def test_ollama_client_stream_delivers_pieces_before_the_answer_ends(ollama_server):
    release = threading.Event()
    ollama_server.script(stall(reply(["first", " second"]), after=1, release=release))
    client = OllamaClient(base_url=ollama_server.url, timeout=5)
    stream = client.stream_chat(MESSAGES, model="m1").__aiter__()
    first = await asyncio.wait_for(stream.__anext__(), 5)
    assert first.content == "first"  # arrived while the server still holds the rest
    release.set()
    rest = [c.content async for c in stream]
    assert rest == [" second", ""]


async def test_ollama_client_unreachable_names_model_and_endpoint(closed_port_url):
    client = OllamaClient(base_url=closed_port_url, timeout=2)
    with pytest.raises(EngineError) as caught:
        await _collect(client, model="gpt-oss-20b")
    assert caught.value.code == "provider_unreachable"
    assert "gpt-oss-20b" in caught.value.message and f"{closed_port_url}/api/chat" in caught.value.message
    with pytest.raises(EngineError) as blocking:
        client.chat(MESSAGES, model="gpt-oss-20b")
    assert blocking.value.code == "provider_unreachable"


@pytest.mark.parametrize(("scripted", "code", "text"), [
    (model_not_found(), "model_not_found", "model 'm1' not found"),
    (error(500, "out of memory"), "provider_error", "HTTP 500: out of memory"),
    (error(400, "invalid format"), "provider_error", "HTTP 400: invalid format"),
])
async def test_ollama_client_http_errors_have_codes(ollama_server, scripted, code, text):
    ollama_server.script(scripted, scripted)
    client = OllamaClient(base_url=ollama_server.url, timeout=5)
    with pytest.raises(EngineError) as streamed:
        await _collect(client)
    with pytest.raises(EngineError) as blocking:
        client.chat(MESSAGES, model="m1")
    for caught in (streamed, blocking):
        assert caught.value.code == code
        assert text in caught.value.message and "'m1'" in caught.value.message
        assert ollama_server.url + "/api/chat" in caught.value.message


async def test_ollama_client_mid_stream_error_line_is_provider_error(ollama_server):
    ollama_server.script(stream_error("model crashed", after=1))
    with pytest.raises(EngineError) as caught:
        await _collect(OllamaClient(base_url=ollama_server.url, timeout=5))
    assert caught.value.code == "provider_error" and "model crashed" in caught.value.message


async def test_ollama_client_dropped_stream_is_provider_error(ollama_server):
    ollama_server.script(disconnect(after=1))
    with pytest.raises(EngineError) as caught:
        await _collect(OllamaClient(base_url=ollama_server.url, timeout=5))
    assert caught.value.code == "provider_error"


async def test_ollama_client_silent_server_times_out(ollama_server):
    ollama_server.script(stall(after=1))
    with pytest.raises(EngineError) as caught:
        await _collect(OllamaClient(base_url=ollama_server.url, timeout=0.5))
    assert caught.value.code == "provider_timeout" and "'m1'" in caught.value.message


async def test_ollama_client_closing_the_stream_early_frees_the_worker(ollama_server):
    ollama_server.script(stall(reply(["a", "b"]), after=1))
    client = OllamaClient(base_url=ollama_server.url, timeout=30)
    before = {t.name for t in threading.enumerate()}
    stream = client.stream_chat(MESSAGES, model="m1")
    assert (await stream.__anext__()).content == "a"
    await stream.aclose()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while any(t.name.startswith("ollama-stream-") and t.name not in before for t in threading.enumerate()):
        assert loop.time() < deadline, "stream worker still reading after the stream was closed"
        await asyncio.sleep(0.02)


def test_ollama_client_tags_lists_models(ollama_server, closed_port_url):
    ollama_server.models = ["llama3.2:latest", "gpt-oss-20b"]
    assert OllamaClient(base_url=ollama_server.url, timeout=5).tags() == ["llama3.2:latest", "gpt-oss-20b"]
    ollama_server.tags_error = error(500, "broken")
    with pytest.raises(EngineError) as failed:
        OllamaClient(base_url=ollama_server.url, timeout=5).tags()
    assert failed.value.code == "provider_error"
    with pytest.raises(EngineError) as down:
        OllamaClient(base_url=closed_port_url, timeout=2).tags()
    assert down.value.code == "provider_unreachable"

"""The benchmark's baseline: the least a server can do to relay a model stream (no framework, no DB).

A raw ASGI app on the same daphne and the same ``anthropic`` SDK as the project. ``POST /relay``
with ``{"model": ...}`` streams ``messages.create(..., stream=True)`` from ANTHROPIC_BASE_URL and
relays it as SSE: ``data: {"type":"content_delta","content":...}`` per text delta, ``: ping``
when nothing was sent for SSE_PING_INTERVAL seconds, then ``data: {"type":"done"}`` (or
``{"type":"error",...}``). One shared SDK client whose pool allows thousands of open streams; a
client that hangs up cancels its upstream request. Run with::

    ANTHROPIC_BASE_URL=http://127.0.0.1:<port> .venv/bin/python -m daphne -b 127.0.0.1 -p 8100 bench.bare_relay:app
"""
import asyncio
import json
import os

import anthropic
import httpx2

PING = float(os.environ.get("SSE_PING_INTERVAL", "15"))
client = anthropic.AsyncAnthropic(
    api_key=os.environ.get("ANTHROPIC_API_KEY", "bench-key"), base_url=os.environ.get("ANTHROPIC_BASE_URL"), max_retries=0,
    http_client=anthropic.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_connections=20_000, max_keepalive_connections=1_000),
                                                  timeout=httpx2.Timeout(600, connect=10)))
HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


async def relay(send, model: str) -> None:
    sent = False  # whether anything was sent since the pinger last looked

    async def pinger():
        nonlocal sent
        while True:
            await asyncio.sleep(PING)
            if not sent:
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
            sent = False

    try:
        stream = await client.messages.create(model=model, max_tokens=4096, messages=[{"role": "user", "content": "bench"}], stream=True)
    except anthropic.APIError as exc:
        await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]})
        return await send({"type": "http.response.body", "body": str(exc).encode()})
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": b"", "more_body": True})  # daphne sends the headers now
    pings = asyncio.create_task(pinger())
    try:
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    frame = json.dumps({"type": "content_delta", "content": event.delta.text})
                    await send({"type": "http.response.body", "body": f"data: {frame}\n\n".encode(), "more_body": True})
                    sent = True
        end = {"type": "done"}
    except anthropic.APIError as exc:
        end = {"type": "error", "message": str(exc)}
    finally:
        pings.cancel()
    await send({"type": "http.response.body", "body": f"data: {json.dumps(end)}\n\n".encode()})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] != "/relay" or scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        return await send({"type": "http.response.body", "body": b"not found"})
    body = b""
    while (message := await receive())["type"] == "http.request":
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    else:
        return  # the client hung up before its request was complete
    work = asyncio.create_task(relay(send, json.loads(body)["model"]))
    hangup = asyncio.create_task(receive())  # the next message is http.disconnect
    await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
    hangup.cancel()
    if work.done():
        return work.result()  # re-raises an unexpected failure, for daphne to log
    work.cancel()

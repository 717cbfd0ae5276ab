"""A fast fake of the Anthropic Messages streaming API, for the streaming benchmark.

Serves ``POST /v1/messages`` with ``"stream": true`` and answers ``200 text/event-stream`` in the
real API's wire format (chunked transfer encoding, one frame per chunk, HTTP/1.1 keep-alive)::

    event: message_start        {"type":"message_start","message":{"id","type":"message","role":
                                 "assistant","model","content":[],"stop_reason":null,
                                 "stop_sequence":null,"usage":{"input_tokens","output_tokens"}}}
    event: content_block_start  {"type":"content_block_start","index":0,
                                 "content_block":{"type":"text","text":""}}
    event: ping                 {"type":"ping"}
    event: content_block_delta  {"type":"content_block_delta","index":0,
                                 "delta":{"type":"text_delta","text":"tok "}}      x N
    event: content_block_stop   {"type":"content_block_stop","index":0}
    event: message_delta        {"type":"message_delta","delta":{"stop_reason":"end_turn",
                                 "stop_sequence":null},"usage":{"output_tokens":N}}
    event: message_stop         {"type":"message_stop"}

Every delta is the same 4-character text, ``"tok "`` (:data:`DELTA_TEXT`), so a client can count
the deltas it got from the length of the text alone, however a relay merges them.

The request's ``model`` chooses the behaviour, so one process serves every measurement:

- ``bench-fast-<N>``: N deltas as fast as possible (the whole body is pre-encoded and written at
  once; TCP back-pressure paces it).
- ``bench-rate-<R>x<N>``: the first delta at once, then the rest at R deltas per second (on an
  absolute schedule, so no drift).
- ``bench-hang-<S>``: ``message_start``, then silence for S seconds, or until the caller hangs up
  (the server notices at once, so abandoned streams free their sockets), then an empty reply.

Anything else is an error in the API's own shape: 404 ``not_found_error`` for other paths, 400
``invalid_request_error`` for an unknown model, a body without ``stream: true`` or malformed JSON.

Run it on its own (the benchmark starts it as a subprocess and reads the port from the first
line of stdout)::

    .venv/bin/python bench/fake_upstream.py [--port 0]
    # prints: listening on 127.0.0.1:<port>
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import signal
from functools import lru_cache

DELTA_TEXT = "tok "
HOST = "127.0.0.1"

_MODEL = re.compile(r"bench-(?:fast-(?P<fast>\d+)|rate-(?P<rate>\d+(?:\.\d+)?)x(?P<count>\d+)|hang-(?P<hang>\d+(?:\.\d+)?))$")
_MAX_HEADER_BYTES = 64 * 1024
_MAX_BODY_BYTES = 16 * 1024 * 1024


def _frame(event: str, data: dict) -> bytes:
    """One SSE frame as one HTTP chunk."""
    payload = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@lru_cache(maxsize=64)
def _head(model: str) -> bytes:
    """``message_start`` (what a hanging stream sends) as a chunk."""
    message = {
        "id": "msg_bench", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    return _frame("message_start", {"type": "message_start", "message": message})


_BLOCK_START = (
    _frame("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    + _frame("ping", {"type": "ping"})
)
_DELTA = _frame("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": DELTA_TEXT}})
_END_OF_BODY = b"0\r\n\r\n"


@lru_cache(maxsize=64)
def _tail(count: int) -> bytes:
    """From ``content_block_stop`` to the end of the chunked body."""
    return (
        _frame("content_block_stop", {"type": "content_block_stop", "index": 0})
        + _frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": count}})
        + _frame("message_stop", {"type": "message_stop"})
        + _END_OF_BODY
    )


@lru_cache(maxsize=16)
def _fast_body(model: str, count: int) -> bytes:
    return _head(model) + _BLOCK_START + _DELTA * count + _tail(count)


_STREAM_HEADERS = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"request-id: req_bench\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _error(status: int, reason: str, error_type: str, message: str) -> bytes:
    body = json.dumps({"type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_bench"}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nrequest-id: req_bench\r\n"
        f"x-should-retry: false\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    """Method, path and body of the next request; None when the peer closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length > _MAX_BODY_BYTES:
        raise ValueError("request body too large")
    body = await reader.readexactly(length) if length else b""
    return method, path, body


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, path: str, body: bytes) -> bool:
    """Write one response; False when the connection must close."""
    if path.split("?", 1)[0] != "/v1/messages" or method != "POST":
        writer.write(_error(404, "Not Found", "not_found_error", f"{method} {path} not found"))
        return True
    try:
        request = json.loads(body)
        model = str(request.get("model", ""))
        stream = request.get("stream") is True
    except (ValueError, AttributeError):
        writer.write(_error(400, "Bad Request", "invalid_request_error", "malformed JSON body"))
        return True
    match = _MODEL.match(model)
    if not match or not stream:
        writer.write(_error(400, "Bad Request", "invalid_request_error",
                            f"the bench upstream streams only models bench-fast-N, bench-rate-RxN, bench-hang-S (got {model!r}, stream={stream})"))
        return True
    if match["fast"]:
        writer.write(_STREAM_HEADERS + _fast_body(model, int(match["fast"])))
        return True
    loop = asyncio.get_running_loop()
    if match["rate"]:
        rate, count = float(match["rate"]), int(match["count"])
        start = loop.time()
        writer.write(_STREAM_HEADERS + _head(model) + _BLOCK_START + (_DELTA if count else b""))
        for i in range(1, count):
            await writer.drain()
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(_DELTA)
        writer.write(_tail(count))
        return True
    writer.write(_STREAM_HEADERS + _head(model))
    await writer.drain()
    try:
        # Any read result (EOF or stray bytes) means the caller gave up on this stream.
        await asyncio.wait_for(reader.read(1), timeout=float(match["hang"]))
        return False
    except TimeoutError:
        writer.write(_BLOCK_START + _tail(0))
        return True


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            request = await _read_request(reader)
            if request is None or not await _answer(reader, writer, *request):
                break
            await writer.drain()
    except (ConnectionError, ValueError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = await asyncio.start_server(_serve_connection, HOST, port, backlog=4096, limit=_MAX_HEADER_BYTES)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on {HOST}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port, printed on stdout)")
    asyncio.run(main(parser.parse_args().port))

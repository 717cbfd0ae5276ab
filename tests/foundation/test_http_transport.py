"""The provider transport: a request's head and body leave in one write (core/http_transport.py)."""
from __future__ import annotations

import asyncio
import json
import socket

import httpcore2
import httpx2
import pytest

from agents_app.engines.claude import lease_client
from core.http_transport import FLUSH_BYTES, CoalescingStream, OneWriteTransport


class _Recorded(httpcore2.AsyncNetworkStream):
    def __init__(self, *, fail_write: bool = False, reply: bytes = b"reply"):
        self.writes: list[bytes] = []
        self.reads = 0
        self.closed = False
        self.fail_write = fail_write
        self.reply = reply

    async def write(self, buffer, timeout=None):
        if self.fail_write:
            raise httpcore2.WriteError("peer closed")
        self.writes.append(buffer)

    async def read(self, max_bytes, timeout=None):
        self.reads += 1
        return self.reply

    async def aclose(self):
        self.closed = True

    def get_extra_info(self, info):
        return {"is_readable": False}.get(info)


async def test_writes_are_held_until_the_next_read_then_sent_as_one():
    inner = _Recorded()
    stream = CoalescingStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n")
    await stream.write(b"")
    await stream.write(b'{"a": 1}')
    assert inner.writes == []
    assert await stream.read(100) == b"reply"
    assert inner.writes == [b'POST / HTTP/1.1\r\n\r\n{"a": 1}']
    await stream.read(100)  # nothing held: nothing written
    assert len(inner.writes) == 1 and inner.reads == 2


async def test_a_large_body_is_sent_as_it_grows():
    inner = _Recorded()
    stream = CoalescingStream(inner)
    chunk = b"x" * (FLUSH_BYTES // 2)
    for _ in range(5):
        await stream.write(chunk)
    assert [len(w) for w in inner.writes] == [FLUSH_BYTES, FLUSH_BYTES]  # sent at the threshold
    await stream.read(10)
    assert [len(w) for w in inner.writes] == [FLUSH_BYTES, FLUSH_BYTES, FLUSH_BYTES // 2]


async def test_a_failed_send_still_reads_the_servers_answer():
    # As httpcore does mid-request: a server may answer (413, 400) and close before the whole
    # request arrived; its answer is what the caller should see.
    inner = _Recorded(fail_write=True, reply=b"HTTP/1.1 413 Payload Too Large\r\n\r\n")
    stream = CoalescingStream(inner)
    await stream.write(b"request")
    assert await stream.read(100) == b"HTTP/1.1 413 Payload Too Large\r\n\r\n"


async def test_closing_drops_what_was_held():
    inner = _Recorded()
    stream = CoalescingStream(inner)
    await stream.write(b"never sent")
    await stream.aclose()
    assert inner.closed and inner.writes == []
    assert stream.get_extra_info("is_readable") is False


class _OnSocket(_Recorded):
    """A stream on a real socket, counting how often it is asked for its extra info."""

    def __init__(self, sock):
        super().__init__()
        self.sock = sock
        self.asked: list[str] = []

    def get_extra_info(self, info):
        self.asked.append(info)
        return self.sock if info == "socket" else None


def test_an_idle_connection_is_probed_on_its_own_socket_without_asking_the_stream_again():
    ours, peer = socket.socketpair()
    try:
        inner = _OnSocket(ours)
        stream = CoalescingStream(inner)
        assert stream.get_extra_info("is_readable") is False  # nothing waiting: the connection is reusable
        peer.sendall(b"x")
        assert stream.get_extra_info("is_readable") is True
        ours.recv(1)
        peer.close()  # the server hung up: a read would return b"", so readable, so expired
        assert stream.get_extra_info("is_readable") is True
        assert stream.get_extra_info("socket") is ours
        assert inner.asked == ["socket"]  # once, at the start
    finally:
        ours.close()


class _Server:
    """A raw HTTP/1.1 server on 127.0.0.1 that records each chunk as it arrives."""

    def __init__(self):
        self.first_chunks: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            first = await reader.read(65536)
            if not first:
                break
            self.first_chunks.append(first)
            data = first
            while b"\r\n\r\n" not in data:
                data += await reader.read(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += await reader.read(65536)
            payload = json.dumps({"got": json.loads(body)}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
        writer.close()


@pytest.fixture
async def raw_server():
    server = _Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    yield server
    listener.close()
    await listener.wait_closed()


class _CountingBackend(httpcore2.AsyncNetworkBackend):
    """The real (anyio) backend, counting what reaches each socket's write."""

    def __init__(self):
        self.inner = httpcore2.AnyIOBackend()
        self.writes: list[bytes] = []

    async def connect_tcp(self, *args, **kwargs):
        stream = await self.inner.connect_tcp(*args, **kwargs)
        original = stream.write

        async def write(buffer, timeout=None):
            self.writes.append(buffer)
            await original(buffer, timeout)

        stream.write = write
        return stream

    async def connect_unix_socket(self, *args, **kwargs):
        raise NotImplementedError

    async def sleep(self, seconds):
        await self.inner.sleep(seconds)


async def test_each_request_reaches_the_socket_in_one_write(raw_server):
    backend = _CountingBackend()
    async with httpx2.AsyncClient(transport=OneWriteTransport(backend=backend), base_url=raw_server.url) as client:
        for n in range(3):  # a fresh connection, then the kept-alive one
            response = await client.post("/v1/messages", json={"n": n, "text": "hello"})
            assert response.json() == {"got": {"n": n, "text": "hello"}}
    # httpcore writes the head and the body separately (and yields to the loop in between).
    assert len(backend.writes) == 3
    for n, (written, received) in enumerate(zip(backend.writes, raw_server.first_chunks)):
        assert written.startswith(b"POST /v1/messages HTTP/1.1\r\n")
        assert written.endswith(b'\r\n\r\n{"n":%d,"text":"hello"}' % n)
        assert received == written


async def test_the_claude_engines_clients_use_it(settings, raw_server):
    settings.ANTHROPIC_API_KEY = "test-key"
    settings.ANTHROPIC_BASE_URL = raw_server.url
    client, release = lease_client()
    try:
        transport = client._client._transport  # the SDK's httpx client
        assert isinstance(transport, OneWriteTransport)
        response = await client._client.post(f"{raw_server.url}/v1/messages", json={"x": 1})
        assert response.json() == {"got": {"x": 1}}
        assert raw_server.first_chunks[-1].endswith(b'\r\n\r\n{"x":1}')
    finally:
        release()

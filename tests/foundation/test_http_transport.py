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


# --- the asyncio backend: reads without yielding, httpcore's errors, TLS ---------------------
import ssl  # noqa: E402
import struct  # noqa: E402

import trustme  # noqa: E402

from core import http_transport  # noqa: E402
from core.http_transport import AsyncioBackend, AsyncioStream  # noqa: E402


async def _until(condition, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.001)


@pytest.fixture
async def peer():
    """A TCP server on 127.0.0.1 whose connections the test drives: ``peer.writers[i]``."""
    state = type("Peer", (), {})()
    state.writers, state.readers = [], []

    async def accept(reader, writer):
        state.readers.append(reader)
        state.writers.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    for writer in state.writers:
        writer.close()
    server.close()
    await server.wait_closed()


async def _connect(peer) -> AsyncioStream:
    stream = await AsyncioBackend().connect_tcp("127.0.0.1", peer.port, timeout=5)
    await _until(lambda: peer.writers)
    return stream


async def test_a_read_that_finds_data_returns_it_without_yielding_to_the_loop(peer):
    stream = await _connect(peer)
    peer.writers[0].write(b"HTTP/1.1 200 OK\r\n")
    await _until(lambda: stream._protocol.chunks)
    coroutine = stream.read(65536)
    with pytest.raises(StopIteration) as done:
        coroutine.send(None)  # it returns at once: no pass of the event loop in between
    assert done.value.value == b"HTTP/1.1 200 OK\r\n"
    await stream.aclose()


async def test_reads_wait_for_data_split_to_max_bytes_and_end_with_empty_bytes(peer):
    stream = await _connect(peer)
    reading = asyncio.ensure_future(stream.read(4))
    await asyncio.sleep(0.01)
    assert not reading.done()
    peer.writers[0].write(b"abcdefgh")
    assert await asyncio.wait_for(reading, 5) == b"abcd"
    assert await stream.read(100) == b"efgh"
    peer.writers[0].close()
    assert await asyncio.wait_for(stream.read(100), 5) == b""  # the server closed
    assert stream.get_extra_info("is_readable") is True  # so the pool would not reuse it
    with pytest.raises(httpcore2.WriteError):
        await stream.write(b"more")


async def test_a_read_times_out_as_httpcores(peer):
    stream = await _connect(peer)
    with pytest.raises(httpcore2.ReadTimeout):
        await stream.read(100, timeout=0.05)
    peer.writers[0].write(b"late")
    assert await asyncio.wait_for(stream.read(100), 5) == b"late"  # still usable
    await stream.aclose()


async def test_a_reset_connection_is_a_read_error(peer):
    stream = await _connect(peer)
    sock = peer.writers[0].get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.writers[0].transport.abort()  # an RST, not a FIN
    with pytest.raises(httpcore2.ReadError):
        await asyncio.wait_for(stream.read(100), 5)


async def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(httpcore2.ConnectError):
            await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)


async def test_socket_options_are_applied(peer):
    stream = await AsyncioBackend().connect_tcp("127.0.0.1", peer.port, timeout=5,
                                                socket_options=[(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)])
    assert stream.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert stream.get_extra_info("server_addr")[1] == peer.port
    await stream.aclose()


async def test_a_slow_reader_pauses_the_socket_and_loses_nothing(peer, monkeypatch):
    monkeypatch.setattr(http_transport, "READ_HIGH_WATER", 4096)
    monkeypatch.setattr(http_transport, "READ_LOW_WATER", 1024)
    stream = await _connect(peer)
    payload = bytes(range(256)) * 2048  # 512 KiB
    peer.writers[0].write(payload)
    await _until(lambda: stream._protocol.paused)
    assert stream._protocol.size < len(payload)  # the rest waits in the kernel and the peer's buffer
    got = bytearray()
    while len(got) < len(payload):
        got += await asyncio.wait_for(stream.read(65536), 5)
    assert bytes(got) == payload and not stream._protocol.paused
    await stream.aclose()


async def test_a_unix_socket_connects_too(tmp_path):
    path = str(tmp_path / "s")

    async def answer(reader, writer):
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, path)
    try:
        stream = await AsyncioBackend().connect_unix_socket(path, timeout=5)
        await stream.write(b"ping")
        assert await asyncio.wait_for(stream.read(100), 5) == b"ping"
        await stream.aclose()
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture(scope="module")
def tls_ca():
    return trustme.CA()


@pytest.fixture
async def tls_server(tls_ca):
    """The raw HTTP server of the tests above, over TLS for ``localhost``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert("localhost").configure_cert(context)
    server = _Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()
    await listener.wait_closed()


async def test_https_through_the_provider_transport(tls_ca, tls_server):
    client_context = ssl.create_default_context()
    tls_ca.configure_trust(client_context)
    async with httpx2.AsyncClient(transport=OneWriteTransport(verify=client_context),
                                  base_url=f"https://localhost:{tls_server.port}") as client:
        for n in range(2):  # a fresh connection (handshake), then the kept-alive one
            response = await client.post("/v1/messages", json={"n": n})
            assert response.json() == {"got": {"n": n}}
        assert len(tls_server.first_chunks) == 2  # each request arrived in one piece


async def test_https_with_a_certificate_for_another_name_is_refused(tls_ca, tls_server):
    client_context = ssl.create_default_context()
    tls_ca.configure_trust(client_context)
    async with httpx2.AsyncClient(transport=OneWriteTransport(verify=client_context),
                                  base_url=f"https://127.0.0.1:{tls_server.port}") as client:
        with pytest.raises(httpx2.ConnectError):
            await client.post("/v1/messages", json={"n": 1})


async def test_https_with_an_untrusted_certificate_is_refused(tls_server):
    async with httpx2.AsyncClient(transport=OneWriteTransport(verify=ssl.create_default_context()),
                                  base_url=f"https://localhost:{tls_server.port}") as client:
        with pytest.raises(httpx2.ConnectError):
            await client.post("/v1/messages", json={"n": 1})

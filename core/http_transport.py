"""The provider transport: HTTP/1.1 requests leave in one write, responses are read as they come.

httpcore writes a request in parts (the head, then each body chunk), and its anyio stream yields
to the event loop after every write. In a server streaming many runs, that yield lets other work
run between a provider request's head and its body — a stream's response head and opening
frames, another request's start — so the body reached the provider up to 2 ms after the head and
every first token came that much later (traced with ``bench/round_timeline.py``: 2.1 ms from the
head to the body against the bare relay's 0.6 ms at one stream).

:class:`AsyncioBackend` below does not yield on a write, but a request in parts would still
leave as two sends and two TCP segments. :class:`CoalescingStream` holds the writes of a request
and sends them as one when the connection next reads (httpcore reads the response right after
the last body chunk) or once 64 KiB are held (a large upload is still sent as it is produced). A
write error while sending is handled as httpcore handles it during a request: the response is
read anyway, since a server may answer (e.g. 413) and close before the whole request arrived.
Only HTTP/1.1: HTTP/2 multiplexes reads and writes, so :class:`OneWriteTransport` keeps
``http2`` off.

:class:`AsyncioBackend` connects with asyncio itself (a protocol that keeps reading into a
buffer) rather than through anyio. anyio's stream pauses reading after every receive and resumes
it on the next (two ``epoll_ctl`` calls per read), and yields to the event loop on every receive,
even one that finds data already there: a response's head and first events took two to four
passes of the loop to reach the SDK, and under a burst of starts every pass holds a step of every
other stream (``bench/round_timeline.py``). Here a read that finds data returns it without
yielding, and one that waits is woken by the data itself. Reading pauses only when more than
:data:`READ_HIGH_WATER` bytes wait unread (a slow consumer). Errors are httpcore's, as its anyio
backend maps them (``ConnectError``/``ConnectTimeout``, ``ReadError``/``ReadTimeout``,
``WriteError``/``WriteTimeout``); TLS is asyncio's ``start_tls``.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from typing import Any, Iterable

import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable  # httpcore's own test of an idle connection

# Held writes are sent once they reach this many bytes, without waiting for a read.
FLUSH_BYTES = 64 * 1024

# A connection stops reading from its socket while more than this many bytes wait unread, and
# starts again once they are down to READ_LOW_WATER.
READ_HIGH_WATER = 1024 * 1024
READ_LOW_WATER = 256 * 1024

# TCP keep-alive as the ``anthropic`` SDK's default client sets it: a stream that waits minutes
# for a model notices a dead peer (60 s idle, then a probe every 60 s, 5 probes).
KEEPALIVE_OPTIONS: list[tuple[int, int, int]] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5)) if hasattr(socket, name)
]


class _Reading(asyncio.Protocol):
    """The connection's side of asyncio: what arrived, whether the peer is done, who waits."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.eof = False  # no more data will come (the peer closed, or the connection is lost)
        self.error: BaseException | None = None  # why the connection was lost, if not cleanly
        self.paused = False  # reading paused here (READ_HIGH_WATER)
        self.waiter: asyncio.Future | None = None  # a read waiting for data
        self.drain: asyncio.Future | None = None  # a write waiting for the send buffer to drain
        self.writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return False  # the transport closes itself

    def connection_lost(self, exc: BaseException | None) -> None:
        self.eof = True
        self.error = self.error or exc
        self._wake_reader()
        self.writing_paused = False
        self._wake_writer()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()

    def _wake_reader(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        drain = self.drain
        if drain is not None and not drain.done():
            drain.set_result(None)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


async def _wait(protocol: _Reading, attribute: str, timeout: float | None) -> None:
    """Until ``protocol.<attribute>`` (a fresh future) is woken; TimeoutError after ``timeout``."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    setattr(protocol, attribute, waiter)
    timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
    try:
        await waiter
    finally:
        setattr(protocol, attribute, None)
        if timer is not None:
            timer.cancel()


async def _connected(connecting: Any, timeout: float | None, where: str) -> "AsyncioStream":
    """The stream of a connection being made (``loop.create_*connection``), with httpcore's errors."""
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await connecting
    except TimeoutError:
        raise httpcore2.ConnectTimeout(f"timed out connecting to {where}") from None
    except OSError as exc:
        raise httpcore2.ConnectError(str(exc)) from exc
    return AsyncioStream(transport, protocol)


class AsyncioStream(httpcore2.AsyncNetworkStream):
    """httpcore's network stream on an asyncio transport (see the module docstring)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Reading):
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.chunks and not protocol.eof:
            try:
                await _wait(protocol, "waiter", timeout)
            except TimeoutError:
                raise httpcore2.ReadTimeout("timed out waiting for the server") from None
        if not protocol.chunks:
            if protocol.error is not None:
                raise httpcore2.ReadError(str(protocol.error) or type(protocol.error).__name__) from protocol.error
            return b""  # the server closed the connection
        chunk = protocol.chunks.popleft()
        if len(chunk) > max_bytes:
            protocol.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        protocol.size -= len(chunk)
        if protocol.paused and protocol.size <= READ_LOW_WATER:
            protocol.paused = False
            self._transport.resume_reading()
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if protocol.eof and protocol.error is not None or self._transport.is_closing():
            raise httpcore2.WriteError(str(protocol.error or "the connection is closed"))
        self._transport.write(buffer)
        if protocol.writing_paused:
            try:
                await _wait(protocol, "drain", timeout)
            except TimeoutError:
                raise httpcore2.WriteTimeout("timed out sending to the server") from None
            if protocol.error is not None:
                raise httpcore2.WriteError(str(protocol.error)) from protocol.error

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                                 server_hostname=server_hostname)
        except TimeoutError:
            self._transport.close()
            raise httpcore2.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore2.ConnectError(str(exc)) from exc
        if transport is None:  # the connection was lost during the handshake
            raise httpcore2.ConnectError("the connection closed during the TLS handshake")
        self._protocol.transport = transport
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection the server closed (or wrote to) is not reusable
            protocol = self._protocol
            return protocol.eof or bool(protocol.chunks) or self._transport.is_closing()
        key = {"ssl_object": "ssl_object", "client_addr": "sockname", "server_addr": "peername",
               "socket": "socket"}.get(info)
        return None if key is None else self._transport.get_extra_info(key)


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
    """Connections made by asyncio itself, read through :class:`AsyncioStream` (see the module)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        # As anyio connects: both address families tried, the second 250 ms after the first.
        stream = await _connected(loop.create_connection(
            _Reading, host, port, local_addr=(local_address, 0) if local_address else None,
            happy_eyeballs_delay=0.25), timeout, f"{host}:{port}")
        sock = stream.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return stream

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        return await _connected(asyncio.get_running_loop().create_unix_connection(_Reading, path), timeout, path)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class CoalescingStream(httpcore2.AsyncNetworkStream):
    """A network stream that sends held writes as one, before its next read (see the module)."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream):
        self._inner = inner
        # The socket, asked for once: anyio answers every ``extra()`` by building all of a
        # socket's attributes, a getpeername() call included, and the pool asks each idle
        # connection whether it is readable whenever a request comes or goes (py-spy, fifty
        # concurrent streams: ~5% of the event loop's time).
        # (An AsyncioStream answers is_readable from what it has read, which a probe of its
        # socket cannot see: it is asked itself.)
        self._socket: socket.socket | None = None if isinstance(inner, AsyncioStream) else inner.get_extra_info("socket")
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= FLUSH_BYTES:
            await self._flush()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            try:
                await self._flush()
            except httpcore2.WriteError:
                pass  # as httpcore does mid-request: the server may have answered before closing
        return await self._inner.read(max_bytes, timeout)

    async def _flush(self) -> None:
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held, self._size = [], 0
        await self._inner.write(data, self._timeout)

    async def aclose(self) -> None:
        self._held, self._size = [], 0  # a closing connection sends nothing more
        await self._inner.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore2.AsyncNetworkStream:
        if self._held:
            await self._flush()
        return CoalescingStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if self._socket is not None:  # (never for an AsyncioStream, see __init__)
            if info == "is_readable":
                return is_socket_readable(self._socket)
            if info == "socket":
                return self._socket
        return self._inner.get_extra_info(info)


class CoalescingBackend(httpcore2.AsyncNetworkBackend):
    """Connects through ``inner`` (:class:`AsyncioBackend` by default) and wraps each stream in
    :class:`CoalescingStream`."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend | None = None):
        self._inner = inner or AsyncioBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        return CoalescingStream(await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        return CoalescingStream(await self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class OneWriteTransport(httpx2.AsyncHTTPTransport):
    """httpx's HTTP/1.1 transport on a connection pool whose streams coalesce a request's writes.

    Takes ``verify``, ``limits`` and ``socket_options`` as :class:`httpx2.AsyncHTTPTransport`
    does (no proxy: a client given this transport still mounts the environment's proxies, which
    use httpx's own transport).
    """

    def __init__(self, *, verify: ssl.SSLContext | bool = True, limits: httpx2.Limits = httpx2.Limits(),
                 socket_options: Iterable[tuple] | None = None, backend: httpcore2.AsyncNetworkBackend | None = None):
        super().__init__(verify=verify, limits=limits, http1=True, http2=False, socket_options=socket_options)
        # httpx's transport sends every request through ``_pool``: the same pool as the one it
        # built from these arguments, on the coalescing backend.
        ssl_context = verify if isinstance(verify, ssl.SSLContext) else httpx2.create_ssl_context(verify=verify)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            http1=True, http2=False, socket_options=socket_options, network_backend=CoalescingBackend(backend))

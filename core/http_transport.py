"""An httpx transport whose HTTP/1.1 requests leave in one write: head and body together.

httpcore writes a request in parts (the head, then each body chunk), and its anyio stream yields
to the event loop after every write. In a server streaming many runs, that yield lets other work
run between a provider request's head and its body — a stream's response head and opening
frames, another request's start — so the body reached the provider up to 2 ms after the head and
every first token came that much later (traced with ``bench/round_timeline.py``: 2.1 ms from the
head to the body against the bare relay's 0.6 ms at one stream).

:class:`CoalescingStream` holds the writes of a request and sends them as one when the connection
next reads (httpcore reads the response right after the last body chunk) or once 64 KiB are
held (a large upload is still sent as it is produced). A write error while sending is handled
as httpcore handles it during a request: the response is read anyway, since a server may answer
(e.g. 413) and close before the whole request arrived. Only HTTP/1.1: HTTP/2 multiplexes reads
and writes, so :class:`OneWriteTransport` keeps ``http2`` off.
"""
from __future__ import annotations

import socket
import ssl
from typing import Any, Iterable

import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable  # httpcore's own test of an idle connection

# Held writes are sent once they reach this many bytes, without waiting for a read.
FLUSH_BYTES = 64 * 1024

# TCP keep-alive as the ``anthropic`` SDK's default client sets it: a stream that waits minutes
# for a model notices a dead peer (60 s idle, then a probe every 60 s, 5 probes).
KEEPALIVE_OPTIONS: list[tuple[int, int, int]] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5)) if hasattr(socket, name)
]


class CoalescingStream(httpcore2.AsyncNetworkStream):
    """A network stream that sends held writes as one, before its next read (see the module)."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream):
        self._inner = inner
        # The socket, asked for once: anyio answers every ``extra()`` by building all of a
        # socket's attributes, a getpeername() call included, and the pool asks each idle
        # connection whether it is readable whenever a request comes or goes (py-spy, fifty
        # concurrent streams: ~5% of the event loop's time).
        self._socket: socket.socket | None = inner.get_extra_info("socket")
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
        if self._socket is not None:
            if info == "is_readable":
                return is_socket_readable(self._socket)
            if info == "socket":
                return self._socket
        return self._inner.get_extra_info(info)


class CoalescingBackend(httpcore2.AsyncNetworkBackend):
    """Connects through ``inner`` (anyio by default) and wraps each stream in :class:`CoalescingStream`."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend | None = None):
        self._inner = inner or httpcore2.AnyIOBackend()

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

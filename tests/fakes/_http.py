"""Shared machinery for the scripted fake provider servers (stdlib only).

A :class:`ScriptedHTTPServer` runs a ``ThreadingHTTPServer`` (HTTP/1.1,
keep-alive, chunked streaming) on ``127.0.0.1`` with an OS-assigned port in a
daemon thread.  Subclasses implement :meth:`ScriptedHTTPServer.handle` to turn a
:class:`RecordedRequest` into a wire response using the :class:`Exchange` helper.

Scripting: responses are queued with ``script(*responses)`` / ``push(response)``
and consumed one per *scripted* request (requests the fake rejects on its own,
e.g. malformed bodies or unknown paths, do not consume the queue).  A response
object may carry a ``times`` attribute (default 1): it then answers that many
consecutive requests before the next queued response is used, which is how a
repeated error is scripted against a client that retries.
"""

from __future__ import annotations

import collections
import itertools
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qs, urlsplit


class QuietHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print a traceback when a client hangs up early
    (tests cut connections on purpose: timeouts, cancelled runs, refused redirects)."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it reached the fake server."""

    method: str
    path: str  # path without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # header names lower-cased
    body: bytes
    json: Any = None  # parsed JSON body, or None when absent / not JSON
    index: int = 0  # 0-based arrival order

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    @property
    def api_key(self) -> str | None:
        """The credential sent: ``x-api-key``, else the ``Authorization: Bearer`` token
        (anthropic 2.12.0 sends ``api_key`` as ``Authorization: Bearer <key>``)."""
        if self.headers.get("x-api-key"):
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization") or ""
        return auth[7:] if auth[:7].lower() == "bearer " else (auth or None)


# Fault kinds understood by Exchange.run_fault / the streaming writers.
FAULT_ERROR = "error"
FAULT_STALL = "stall"
FAULT_DISCONNECT = "disconnect"


@dataclass
class Fault:
    """Something that goes wrong part-way through a streamed response.

    ``after``: how many stream items (SSE events / NDJSON lines) are written
    before the fault fires; ``None`` lets the response pick a sensible default
    (just after the first content chunk).
    """

    kind: str
    after: int | None = None
    error_type: str | None = None  # FAULT_ERROR: provider error type
    message: str | None = None  # FAULT_ERROR: message
    release: threading.Event = field(default_factory=threading.Event)  # FAULT_STALL


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeProvider/1.0"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.fake._untrack(self.connection)  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep test output clean

    def _dispatch(self) -> None:
        fake: ScriptedHTTPServer = self.server.fake  # type: ignore[attr-defined]
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        request = fake._record(self, body)
        exchange = Exchange(self, fake)
        try:
            fake.handle(request, exchange)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away mid-response
        except OSError:
            self.close_connection = True
        except Exception as exc:  # a bug in a scripted response / the fake itself
            with fake._cond:
                fake._errors.append(exc)
            self.close_connection = True
            if exchange.started:
                exchange.abort()
            else:
                try:
                    exchange.send_json(500, {"error": f"fake server error: {exc!r}"}, {"x-should-retry": "false"})
                except OSError:
                    pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _dispatch


class Exchange:
    """Writes one response on the handler's connection."""

    def __init__(self, handler: _Handler, fake: "ScriptedHTTPServer") -> None:
        self._h = handler
        self._fake = fake
        self._chunked = False
        self.started = False  # status line already sent

    # -- whole responses -------------------------------------------------
    def send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        h = self._h
        self.started = True
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
            h.wfile.flush()

    def send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self.send_bytes(status, data, "application/json", headers)

    # -- chunked streaming ------------------------------------------------
    def start_stream(self, status: int, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        h = self._h
        self.started = True
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Cache-Control", "no-cache")
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.end_headers()
        self._chunked = True

    def write_chunk(self, data: bytes) -> None:
        if not data:
            return
        w = self._h.wfile
        w.write(b"%X\r\n%s\r\n" % (len(data), data))
        w.flush()

    def end_stream(self) -> None:
        self._h.wfile.write(b"0\r\n\r\n")
        self._h.wfile.flush()
        self._chunked = False

    # -- faults -------------------------------------------------------------
    def abort(self) -> None:
        """Drop the connection abruptly (no terminating chunk / no response)."""
        h = self._h
        h.close_connection = True
        try:
            h.wfile.flush()
        except OSError:
            pass
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stall(self, release: threading.Event) -> bool:
        """Block until ``release`` is set or the server closes.

        Returns True if the caller may carry on (released), False if the
        server is shutting down (the caller should then :meth:`abort`).
        """
        return self._fake._stall(release)

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` unless the server closes first; False on close."""
        if seconds <= 0:
            return not self._fake._closing.is_set()
        return not self._fake._closing.wait(seconds)

    @property
    def closing(self) -> bool:
        return self._fake._closing.is_set()


_DEFAULT = object()


class ScriptedHTTPServer:
    """Base class: lifecycle, request recording and the response queue."""

    #: prefix used for generated ids (request ids etc.)
    id_prefix = "fake"

    def __init__(self, default: Any = _DEFAULT) -> None:
        self._cond = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._queue: collections.deque[list[Any]] = collections.deque()  # [response, remaining]
        self._unscripted: list[RecordedRequest] = []
        self._errors: list[BaseException] = []
        self._closing = threading.Event()
        self._stalls: set[threading.Event] = set()
        self._conns: set[socket.socket] = set()
        self._counter = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.default = self.default_response() if default is _DEFAULT else default

    # -- to override ----------------------------------------------------------
    def default_response(self) -> Any:  # pragma: no cover - overridden
        return None

    def handle(self, request: RecordedRequest, exchange: Exchange) -> None:  # pragma: no cover
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> "ScriptedHTTPServer":
        if self._httpd is not None:
            return self
        self._closing.clear()
        httpd = QuietHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        httpd.fake = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"{type(self).__name__}-{httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        with self._cond:
            self._closing.set()
            stalls = list(self._stalls)
            conns = list(self._conns)
        for ev in stalls:
            ev.set()
        httpd.shutdown()
        httpd.server_close()
        for conn in conns:  # wake handlers blocked on keep-alive reads
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- scripting --------------------------------------------------------------
    def script(self, *responses: Any) -> "ScriptedHTTPServer":
        """Append responses to the queue (each consumed by one request, or
        ``response.times`` requests)."""
        with self._cond:
            for r in responses:
                times = int(getattr(r, "times", 1) or 1)
                self._queue.append([r, times])
        return self

    def push(self, response: Any) -> "ScriptedHTTPServer":
        return self.script(response)

    def clear_script(self) -> None:
        with self._cond:
            self._queue.clear()

    @property
    def pending(self) -> int:
        """Number of requests the remaining script will still answer."""
        with self._cond:
            return sum(remaining for _, remaining in self._queue)

    def next_response(self, request: RecordedRequest) -> Any:
        """Pop the response for ``request`` (the default when the queue is empty)."""
        with self._cond:
            if self._queue:
                slot = self._queue[0]
                slot[1] -= 1
                if slot[1] <= 0:
                    self._queue.popleft()
                return slot[0]
            self._unscripted.append(request)
            return self.default

    # -- recording --------------------------------------------------------------
    def _record(self, handler: _Handler, body: bytes) -> RecordedRequest:
        parts = urlsplit(handler.path)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        with self._cond:
            req = RecordedRequest(
                method=handler.command,
                path=parts.path,
                query=parse_qs(parts.query),
                headers=headers,
                body=body,
                json=parsed,
                index=len(self._requests),
            )
            self._requests.append(req)
            self._cond.notify_all()
        return req

    @property
    def requests(self) -> list[RecordedRequest]:
        """Snapshot of every request received so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest | None:
        with self._cond:
            return self._requests[-1] if self._requests else None

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised inside the fake while answering (answered with a 500
        carrying ``x-should-retry: false``, or a dropped connection mid-stream)."""
        with self._cond:
            return list(self._errors)

    @property
    def unscripted_requests(self) -> list[RecordedRequest]:
        """Requests answered with the default because the script was empty."""
        with self._cond:
            return list(self._unscripted)

    def requests_to(self, path: str, method: str | None = None) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path and (method is None or r.method == method)]

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests arrived; return the snapshot.

        Raises ``TimeoutError`` if they did not arrive within ``timeout`` s.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout=timeout):
                raise TimeoutError(
                    f"{type(self).__name__}: expected {n} request(s) within {timeout}s, got {len(self._requests)}"
                )
            return list(self._requests)

    def reset(self) -> None:
        """Forget recorded requests and the remaining script."""
        with self._cond:
            self._requests.clear()
            self._unscripted.clear()
            self._errors.clear()
            self._queue.clear()

    # -- stalls -------------------------------------------------------------------
    def release_stalls(self) -> None:
        """Release every stream currently stalled (they then carry on)."""
        with self._cond:
            stalls = list(self._stalls)
        for ev in stalls:
            ev.set()

    def _stall(self, release: threading.Event) -> bool:
        with self._cond:
            if self._closing.is_set():
                return False
            self._stalls.add(release)
        try:
            release.wait()
        finally:
            with self._cond:
                self._stalls.discard(release)
        return not self._closing.is_set()

    # -- connections --------------------------------------------------------------
    def _track(self, conn: socket.socket) -> None:
        with self._cond:
            self._conns.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._cond:
            self._conns.discard(conn)

    def next_id(self) -> int:
        return next(self._counter)


def split_text(text: str, chunks: int) -> list[str]:
    """Split ``text`` into ``chunks`` contiguous, non-empty pieces (fewer if too short)."""
    chunks = max(1, int(chunks))
    if not text:
        return [""]
    n = min(chunks, len(text))
    size, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


def as_chunks(value: str | Iterable[str]) -> list[str]:
    if isinstance(value, str):
        return [value]
    return list(value)

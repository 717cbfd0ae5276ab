"""A scripted HTTP server speaking the seed-004 MCP bridge protocol: ``POST /invoke``.

The bridge sends ``{"tool": <name>, "args": {...}}``; the fake answers with the response set for
that tool name (``respond``), else the default response, and records every request::

    with McpInvokeServer() as server:
        server.respond("backtest", body='{"pnl": 12.5}')
        server.respond("crash", status=500, body="boom")
        ...  # point the bridge at server.url
        assert server.requests[0].json == {"tool": "backtest", "args": {...}}
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes._http import QuietHTTPServer


@dataclass(frozen=True)
class InvokeResponse:
    status: int = 200
    body: str = ""
    content_type: str = "application/json"


@dataclass(frozen=True)
class InvokeRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any  # parsed body, or None when it was not JSON


class McpInvokeServer:
    """Serves ``/invoke`` on 127.0.0.1 (port chosen by the OS) from a daemon thread."""

    def __init__(self, default: InvokeResponse | None = None) -> None:
        self.default = default or InvokeResponse(body='{"ok": true}')
        self._responses: dict[str, InvokeResponse] = {}
        self._requests: list[InvokeRequest] = []
        self._lock = threading.Lock()
        self._httpd = QuietHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="mcp-invoke-fake", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[InvokeRequest]:
        with self._lock:
            return list(self._requests)

    def respond(self, tool: str, *, status: int = 200, body: str | dict | list = "",
                content_type: str = "application/json") -> None:
        """Answer calls of ``tool`` with this status and body (dicts/lists are sent as JSON)."""
        if not isinstance(body, str):
            body = json.dumps(body)
        with self._lock:
            self._responses[tool] = InvokeResponse(status, body, content_type)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "McpInvokeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record_and_pick(self, request: InvokeRequest) -> InvokeResponse:
        with self._lock:
            self._requests.append(request)
            if request.path != "/invoke" or request.method != "POST":
                return InvokeResponse(404, json.dumps({"error": "not found"}))
            if not isinstance(request.json, dict):
                return InvokeResponse(400, json.dumps({"error": "body must be a JSON object"}))
            return self._responses.get(str(request.json.get("tool")), self.default)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self._serve()

            def do_GET(self) -> None:
                self._serve()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                request = InvokeRequest(
                    method=self.command,
                    path=self.path.split("?", 1)[0],
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    json=parsed,
                )
                response = server._record_and_pick(request)
                payload = response.body.encode("utf-8")
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        return Handler

"""Fixtures for the built-in tool tests: a workspace, a tool context, settings, a web server."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

from tests.fakes._http import QuietHTTPServer

from tools_app import conf
from tools_app.registry import ToolContext


@pytest.fixture(autouse=True)
def tool_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Settings the tools read, overridable per test whether or not Django is configured."""
    overrides: dict[str, Any] = {
        "TOOL_TIMEOUT": 10,
        "TOOL_OUTPUT_LIMIT": 50_000,
        "WEB_FETCH_TIMEOUT": 5,
        "WEB_FETCH_MAX_BYTES": 1_000_000,
        "WEB_FETCH_ALLOW_PRIVATE": False,
        "MCP_BRIDGE_TIMEOUT": 5,
    }
    original = conf.setting
    monkeypatch.setattr(conf, "setting", lambda name, default: overrides[name] if name in overrides else original(name, default))
    return overrides


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return Path(os.path.realpath(path))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret the tools must never reach."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("TOP-SECRET")
    return Path(os.path.realpath(path))


@pytest.fixture
def context(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, agent_role="tester", run_id="run-1", tool_call_id="call-1")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.02)
    return True


async def async_wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
def process_helpers() -> SimpleNamespace:
    """pid_alive / wait_for / async_wait_for, as a fixture so tests need not import conftest."""
    return SimpleNamespace(pid_alive=pid_alive, wait_for=wait_for, async_wait_for=async_wait_for)


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class LocalWebServer:
    """A tiny scripted web server on 127.0.0.1 for ``web_fetch`` tests; records each request."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._httpd = QuietHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def route(self, path: str, *, status: int = 200, body: bytes | str = b"", headers: dict[str, str] | None = None) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.routes[path] = Route(status, data, dict(headers or {}))

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                route = server.routes.get(self.path, Route(404, b"not found", {"Content-Type": "text/plain"}))
                self.send_response(route.status)
                for name, value in route.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def web_server() -> Iterator[LocalWebServer]:
    server = LocalWebServer()
    try:
        yield server
    finally:
        server.close()

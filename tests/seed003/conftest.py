"""Seed-003 fixtures: Claude pointed at the scripted Anthropic server, real MCP servers, and an
ASGI client that drives Django's real ASGI handler (so a client disconnect is a real one)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator

from tests.fakes.mcp_server import McpHttpServer, stdio_config

ANALYST = "dev_efficiency_analyst"  # the default agent on the claude engine
MODEL = "claude-test-1"


@pytest.fixture
def claude_model() -> str:
    return MODEL


@pytest.fixture
def mcp_stdio(settings):
    """Config for the test MCP server over stdio (name ``calc``)."""
    settings.MCP_CONNECT_TIMEOUT = 20.0
    return stdio_config("calc")


@pytest.fixture
def mcp_http(settings):
    settings.MCP_CONNECT_TIMEOUT = 20.0
    with McpHttpServer("calc") as server:
        yield server


def register_mcp_server(spec: dict[str, Any], *, agent_role: str | None = ANALYST, always: bool = True,
                        **fields: Any):
    """An admin's ``McpServer`` row made from an ``McpToolset``-style spec, linked to an agent."""
    from agents_app.models import Agent
    from tools_app.mcp_client import validate_mcp_servers
    from tools_app.mcp_import import row_fields
    from tools_app.models import AgentMcpServer, McpServer

    (valid,) = validate_mcp_servers([spec])
    server = McpServer.objects.create(name=valid["name"], **{**row_fields(valid), "trusted": valid.get("trusted", False),
                                                              **fields})
    if agent_role:
        AgentMcpServer.objects.create(agent=Agent.objects.get(role=agent_role), server=server, always=always)
    return server


aregister_mcp_server = sync_to_async(register_mcp_server)


# --- SSE over the real ASGI handler --------------------------------------------------------------

@dataclass
class SseEvent:
    event: str
    data: Any


@dataclass
class SseStream:
    """One POST through Django's ASGI handler, read frame by frame."""

    communicator: ApplicationCommunicator
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    more: bool = True
    _buffer: str = ""

    async def start(self, timeout: float = 10.0) -> "SseStream":
        message = await self.communicator.receive_output(timeout)
        assert message["type"] == "http.response.start", message
        self.status = message["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        return self

    async def _read(self, timeout: float) -> bool:
        if not self.more:
            return False
        message = await self.communicator.receive_output(timeout)
        assert message["type"] == "http.response.body", message
        chunk = message.get("body", b"")
        self.body += chunk
        self._buffer += chunk.decode()
        self.more = message.get("more_body", False)
        return True

    async def next_event(self, timeout: float = 10.0) -> SseEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while "\n\n" in self._buffer:
                frame, self._buffer = self._buffer.split("\n\n", 1)
                parsed = parse_frame(frame)
                if parsed is not None:
                    return parsed
            if not await self._read(max(0.01, deadline - loop.time())):
                return None

    async def events(self, timeout: float = 15.0) -> list[SseEvent]:
        out = []
        while (event := await self.next_event(timeout)) is not None:
            out.append(event)
        return out

    async def read_all(self, timeout: float = 10.0) -> bytes:
        while await self._read(timeout):
            pass
        return self.body

    async def json(self) -> Any:
        return json.loads(await self.read_all())

    async def disconnect(self) -> None:
        await self.communicator.send_input({"type": "http.disconnect"})

    async def close(self) -> None:
        try:
            await self.communicator.wait(5)
        except BaseException:  # noqa: BLE001 - best effort teardown
            pass


def parse_frame(frame: str) -> SseEvent | None:
    """``event: <type>`` + ``data: <json>``; comment-only frames (pings) give None."""
    event, data = None, []
    for line in frame.split("\n"):
        if line.startswith(":") or not line:
            continue
        key, _, value = line.partition(": ")
        if key == "event":
            event = value
        elif key == "data":
            data.append(value)
        else:
            raise AssertionError(f"unexpected SSE line {line!r}")
    if event is None and not data:
        return None
    assert event, f"frame without an event name: {frame!r}"
    return SseEvent(event, json.loads("\n".join(data)))


async def open_stream(path: str, *, token: str | None, body: Any = None, raw: bytes | None = None,
                      accept: str = "text/event-stream") -> SseStream:
    from orchestrator_site.asgi import application

    payload = raw if raw is not None else json.dumps(body).encode()
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json"), (b"accept", accept.encode()),
               (b"content-length", str(len(payload)).encode())]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": payload, "more_body": False})
    return await SseStream(communicator).start()


def stream_path(conversation_id: str) -> str:
    return f"/conversations/{conversation_id}/messages/stream"

"""Fixtures for the agent-chat contract: an async client, an SSE reader, two real servers."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
VERCEL_DIR = Path(__file__).resolve().parent / "vercel"
WRITE_TOOL = '/tool write_file {"path": "notes.txt", "content": "hello from the tool"}'


# --- SSE parsing ---------------------------------------------------------------------------------

@dataclass
class Frame:
    """One SSE message: ``id`` (None when absent), the joined ``data`` text, or a comment."""

    id: str | None
    data: str | None
    comment: str | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.data) if self.data is not None else None

    @property
    def event(self) -> str | None:
        """The seed-001 event name (``data.event``)."""
        body = self.json
        return body.get("event") if isinstance(body, dict) else None

    @property
    def payload(self) -> dict[str, Any]:
        return self.json["data"]


def parse_block(block: str) -> Frame | None:
    frame_id, data, comment = None, [], None
    for line in block.split("\n"):
        if line.startswith(":"):
            comment = line[1:].strip()
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            frame_id = value
        elif field == "data":
            data.append(value)
    if not data and comment is None and frame_id is None:
        return None
    return Frame(id=frame_id, data="\n".join(data) if data else None, comment=comment)


def parse_sse(text: str) -> list[Frame]:
    return [f for f in (parse_block(b) for b in text.replace("\r\n", "\n").split("\n\n")) if f is not None]


class SseReader:
    """Reads frames from a Django (Async)Client streaming response as they arrive."""

    def __init__(self, response: Any):
        self.response = response
        self._iter = response.streaming_content.__aiter__()
        self._buffer = ""
        self.raw = ""
        self.frames: list[Frame] = []
        self.ended = False

    async def next(self, timeout: float = 10.0) -> Frame | None:
        while "\n\n" not in self._buffer:
            if self.ended:
                return None
            try:
                chunk = await asyncio.wait_for(self._iter.__anext__(), timeout)
            except StopAsyncIteration:
                self.ended = True
                continue
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            self.raw += text
            self._buffer += text
        block, self._buffer = self._buffer.split("\n\n", 1)
        frame = parse_block(block)
        if frame is None:
            return await self.next(timeout)
        self.frames.append(frame)
        return frame

    async def until(self, predicate, timeout: float = 10.0) -> Frame:
        """Frames up to and including the first one matching ``predicate``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            frame = await self.next(max(0.01, deadline - loop.time()))
            if frame is None:
                raise AssertionError(f"stream ended before the expected frame; got {[f.data for f in self.frames]}")
            if predicate(frame):
                return frame

    async def rest(self, timeout: float = 15.0) -> list[Frame]:
        """All remaining frames until the stream ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.next(max(0.01, deadline - loop.time())) is not None:
            pass
        return self.frames

    async def close(self) -> None:
        """Like a client going away mid-stream."""
        aclose = getattr(self._iter, "aclose", None)
        if aclose is not None:
            await aclose()


def events_of(frames: list[Frame]) -> list[Frame]:
    """Seed-001 messages only (no comments)."""
    return [f for f in frames if f.data is not None]


class ListSubscription:
    """A subscription over recorded events: one event per batch (a reader that keeps up), or
    everything in one batch (``batch=True``: a reader that fell behind)."""

    def __init__(self, events, *, batch: bool = False):
        self.batches = [list(events)] if batch else [[e] for e in events]

    async def next(self, deadline=None):
        return self.batches.pop(0) if self.batches else None

    async def close(self):
        return None


async def render(dialect_cls, events, *, batch: bool = False, run_id: str = "run-1", conversation_id: str = "conv-1",
                 **options) -> list:
    """All frames a dialect gives for a recorded sequence, through the one stream function."""
    from chat_app.transports import stream_run

    dialect = dialect_cls(run_id=run_id, conversation_id=conversation_id, **options)
    return [frame async for frames in stream_run(dialect, ListSubscription(events, batch=batch), ping_interval=60)
            for frame in frames]


def merged_run_events(frames: list[Frame]) -> list[tuple[int, str, dict]]:
    """``(seq, event, payload)`` of the run's events with consecutive ``agent.delta`` merged (text
    joined, the last seq kept): how a stream may cut the text depends on how fast it was read."""
    out: list[tuple[int, str, dict]] = []
    for frame in run_events_of(frames):
        seq, name, payload = int(frame.id), frame.event, dict(frame.payload)
        if name == "agent.delta" and out and out[-1][1] == "agent.delta" and out[-1][2].get("agent") == payload.get("agent"):
            payload = {**out[-1][2], "text": out[-1][2]["text"] + payload["text"]}
            out[-1] = (seq, name, payload)
        else:
            out.append((seq, name, payload))
    return out


def run_events_of(frames: list[Frame]) -> list[Frame]:
    """The run's own events (they carry the run-log seq): no comments, pings or conversation.created."""
    return [f for f in frames if f.data is not None and f.event not in ("ping", "conversation.created")]


def tool_states(frames: list[Frame]) -> list[str]:
    return [f.payload["status"] for f in frames if f.data and f.event == "tool.state"]


# --- clients -------------------------------------------------------------------------------------

class AsgiResponse:
    """A response read from the ASGI application as a server would: headers first, then body chunks."""

    def __init__(self, start: dict[str, Any], outbox: asyncio.Queue, inbox: asyncio.Queue, task: asyncio.Task):
        self.status_code = start["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        self._outbox, self._inbox, self._task = outbox, inbox, task
        self._done = False
        self.content = b""

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name.lower(), default)

    async def _chunks(self):
        try:
            while not self._done:
                message = await self._outbox.get()
                if message["type"] != "http.response.body":
                    continue
                self._done = not message.get("more_body", False)
                if message.get("body"):
                    self.content += message["body"]
                    yield message["body"]
        finally:
            if not self._done:  # the reader stopped early: the client goes away
                await self._inbox.put({"type": "http.disconnect"})
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._task), 10)

    @property
    def streaming_content(self):
        return self._chunks()

    async def read(self) -> bytes:
        async for _ in self._chunks():
            pass
        return self.content

    def json(self) -> Any:
        return json.loads(self.content)


class AsgiClient:
    """Calls the project's ASGI app like daphne does (per-request thread-sensitive context, client
    disconnect as ``http.disconnect``), unlike django.test.AsyncClient, which shares one thread.

    The app is the served one: the stream lane in front of Django's handler, so token requests
    to the streaming views take the lane, as they do in production."""

    def __init__(self):
        from orchestrator_site.asgi_handler import OrchestratorASGIHandler
        from orchestrator_site.stream_lane import StreamLane

        self.app = StreamLane(OrchestratorASGIHandler())

    async def request(self, method: str, path: str, *, body: bytes = b"", headers: dict[str, str] | None = None,
                      read: bool = True) -> AsgiResponse:
        path, _, query = path.partition("?")
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
            "headers": [(k.lower().encode(), v.encode())
                        for k, v in {**(headers or {}), "Content-Length": str(len(body))}.items()],
            "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        }
        inbox: asyncio.Queue = asyncio.Queue()
        outbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": body, "more_body": False})
        task = asyncio.create_task(self.app(scope, inbox.get, outbox.put))
        getter = asyncio.ensure_future(outbox.get())
        done, _ = await asyncio.wait({getter, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            if task.done():
                task.result()
            raise AssertionError(f"no response to {method} {path} within 30 s")
        response = AsgiResponse(getter.result(), outbox, inbox, task)
        streaming = response.get("content-type", "").startswith("text/event-stream") and response.status_code == 200
        if read and not streaming:
            await response.read()
        return response


class ChatClient:
    """An ASGI client bound to a user's token, with helpers for the agent-chat endpoints."""

    def __init__(self, token: str):
        self.client = AsgiClient()
        self.headers = {"Authorization": f"Token {token}"}

    async def post_json(self, path: str, body: Any = None, **headers: str) -> AsgiResponse:
        raw = body if isinstance(body, bytes) else json.dumps(body if body is not None else {}).encode()
        return await self.client.request("POST", path, body=raw, headers={
            "Content-Type": "application/json", **self.headers, **_header_names(headers)})

    async def get(self, path: str, **headers: str) -> AsgiResponse:
        return await self.client.request("GET", path, headers={**self.headers, **_header_names(headers)})

    async def chat(self, body: Any, *, query: str = "", **headers: str) -> SseReader:
        response = await self.post_json(f"/v1/agent/chat{query}", body, **headers)
        assert response.status_code == 200, response.content[:500]
        return SseReader(response)

    async def events(self, run_id: str, *, query: str = "", **headers: str) -> SseReader:
        response = await self.get(f"/v1/agent/runs/{run_id}/events{query}", **headers)
        assert response.status_code == 200, response.content[:500]
        return SseReader(response)

    async def json(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        response = await (self.post_json(path, body) if method == "POST" else self.get(path))
        return response.status_code, response.json()


def _header_names(headers: dict[str, str]) -> dict[str, str]:
    # Python keyword arguments cannot hold dashes: Last_Event_ID → Last-Event-ID.
    return {k.replace("_", "-"): v for k, v in headers.items()}


@pytest.fixture
def chat(token) -> ChatClient:
    return ChatClient(token)


@pytest.fixture
def other_chat(other_user) -> ChatClient:
    from rest_framework.authtoken.models import Token

    return ChatClient(Token.objects.get_or_create(user=other_user)[0].key)


# --- the ai npm package --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def ai_sdk() -> Path:
    """The tests/agent_chat/vercel node project with the ``ai`` package installed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the AI SDK stream check needs node and the ai npm package")
    if not (VERCEL_DIR / "node_modules" / "ai").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: cannot install the ai npm package for the stream check")
        result = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=VERCEL_DIR, capture_output=True,
                                text=True, timeout=300)
        if result.returncode != 0:
            pytest.fail(f"npm ci in {VERCEL_DIR} failed (the ai package is needed):\n{result.stderr[-3000:]}")
    return VERCEL_DIR


def parse_with_ai_sdk(ai_dir: Path, stream_text: str, message: dict | None = None) -> dict[str, Any]:
    """Runs the ai package's own parser on a recorded stream; returns {chunks, message, errors}."""
    payload = json.dumps({"stream": stream_text, "message": message})
    result = subprocess.run(["node", str(ai_dir / "parse_stream.mjs")], input=payload, capture_output=True,
                            text=True, timeout=60, cwd=ai_dir)
    assert result.returncode == 0, f"node parser failed: {result.stderr}\n{result.stdout}"
    return json.loads(result.stdout)


# --- two real servers ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_url() -> str | None:
    """A Redis database number for this test session, or None when no Redis answers."""
    try:
        import redis
    except ImportError:
        return None
    base = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
    db = 9 + (os.getpid() % 6)
    url = f"{base.rstrip('/')}/{db}"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None
    return url


def _postgres_database() -> tuple[str, Any] | None:
    """Creates a uniquely named PostgreSQL database; returns (url, drop) or None."""
    try:
        import psycopg
    except ImportError:
        return None
    admin = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"agentchat_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception:  # noqa: BLE001
        return None

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return admin.rsplit("/", 1)[0] + f"/{name}", drop


@dataclass
class ServerPair:
    a: str
    b: str
    token: str
    database: str
    redis_url: str
    workspaces: Path


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early ({proc.returncode}): {Path(proc.log_path).read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {url} did not become healthy within {timeout} s")


@pytest.fixture(scope="module")
def server_pair(tmp_path_factory) -> Iterator[ServerPair]:
    """Two daphne processes sharing one database (PostgreSQL if reachable, else a SQLite file)
    and one Redis channel layer; confirmations re-check rarely, so only the doorbell is fast."""
    redis_url = _redis_url()
    if redis_url is None:
        message = "Redis is not reachable on 127.0.0.1:6379 (set TEST_REDIS_URL): cross-process test needs it"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs nothing by hand: a missing Redis is a failure there
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("two_servers")
    pg = _postgres_database()
    database_url, drop = pg if pg else (f"sqlite:///{tmp / 'shared.sqlite3'}", None)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "WORKSPACES_ROOT": str(tmp / "workspaces"),
        "SSE_PING_INTERVAL": "0.5",
        # A lost doorbell would only be noticed after this long: the test must finish sooner.
        "CONFIRMATION_RECHECK_INTERVAL": "30",
        "CONFIRMATION_TIMEOUT": "60",
        "RUN_EVENT_FLUSH_INTERVAL": "0.05",
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_AUTH_TOKEN": "",
        "DJANGO_SETTINGS_MODULE": "orchestrator_site.settings",
        "PYTHONUNBUFFERED": "1",
    }
    procs: list[subprocess.Popen] = []
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env,
                       check=True, capture_output=True, timeout=120)
        script = ("from django.contrib.auth import get_user_model; from rest_framework.authtoken.models import Token; "
                  "from agents_app.defaults import load_default_agents; load_default_agents(); "
                  "u = get_user_model().objects.create_user('pair', password='pw-pair'); "
                  "print(Token.objects.create(user=u).key)")
        out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True, timeout=60)
        token = out.stdout.strip().splitlines()[-1]
        urls = []
        for _ in range(2):
            port = _free_port()
            log = open(tmp / f"daphne-{port}.log", "w")  # a file, not a pipe nobody drains
            proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "orchestrator_site.asgi:application"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
            )
            proc.log_path = tmp / f"daphne-{port}.log"  # type: ignore[attr-defined]
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            _wait_health(url, proc)
        yield ServerPair(a=urls[0], b=urls[1], token=token, database=database_url.split(":", 1)[0],
                         redis_url=redis_url, workspaces=tmp / "workspaces")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if drop is not None:
            drop()

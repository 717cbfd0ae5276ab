"""ACP tests: ``manage.py acp`` in a subprocess, driven by the ``agent-client-protocol`` package's
own client side (a real peer), or by raw lines for the error codes and the seed's aliases.

Each test gets its own SQLite file, copied from a template migrated once per session (default
agents loaded), its own workspaces, and the fake provider servers of ``tests/fakes`` through the
environment. The database file is read back with ``sqlite3`` to check what the runs recorded.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import acp
import pytest
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

from tests.conftest import subprocess_env

REPO = Path(__file__).resolve().parents[2]
MANAGE = str(REPO / "manage.py")
CLAUDE_AGENT = "dev_efficiency_analyst"  # engine claude: mock without a key, the fake server with one


def base_env(database: Path, workspaces: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return subprocess_env(database=database, workspaces=workspaces,
                          extra={"RUN_EVENT_FLUSH_INTERVAL": "0.05", **(extra or {})})


@pytest.fixture(scope="session")
def _acp_template(tmp_path_factory) -> Path:
    """A migrated SQLite file with the default agents (``migrate`` runs in a subprocess)."""
    root = tmp_path_factory.mktemp("acp-template")
    database = root / "template.sqlite3"
    env = base_env(database, root / "workspaces")
    for args in (["migrate", "--noinput"], ["load_default_agents"]):
        done = subprocess.run([sys.executable, MANAGE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    return database


@dataclass
class AcpSetup:
    """Where one test's agent process keeps its database, workspaces and log; ``env`` to add to."""

    database: Path
    workspaces: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def environ(self) -> dict[str, str]:
        return base_env(self.database, self.workspaces, self.env)

    def query(self, sql: str, *params: Any) -> list[tuple]:
        with sqlite3.connect(self.database, timeout=10) as db:
            return db.execute(sql, params).fetchall()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def acp_setup(_acp_template, tmp_path) -> AcpSetup:
    database = tmp_path / "acp.sqlite3"
    shutil.copyfile(_acp_template, database)
    return AcpSetup(database=database, workspaces=tmp_path / "workspaces", log=tmp_path / "acp-stderr.log")


@pytest.fixture
def with_claude(acp_setup, anthropic_server):
    """The Claude engine against the scripted Anthropic server."""
    acp_setup.env.update({"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": anthropic_server.url,
                          "ANTHROPIC_MODEL": "claude-test-default", "ANTHROPIC_MAX_RETRIES": "0",
                          "ANTHROPIC_TIMEOUT": "10"})
    return anthropic_server


@pytest.fixture
def with_ollama(acp_setup, ollama_server):
    """The Ollama engine (the seed-004 trio) against the scripted Ollama server."""
    acp_setup.env.update({"OLLAMA_URL": ollama_server.url, "OLLAMA_MODEL": "llama-test:8b", "OLLAMA_TIMEOUT": "5"})
    return ollama_server


# --- the client side --------------------------------------------------------------------------------

class RecordingClient(acp.Client):
    """An ACP client that records every ``session/update`` and answers permission requests with
    ``answer(tool_call) -> option id | "cancelled"`` (default: allow once)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permission_requests: list[Any] = []
        self.answer: Callable[[Any], str] = lambda tool_call: "allow_once"

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.permission_requests.append((session_id, tool_call, options))
        choice = self.answer(tool_call)
        if choice == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))

    def kinds(self, session_id: str | None = None) -> list[str]:
        return [u.session_update for s, u in self.updates if session_id is None or s == session_id]

    def of(self, kind: str, session_id: str | None = None) -> list[Any]:
        return [u for s, u in self.updates if u.session_update == kind and (session_id is None or s == session_id)]

    def text(self, kind: str = "agent_message_chunk", session_id: str | None = None) -> str:
        return "".join(u.content.text for u in self.of(kind, session_id))


@asynccontextmanager
async def acp_agent(setup: AcpSetup, *args: str, client: RecordingClient | None = None
                    ) -> AsyncIterator[tuple[Any, RecordingClient]]:
    """``manage.py acp <args>`` connected to a :class:`RecordingClient`; yields (connection, client)."""
    client = client or RecordingClient()
    with open(setup.log, "ab") as log:
        try:
            async with acp.spawn_agent_process(client, sys.executable, MANAGE, "acp", *args, env=setup.environ(),
                                               cwd=REPO, transport_kwargs={"stderr": log.fileno()}) as (conn, _proc):
                yield conn, client
        except BaseException:
            sys.stderr.write(f"--- acp stderr ---\n{setup.log_text()[-6000:]}\n")
            raise


async def wait_until(predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.02) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


# --- raw lines ------------------------------------------------------------------------------------------

class RawAgent:
    """``manage.py acp`` fed raw lines; every stdout line must be a JSON-RPC message."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.received: list[dict[str, Any]] = []

    async def send(self, line: str | dict[str, Any]) -> None:
        text = line if isinstance(line, str) else json.dumps(line)
        self.process.stdin.write(text.encode() + b"\n")
        await self.process.stdin.drain()

    async def next(self, predicate: Callable[[dict[str, Any]], bool] = lambda m: True, *, timeout: float = 20.0
                   ) -> dict[str, Any]:
        """The first message (already received or next) matching ``predicate``."""
        for message in self.received:
            if predicate(message):
                return message
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), max(0.01, deadline - loop.time()))
            assert line, "the agent closed stdout"
            message = json.loads(line)  # stdout carries protocol lines only
            assert message.get("jsonrpc") == "2.0", message
            self.received.append(message)
            if predicate(message):
                return message

    async def response(self, id_: Any, **kwargs: Any) -> dict[str, Any]:
        return await self.next(lambda m: "method" not in m and m.get("id") == id_, **kwargs)


@asynccontextmanager
async def raw_agent(setup: AcpSetup, *args: str) -> AsyncIterator[RawAgent]:
    with open(setup.log, "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, MANAGE, "acp", *args, cwd=REPO, env=setup.environ(), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=log.fileno(), limit=2**24)
        try:
            yield RawAgent(process)
        except BaseException:
            sys.stderr.write(f"--- acp stderr ---\n{setup.log_text()[-6000:]}\n")
            raise
        finally:
            if process.returncode is None:
                process.stdin.close()
                try:
                    await asyncio.wait_for(process.wait(), 15)
                except TimeoutError:
                    process.kill()
                    await process.wait()

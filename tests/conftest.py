"""Shared fixtures: users with tokens, an isolated workspace root, the fake provider servers."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fakes.fixtures import anthropic_server, ollama_server  # noqa: F401


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """SQLite tests use a database file (WAL + busy timeout, as the server does), not shared-cache
    memory: there, a request thread reading while a run's thread writes fails at once with
    "database table is locked" instead of waiting, which daphne-like tests hit."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith(".sqlite3"):
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.getbasetemp() / "test-db.sqlite3")


@pytest.fixture(scope="session", autouse=True)
def _close_async_db_connections(django_db_setup):
    """Async tests reach the ORM through asgiref's one shared thread; close its connection before
    the test database is dropped (PostgreSQL refuses to drop a database still in use)."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
    from chat_app.eventlog import close_pool_connections

    close_pool_connections()


@pytest.fixture(autouse=True)
def _isolated_settings(settings, tmp_path: Path):
    """Every test gets its own workspaces and fast timers; nothing leaks between tests."""
    settings.WORKSPACES_ROOT = tmp_path / "workspaces"
    settings.RUN_EVENT_FLUSH_INTERVAL = 0.05
    settings.CONFIRMATION_RECHECK_INTERVAL = 0.2
    settings.ANTHROPIC_API_KEY = ""
    settings.ANTHROPIC_BASE_URL = None
    # Tests change agents and tokens with queryset updates (no signals): no reuse between requests.
    settings.AUTH_TOKEN_CACHE_SECONDS = 0
    settings.AGENT_CACHE_SECONDS = 0
    from agents_app import router
    from agents_app.engines.ollama import OLLAMA_PROBE

    router._warned.clear()
    OLLAMA_PROBE.clear()
    from agents_app.providers.health import reset_health
    from agents_app.providers.pricing import _genai_price  # noqa: F401  (cached: prices do not change)

    reset_health()  # cooldowns and error counts are per process: none carried between tests
    # Each test runs on its own event loop: a channel layer (channels-redis keeps receive locks
    # and connection pools per loop) must not carry state from the previous test's loop.
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield settings


@pytest.fixture
def claude_model() -> str:
    """The model name Claude runs ask for; override per folder to test free-text model names."""
    return "saas/claude-sonnet-4.5"


@pytest.fixture
def claude(settings, anthropic_server, agents, claude_model):
    """Claude runs use the real anthropic SDK against the scripted ``anthropic_server``."""
    settings.ANTHROPIC_API_KEY = "test-key"
    settings.ANTHROPIC_AUTH_IS_BEARER = False
    settings.ANTHROPIC_BASE_URL = anthropic_server.url
    settings.ANTHROPIC_MODEL = claude_model
    settings.ANTHROPIC_MAX_RETRIES = 0
    settings.ANTHROPIC_TIMEOUT = 10.0
    return anthropic_server


@pytest.fixture
def agents(db):
    """The default agents (transactional tests flush the rows the data migration made)."""
    from agents_app.defaults import load_default_agents
    from agents_app.models import Agent

    load_default_agents()
    return {a.role: a for a in Agent.objects.all()}


@pytest.fixture
def make_user(db, agents, django_user_model) -> Callable[..., Any]:
    def make(username: str = "alice"):
        return django_user_model.objects.create_user(username=username, password="pw-" + username)

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def other_user(make_user):
    return make_user("bob")


def _token_for(user) -> str:
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def token(user) -> str:
    return _token_for(user)


@pytest.fixture
def api(user, token):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def other_api(other_user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {_token_for(other_user)}")
    return client


async def wait_for(predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Await until ``predicate()`` (sync or async) is truthy; fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def merged_content_deltas(events: list[dict]) -> list[dict]:
    """Seed-000 objects with consecutive ``content_delta`` merged: deltas that arrive faster than a
    client reads may be sent as one, so tests compare the text, not how it was cut."""
    out: list[dict] = []
    for event in events:
        if event.get("type") == "content_delta" and out and out[-1].get("type") == "content_delta":
            out[-1] = {**out[-1], "content": out[-1]["content"] + event["content"]}
        else:
            out.append(dict(event))
    return out


# Never inherited from the developer's shell by a server or command a test starts: tests choose
# their provider, database and workspaces explicitly.
SUBPROCESS_SCRUBBED = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL",
                       "REDIS_URL", "OLLAMA_URL", "OLLAMA_MODEL", "DEFAULT_AGENT_ENGINE", "DEFAULT_AGENT_ROLE",
                       "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "WORKSPACES_ROOT")


def subprocess_env(*, database: Path, workspaces: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a project process a test starts (daphne, ``manage.py acp``): a SQLite
    file, its own workspaces, fast re-checks, logs on; ``extra`` last."""
    import os

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in SUBPROCESS_SCRUBBED}
    env.update({
        "DJANGO_SETTINGS_MODULE": "orchestrator_site.settings",
        "DATABASE_URL": f"sqlite:///{database}",
        "WORKSPACES_ROOT": str(workspaces),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH", "")])),
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
        "CONFIRMATION_RECHECK_INTERVAL": "0.2",
    })
    env.update(extra or {})
    return env

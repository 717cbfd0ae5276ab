"""End-to-end fixtures: the real daphne server in a subprocess, on a free port, over real HTTP.

Reuse them from any test under ``tests/e2e/``:

``daphne_server`` (module scope) → :class:`LiveServer`
    A daphne process serving ``orchestrator_site.asgi:application`` on ``127.0.0.1:<free port>``
    with its own migrated SQLite database (default agents loaded, one user ``e2e`` with a DRF
    token, and a superuser ``e2e-admin`` / ``e2e-admin-password`` for the admin), its own ``WORKSPACES_ROOT``, the offline engines (no provider key: ``claude``
    agents fall back to ``mock``), and the in-memory channel layer. Use ``daphne_server.url``,
    ``daphne_server.auth`` (``{"Authorization": "Token <key>"}``) and ``daphne_server.workspaces``.
    (Not called ``live_server``: pytest-django owns that name.)

``live_server_url`` (module scope) → ``str``
    Just ``daphne_server.url``, e.g. ``http://127.0.0.1:54321``.

``start_daphne_server`` (function scope) → ``callable(env=None) -> LiveServer``
    Starts another server with extra environment variables, stopped after the test. Use it to
    point the server at a fake provider started in the test, e.g.::

        def test_x(start_daphne_server, anthropic_server):
            server = start_daphne_server(env={"ANTHROPIC_API_KEY": "test-key",
                                            "ANTHROPIC_BASE_URL": anthropic_server.url})

The database is migrated once per session (``manage.py migrate`` and ``load_default_agents``
and the user in subprocesses) into a template file copied for each server. Startup waits for
``GET /health`` to answer 200 (``E2E_START_TIMEOUT`` s, default 30); if daphne dies or does not
answer, the test fails with its log. The environment is scrubbed of provider credentials, so
an end-to-end test never reaches the internet.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests

from tests.conftest import subprocess_env

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = float(os.environ.get("E2E_START_TIMEOUT", "30"))



@dataclass
class LiveServer:
    url: str
    token: str
    workspaces: Path
    database: Path
    log: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}"}

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _base_env(*, database: Path, workspaces: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return subprocess_env(database=database, workspaces=workspaces,
                          extra={"SSE_PING_INTERVAL": "15", **(extra or {})})


def _manage(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


_CREATE_USER = (
    "from django.contrib.auth import get_user_model; from rest_framework.authtoken.models import Token; "
    "u = get_user_model().objects.create_user(username='e2e', password='e2e-password'); "
    "print('TOKEN=' + Token.objects.create(user=u).key); "
    "get_user_model().objects.create_superuser(username='e2e-admin', password='e2e-admin-password')"
)


@pytest.fixture(scope="session")
def _e2e_template(tmp_path_factory) -> tuple[Path, str]:
    """A migrated SQLite file with the default agents and the ``e2e`` user; and that user's token."""
    root = tmp_path_factory.mktemp("e2e-template")
    database = root / "template.sqlite3"
    env = _base_env(database=database, workspaces=root / "workspaces")
    _manage("migrate", "--noinput", env=env)
    _manage("load_default_agents", env=env)
    out = _manage("shell", "-c", _CREATE_USER, env=env)
    token = next(line[len("TOKEN="):] for line in out.splitlines() if line.startswith("TOKEN="))
    return database, token


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _copy_database(template: Path, target: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{template}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{target}{suffix}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def launch_live_server(directory: Path, template: tuple[Path, str], env: dict[str, str] | None = None) -> LiveServer:
    """Start daphne with a copy of the template database; returns once ``/health`` answers."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "db.sqlite3"
    _copy_database(template[0], database)
    workspaces = directory / "workspaces"
    workspaces.mkdir(exist_ok=True)
    full_env = _base_env(database=database, workspaces=workspaces, extra=env)
    last_error = ""
    for attempt in range(3):  # the free port can be taken between probing and binding
        port = _free_port()
        log = directory / f"daphne-{port}.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                 "orchestrator_site.asgi:application"],
                cwd=REPO, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
            )
        server = LiveServer(url=f"http://127.0.0.1:{port}", token=template[1], workspaces=workspaces,
                            database=database, log=log, process=process)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                    return server
            except requests.RequestException:
                pass
            time.sleep(0.1)
        _stop(process)
        last_error = server.log_text()
        if "Address already in use" not in last_error:
            break
    raise RuntimeError(f"daphne did not become healthy within {START_TIMEOUT:g} s; its log:\n{last_error}")


@pytest.fixture(scope="module")
def daphne_server(_e2e_template, tmp_path_factory) -> Iterator[LiveServer]:
    server = launch_live_server(tmp_path_factory.mktemp("e2e-server"), _e2e_template)
    try:
        yield server
    finally:
        _stop(server.process)


@pytest.fixture(scope="module")
def live_server_url(daphne_server: LiveServer) -> str:
    return daphne_server.url


@pytest.fixture
def start_daphne_server(_e2e_template, tmp_path) -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def start(env: dict[str, str] | None = None) -> LiveServer:
        server = launch_live_server(tmp_path / f"server-{len(started)}", _e2e_template, env)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            _stop(server.process)


@pytest.fixture(autouse=True)
def _isolated_settings():
    """End-to-end tests talk to a separate process: the in-process settings fixture does not apply."""
    yield None

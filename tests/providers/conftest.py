"""Provider tests: three scripted Anthropic-compatible servers (``a``, ``b``, ``c``), the scripted
Ollama server, a providers file written per test and imported with ``load_providers``."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from tests.fakes.anthropic_server import FakeAnthropicServer


@pytest.fixture
def servers() -> Iterator[dict[str, FakeAnthropicServer]]:
    started = {name: FakeAnthropicServer().start() for name in ("a", "b", "c")}
    try:
        yield started
    finally:
        for server in started.values():
            server.close()


@pytest.fixture
def dead_url() -> str:
    """A URL where nothing listens (a port bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def _provider_settings(settings, monkeypatch):
    settings.ANTHROPIC_TIMEOUT = 10.0
    # The SDK would retry 529/429 twice: tests show the router turns that off when it can fail over.
    settings.ANTHROPIC_MAX_RETRIES = 2
    settings.PROVIDER_HEALTH_TTL = 60.0
    settings.PROVIDER_PROBE_TIMEOUT = 2.0
    settings.PROVIDER_COOLDOWN_SECONDS = 30.0
    settings.PROVIDER_FAILURE_THRESHOLD = 3
    settings.PROVIDER_MAX_ATTEMPTS = 3
    for var in ("A_KEY", "B_KEY", "C_KEY"):
        monkeypatch.setenv(var, f"key-{var.lower()}-secret")
    return settings


def model(name: str, tier: str = "balanced", **extra: Any) -> dict[str, Any]:
    return {"name": name, "tier": tier, "context_window": 200000, **extra}


@pytest.fixture
def load(tmp_path: Path, agents) -> Callable[..., Any]:
    """``load(providers=[...], rules=[...], budgets=[...])``: write the file and import it."""
    from agents_app.providers.config import providers_load

    def write(*, providers: list[dict], rules: list[dict] | None = None, budgets: list[dict] | None = None) -> Path:
        data: dict[str, Any] = {"providers": providers}
        if rules is not None:
            data["routing"] = {"rules": rules}
        if budgets is not None:
            data["budgets"] = budgets
        path = tmp_path / "providers.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        providers_load(path=path)
        return path

    return write


def anthropic_provider(name: str, url: str, *models: dict, priority: int = 10, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "anthropic", "base_url": url, "api_key_env": f"{name.upper()}_KEY",
            "priority": priority, "models": list(models)} | extra


@pytest.fixture
def three(servers, load):
    """a (priority 10), b (20), c (30): one balanced model each, priced from the file."""
    load(providers=[
        anthropic_provider("a", servers["a"].url, model("model-a", input_price=1.0, output_price=5.0), priority=10),
        anthropic_provider("b", servers["b"].url, model("model-b", input_price=2.0, output_price=8.0), priority=20),
        anthropic_provider("c", servers["c"].url, model("model-c", input_price=0.5, output_price=1.0), priority=30),
    ])
    return servers

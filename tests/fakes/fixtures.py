"""Pytest fixtures for the fake provider servers.

Import them from a conftest, e.g.::

    from tests.fakes.fixtures import anthropic_server, ollama_server  # noqa: F401

Each yields a started server (function scope) and closes it after the test,
which also releases any stalled stream.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from .anthropic_server import FakeAnthropicServer
from .ollama_server import FakeOllamaServer

__all__ = ["anthropic_server", "ollama_server"]


@pytest.fixture
def anthropic_server() -> Iterator[FakeAnthropicServer]:
    server = FakeAnthropicServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def ollama_server() -> Iterator[FakeOllamaServer]:
    server = FakeOllamaServer().start()
    try:
        yield server
    finally:
        server.close()

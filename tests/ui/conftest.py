"""Fixtures for the browser-facing REST additions (reuses the agent-chat ASGI client)."""
from tests.agent_chat.conftest import chat, other_chat  # noqa: F401  (fixtures)

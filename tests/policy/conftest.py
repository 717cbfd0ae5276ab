"""Fixtures for the approval-policy tests: an analyst agent on the mock engine, a staff user,
the agent-chat clients (shared with tests/agent_chat), and a rule factory."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.agent_chat.conftest import ai_sdk, chat, other_chat  # noqa: F401  (fixtures)

ROLE = "dev_efficiency_analyst"  # offered bash, read_file, write_file and web_fetch


@pytest.fixture
def analyst(agents):
    """The analyst on the offline mock engine (its /tool directive calls tools)."""
    agent = agents[ROLE]
    agent.engine = "mock"
    agent.save()
    return agent


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(username="sam", password="pw-sam", is_staff=True)


@pytest.fixture
def staff_chat(staff):
    from rest_framework.authtoken.models import Token

    from tests.agent_chat.conftest import ChatClient

    return ChatClient(Token.objects.get_or_create(user=staff)[0].key)


@pytest.fixture
def make_rule(db) -> Callable[..., Any]:
    """Saves a ToolRule (sync); scope follows from agent/conversation_id unless given."""
    from tools_app.models import ToolRule

    def make(effect: str, tool: str, argument: str = "", *, agent=None, conversation_id=None, scope=None, **fields):
        scope = scope or ("agent" if agent else "conversation" if conversation_id else "global")
        return ToolRule.objects.create(effect=effect, tool=tool, argument=argument, scope=scope, agent=agent,
                                       conversation_id=conversation_id, **fields)

    return make


def bash(command: str) -> str:
    """The mock engine's directive for one bash call."""
    import json

    return f"/tool bash {json.dumps({'command': command})}"

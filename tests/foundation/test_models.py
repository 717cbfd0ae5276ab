"""Models: agents (prompt + CLAUDE.md precedence, validation), run events uniqueness."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from agents_app.models import Agent
from chat_app.models import Conversation, Run, RunEvent

pytestmark = pytest.mark.django_db


def test_agent_effective_prompt_appends_claude_md(agents, settings):
    agent = agents["coder"]
    assert agent.effective_system_prompt() == agent.system_prompt.strip()
    agent.workspace_path.mkdir(parents=True)
    (agent.workspace_path / "CLAUDE.md").write_text("Always use type hints.")
    prompt = agent.effective_system_prompt()
    assert prompt.startswith(agent.system_prompt.strip())
    assert prompt.endswith("Always use type hints.")


def test_agent_validates_engine_and_tools(agents):
    agent = Agent(role="x_agent", display_name="X", engine="nope", allowed_tools=["bash", "teleport"])
    with pytest.raises(ValidationError) as info:
        agent.full_clean()
    assert "engine" in info.value.message_dict and "allowed_tools" in info.value.message_dict


def test_agent_rule_overrides_a_tool_default(agents):
    from tools_app.models import ToolRule
    from tools_app.policy import policy_evaluate
    from tools_app.selectors import tool_rules_for_call

    agent = agents["dev_efficiency_analyst"]

    def effect() -> str:
        rules = tool_rules_for_call(agent_id=agent.pk, conversation_id=None)
        return policy_evaluate(tool_name="bash", tool_input={"command": "ls"}, rules=rules, default_effect="ask").effect

    assert effect() == "ask"
    ToolRule.objects.create(scope="agent", agent=agent, effect="allow", tool="bash")
    assert effect() == "allow"


def test_default_agents_loaded_idempotently(agents):
    from agents_app.defaults import load_default_agents

    Agent.objects.filter(role="coder").update(system_prompt="edited by admin")
    assert load_default_agents() == []
    assert Agent.objects.get(role="coder").system_prompt == "edited by admin"


def test_run_event_seq_unique_per_run(user):
    conversation = Conversation.objects.create(owner=user)
    run = Run.objects.create(conversation=conversation, engine="mock")
    RunEvent.objects.create(run=run, seq=1, event="agent.start", at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        RunEvent.objects.create(run=run, seq=1, event="agent.delta", at=timezone.now())

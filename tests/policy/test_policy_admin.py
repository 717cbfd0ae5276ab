"""Admin: the ToolRule pages and the agent page's inline of agent rules."""
from __future__ import annotations

import pytest

from tools_app.models import ToolRule

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user(django_user_model, agents):
    return django_user_model.objects.create_superuser(username="root", password="pw-root", email="r@example.com")


@pytest.fixture
def admin_web(client, admin_user):
    client.force_login(admin_user)
    return client


def test_tool_rule_admin_lists_filters_and_searches(admin_web, agents):
    ToolRule.objects.create(scope="global", effect="deny", tool="bash", argument="rm *")
    ToolRule.objects.create(scope="agent", agent=agents["coder"], effect="allow", tool="write_file")
    assert b"deny bash rm *" in admin_web.get("/admin/tools_app/toolrule/").content
    page = admin_web.get("/admin/tools_app/toolrule/?effect__exact=allow&q=write").content
    assert b"allow write_file" in page and b"deny bash" not in page


def test_tool_rule_admin_add_validates_and_sets_owner(admin_web, admin_user):
    bad = admin_web.post("/admin/tools_app/toolrule/add/", {"effect": "allow", "tool": "bash", "argument": "ls; rm x",
                                                            "scope": "global"})
    assert bad.status_code == 200 and b"shell control syntax" in bad.content
    good = admin_web.post("/admin/tools_app/toolrule/add/", {"effect": "allow", "tool": "bash", "argument": "ls*",
                                                             "scope": "global"})
    assert good.status_code == 302
    rule = ToolRule.objects.get()
    assert rule.owner == admin_user and rule.name == f"global rule #{rule.id}: allow bash ls*"


def test_agent_admin_inline_adds_agent_rules(admin_web, admin_user, agents):
    from django.forms.models import model_to_dict

    agent = agents["coder"]
    page = admin_web.get(f"/admin/agents_app/agent/{agent.pk}/change/")
    assert page.status_code == 200 and b"tool_rules-TOTAL_FORMS" in page.content
    assert b"approval_overrides" not in page.content
    data = {k: v for k, v in model_to_dict(agent).items() if v is not None}
    data.update({
        "allowed_tools": '["read_file", "write_file"]',
        "mcp_server_links-TOTAL_FORMS": "0", "mcp_server_links-INITIAL_FORMS": "0",
        "mcp_server_links-MIN_NUM_FORMS": "0", "mcp_server_links-MAX_NUM_FORMS": "1000",
        "tool_rules-TOTAL_FORMS": "1", "tool_rules-INITIAL_FORMS": "0",
        "tool_rules-MIN_NUM_FORMS": "0", "tool_rules-MAX_NUM_FORMS": "1000",
        "tool_rules-0-effect": "allow", "tool_rules-0-tool": "write_file", "tool_rules-0-argument": "src/**",
        "tool_rules-0-name": "",
    })
    response = admin_web.post(f"/admin/agents_app/agent/{agent.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    rule = ToolRule.objects.get()
    assert (rule.scope, rule.agent, rule.conversation_id, rule.owner) == ("agent", agent, None, admin_user)
    assert rule.name == f"agent rule #{rule.id}: allow write_file src/**"


def test_tool_rule_admin_conversation_rule_needs_its_owner(admin_web, user):
    import uuid

    data = {"effect": "allow", "tool": "bash", "argument": "", "scope": "conversation",
            "conversation_id": str(uuid.uuid4())}
    response = admin_web.post("/admin/tools_app/toolrule/add/", data)
    assert response.status_code == 200 and b"conversation&#x27;s owner" in response.content
    assert admin_web.post("/admin/tools_app/toolrule/add/", {**data, "owner": user.pk}).status_code == 302
    assert ToolRule.objects.get().owner == user

"""tools_app 0004_toolrule copies ``Agent.approval_overrides`` into agent rules before
agents_app 0003 drops the field (and copies them back when reversed)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("agents_app", "0002_default_agents"), ("tools_app", "0001_initial")]
AFTER = [("agents_app", "0005_remove_agent_approval_overrides"), ("tools_app", "0004_toolrule")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_migration_approval_overrides_become_agent_rules():
    try:
        old = _migrate(BEFORE)
        Agent = old.get_model("agents_app", "Agent")
        # The rows the default-agents migration made may or may not be there (transactional tests flush).
        Agent.objects.update_or_create(role="coder", defaults={
            "display_name": "Coder", "approval_overrides": {"bash": False, "write_file": True}})
        Agent.objects.update_or_create(role="plain", defaults={"display_name": "Plain", "approval_overrides": {}})

        new = _migrate(AFTER)
        ToolRule = new.get_model("tools_app", "ToolRule")
        rules = {(r.tool, r.effect, r.scope, r.agent.role) for r in ToolRule.objects.select_related("agent")}
        assert rules == {("bash", "allow", "agent", "coder"), ("write_file", "ask", "agent", "coder")}
        assert "approval_overrides" not in {f.name for f in new.get_model("agents_app", "Agent")._meta.fields}

        old = _migrate(BEFORE)  # and back
        assert old.get_model("agents_app", "Agent").objects.get(role="coder").approval_overrides == {
            "bash": False, "write_file": True}
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

"""ToolRule (approval policies), with each agent's ``approval_overrides`` copied into agent rules.

The copy runs here, while ``Agent.approval_overrides`` still exists: agents_app's
0005_remove_agent_approval_overrides depends on this migration and drops the field after.
``{"bash": false}`` becomes an agent ``allow`` rule for bash, ``true`` an agent ``ask`` rule.
Reversing copies agent rules without an argument pattern back (allow → false, ask → true).
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def overrides_to_rules(apps, schema_editor):
    Agent = apps.get_model("agents_app", "Agent")
    ToolRule = apps.get_model("tools_app", "ToolRule")
    for agent in Agent.objects.exclude(approval_overrides={}).order_by("pk"):
        overrides = agent.approval_overrides if isinstance(agent.approval_overrides, dict) else {}
        for tool, needs_approval in sorted(overrides.items()):
            effect = "ask" if needs_approval else "allow"
            ToolRule.objects.create(
                effect=effect, tool=tool, argument="", scope="agent", agent=agent,
                name=f"{agent.role}: {effect} {tool} (was approval_overrides)"[:200],
            )


def rules_to_overrides(apps, schema_editor):
    Agent = apps.get_model("agents_app", "Agent")
    ToolRule = apps.get_model("tools_app", "ToolRule")
    overrides: dict[int, dict[str, bool]] = {}
    for rule in ToolRule.objects.filter(scope="agent", argument="", effect__in=["allow", "ask"]).order_by("pk"):
        overrides.setdefault(rule.agent_id, {})[rule.tool] = rule.effect == "ask"
    for agent_id, values in overrides.items():
        Agent.objects.filter(pk=agent_id).update(approval_overrides=values)


class Migration(migrations.Migration):

    dependencies = [
        ('agents_app', '0002_default_agents'),
        ('tools_app', '0003_agent_mcp_servers_to_rows'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ToolRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('effect', models.CharField(choices=[('allow', 'Allow'), ('ask', 'Ask'), ('deny', 'Deny')], max_length=8)),
                ('tool', models.CharField(help_text='Tool name or glob, e.g. bash or mcp__filesystem__*.', max_length=100)),
                ('argument', models.CharField(blank=True, help_text="Optional pattern on the tool's main argument: a bash command (git status*), a path in the workspace (src/**), or a web_fetch host (*.example.com). Blank: any call.", max_length=500)),
                ('scope', models.CharField(choices=[('global', 'Global'), ('agent', 'Agent'), ('conversation', 'Conversation')], default='global', max_length=16)),
                ('conversation_id', models.UUIDField(blank=True, db_index=True, help_text='Only for conversation rules.', null=True)),
                ('name', models.CharField(blank=True, help_text='Shown when the rule decides a call. Blank: generated.', max_length=200)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('agent', models.ForeignKey(blank=True, help_text='Only for agent rules.', null=True, on_delete=django.db.models.deletion.CASCADE, related_name='tool_rules', to='agents_app.agent')),
                ('owner', models.ForeignKey(blank=True, help_text='Who made it (a conversation rule: its owner).', null=True, on_delete=django.db.models.deletion.CASCADE, related_name='tool_rules', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['created_at', 'id'],
            },
        ),
        migrations.RunPython(overrides_to_rules, rules_to_overrides),
    ]

"""Each agent's old ``mcp_servers`` JSON becomes ``McpServer`` rows attached with ``always=True``
(see ``tools_app/mcp_import.py``); ``agents_app`` 0003 then drops the JSON field."""
from django.db import migrations


def forwards(apps, schema_editor):
    from tools_app.mcp_import import import_agent_mcp_servers

    Agent = apps.get_model("agents_app", "Agent")
    import_agent_mcp_servers(
        agents=Agent.objects.order_by("pk").values_list("pk", "role", "mcp_servers"),
        server_model=apps.get_model("tools_app", "McpServer"),
        link_model=apps.get_model("tools_app", "AgentMcpServer"),
    )


def backwards(apps, schema_editor):
    from tools_app.mcp_import import export_agent_mcp_servers

    Agent = apps.get_model("agents_app", "Agent")
    for agent_id, servers in export_agent_mcp_servers(link_model=apps.get_model("tools_app", "AgentMcpServer")).items():
        Agent.objects.filter(pk=agent_id).update(mcp_servers=servers)


class Migration(migrations.Migration):
    dependencies = [
        ("agents_app", "0002_default_agents"),
        ("tools_app", "0002_mcp_servers"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]

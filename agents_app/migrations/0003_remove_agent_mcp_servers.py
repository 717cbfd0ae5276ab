from django.db import migrations


class Migration(migrations.Migration):
    """MCP servers are ``tools_app.McpServer`` rows now; the JSON was copied there first."""

    dependencies = [
        ("agents_app", "0002_default_agents"),
        ("tools_app", "0003_agent_mcp_servers_to_rows"),
    ]

    operations = [
        migrations.RemoveField(model_name="agent", name="mcp_servers"),
    ]

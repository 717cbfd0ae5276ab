"""The seed-004 trio runs on Ollama (falling back to mock while none answers).

Installs made before this ran the trio on ``DEFAULT_AGENT_ENGINE`` (``mock`` unless set). Move
those still on ``mock`` to ``ollama``: the router keeps them on mock until an Ollama answers, so
nothing changes for an offline install, and one that gains an Ollama needs no admin edit.
"""
from django.db import migrations

TRIO = ["orchestrator", "coder", "researcher"]


def forward(apps, schema_editor):
    apps.get_model("agents_app", "Agent").objects.filter(role__in=TRIO, engine="mock").update(engine="ollama")


class Migration(migrations.Migration):
    dependencies = [("agents_app", "0003_remove_agent_mcp_servers")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]

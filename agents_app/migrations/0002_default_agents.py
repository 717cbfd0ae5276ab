from django.db import migrations


def load(apps, schema_editor):
    from agents_app.defaults import load_default_agents

    load_default_agents(apps.get_model("agents_app", "Agent"))


class Migration(migrations.Migration):
    dependencies = [("agents_app", "0001_initial")]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]

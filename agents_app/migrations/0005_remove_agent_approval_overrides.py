"""Approval overrides are now agent-scoped ToolRule rows (copied by tools_app 0004_toolrule)."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('agents_app', '0004_trio_on_ollama'),
        # The rules must be copied out of the field before it is dropped.
        ('tools_app', '0004_toolrule'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='agent',
            name='approval_overrides',
        ),
    ]

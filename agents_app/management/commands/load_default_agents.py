from django.core.management.base import BaseCommand

from agents_app.defaults import load_default_agents


class Command(BaseCommand):
    help = "Create the default agents that do not exist yet (existing ones are left as edited)."

    def handle(self, *args, **options):
        created = load_default_agents()
        self.stdout.write(f"Default agents created: {', '.join(created) or 'none (all present)'}")

"""``manage.py load_providers [--file PATH]``: import the providers file (idempotent; ``serve`` runs it)."""
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core.errors import InvalidInput


class Command(BaseCommand):
    help = "Import providers, models, routing rules and budgets from PROVIDERS_FILE (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--file", default=None, help="Default: PROVIDERS_FILE (providers.yaml at the repo root).")
        parser.add_argument("--if-exists", action="store_true", help="Do nothing when the file does not exist.")

    def handle(self, *args, file, if_exists, **options):
        from agents_app.providers.config import providers_load

        path = Path(file or settings.PROVIDERS_FILE)
        if if_exists and not path.exists():
            self.stdout.write(f"No providers file at {path}: only the environment's providers.")
            return
        try:
            result = providers_load(path=path)
        except InvalidInput as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Loaded {result.providers} provider(s), {result.models} model(s), {result.rules} rule(s), "
                          f"{result.budgets} budget(s) from {path}; removed {result.deleted} stale row(s).")

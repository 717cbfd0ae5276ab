"""``manage.py mcp_providers [--user NAME]``: the provider management tools as an MCP server on stdio."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve provider_list, provider_status and provider_recommend over MCP (stdio)."

    def add_arguments(self, parser):
        parser.add_argument("--user", dest="username", default=None,
                            help="Whose budgets provider_recommend applies (default: none).")

    def handle(self, *args, username, **options):
        from chat_app.provider_mcp import build_provider_server

        user = None
        if username:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"No user {username!r}.")
        build_provider_server(user=user).run("stdio")

"""``manage.py acp``: serve this service's agents over ACP (JSON-RPC 2.0 on stdin/stdout).

stdout carries protocol lines only: the real stdout is set aside for the protocol before anything
else runs, and file descriptor 1 (``print``, warnings, a library's stray output) goes to stderr,
where the logs go too. Also installed as the ``orchestrator-acp`` console script.
"""
from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand, CommandError

DEFAULT_USER = "acp"


class Command(BaseCommand):
    help = ("Serve the agents over ACP (Agent Client Protocol v1) on stdin/stdout, for editors (Zed, JetBrains, "
            "Neovim, Emacs) and other orchestrators. Logs go to stderr.")

    def add_arguments(self, parser):
        parser.add_argument("--agent", dest="agent_role", default=None,
                            help="Agent role for new sessions (default: DEFAULT_AGENT_ROLE; a loaded session keeps its own).")
        parser.add_argument("--model", default=None, help="Model for every run, instead of the agent's or engine's.")
        parser.add_argument("--provider", default=None,
                            help="Pin the provider for every prompt (a name from GET /v1/providers: the "
                                 "providers file, the admin, or the env's anthropic/ollama); routing "
                                 "rules and failover then stay on it.")
        parser.add_argument("--allowed-tools", default=None,
                            help="Comma-separated tool names or globs the model is offered; any other call is refused.")
        parser.add_argument("--user", dest="username", default=None,
                            help=f"Owner of the sessions (default: a user {DEFAULT_USER!r}, created on first use).")

    def handle(self, *args, agent_role, model, provider, allowed_tools, username, **options):
        # Before anything can print: keep the real stdout for protocol lines, send fd 1 to stderr.
        protocol_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        _migrate_if_needed()
        user = _resolve_user(username)
        if agent_role:
            _check_role(agent_role)
        if provider:
            _check_provider(provider)
        tools = _parse_tools(allowed_tools)
        from django.db import connections

        connections.close_all()  # the async server uses its own database threads
        import asyncio
        import logging

        from chat_app.transports.acp import serve

        logging.getLogger("orchestrator.acp").info(
            "ACP agent ready: user %s, agent %s, model %s, provider %s, allowed tools %s", user.username,
            agent_role or "(default)", model or "(default)", provider or "(default)",
            ",".join(tools) if tools is not None else "(all)")
        try:
            asyncio.run(serve(user=user, protocol_fd=protocol_fd, agent_role=agent_role, model=model,
                              provider=provider, allowed_tools=tools))
        except KeyboardInterrupt:
            pass


def _migrate_if_needed() -> None:
    from django.core.management import call_command
    from django.db import DEFAULT_DB_ALIAS, connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        call_command("migrate", interactive=False, verbosity=0, stdout=sys.stderr)
        call_command("load_default_agents", stdout=sys.stderr)


def _resolve_user(username: str | None):
    from django.contrib.auth import get_user_model

    model = get_user_model()
    if username:
        user = model.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}; create it (manage.py createsuperuser) or leave out --user.")
        if not user.is_active:
            raise CommandError(f"User {username!r} is not active.")
        return user
    user, created = model.objects.get_or_create(username=DEFAULT_USER)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def _check_role(role: str) -> None:
    from agents_app.selectors import agent_get_for_run
    from core.errors import NotFound

    try:
        agent_get_for_run(role=role)
    except NotFound as exc:
        raise CommandError(exc.message) from exc


def _check_provider(provider: str) -> None:
    from agents_app.providers.registry import provider_registry

    registry = provider_registry()
    info = registry.get(provider)
    if info is None:
        raise CommandError(f"Unknown provider {provider!r}; known: {', '.join(registry.names())}.")
    reason = info.unavailable_reason()
    if reason:
        raise CommandError(f"Provider {provider!r} is unavailable: {reason}.")


def _parse_tools(value: str | None) -> list[str] | None:
    if value is None:
        return None
    tools = [name.strip() for name in value.split(",") if name.strip()]
    from tools_app.registry import all_tools

    known = set(all_tools())
    unknown = [name for name in tools if name not in known and not name.startswith("mcp__") and not any(c in name for c in "*?[")]
    if unknown:
        import logging

        logging.getLogger("orchestrator.acp").warning(
            "--allowed-tools: %s not built-in tools (known: %s)", ", ".join(unknown), ", ".join(sorted(known)))
    return tools

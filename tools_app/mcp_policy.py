"""Which MCP servers a run gets: admins register them, a request can only name them.

MCP servers start processes (stdio) and open connections (HTTP) as this service, so what they are
is configuration admins own (``McpServer`` rows) and which agents may use them is data too
(``AgentMcpServer``: ``always`` attaches a server to every run of the agent; otherwise a request
may name it). :func:`mcp_servers_for_run` is the one place that turns an agent and a request's
``mcpServers`` into the list of server specs a run opens; the run service calls it before it
records anything, so a refused request leaves no run behind and starts nothing.
"""
from __future__ import annotations

import logging
from typing import Any


from core.errors import ApplicationError, InvalidInput
from core.refreshing_cache import RefreshingCache, seconds_setting

from .mcp_client import SERVER_NAME_RE, McpConfigError, mcp_url_refusal, validate_mcp_servers
from .models import AgentMcpServer, McpServer
from .permissions import can_use_inline_mcp_servers

logger = logging.getLogger("orchestrator.tools.mcp")

REQUEST_SHAPE = 'mcpServers must be a list of registered server names: ["name", ...] or [{"name": "..."}].'


class McpServerNotAllowed(ApplicationError):
    """A request named an MCP server it may not use, or gave a spec it may not give (403)."""

    status = 403
    code = "mcp_server_not_allowed"


def mcp_servers_for_run(*, user: Any, agent: Any, requested: Any, allow_inline: bool | None = None) -> list[dict[str, Any]]:
    """The MCP server specs a run of ``agent`` opens: the agent's ``always`` servers, then the
    requested ones, each once, in the shape ``McpToolset`` takes.

    Args:
        requested: the request's ``mcpServers`` (``None`` or a list). An entry is a name, or an
            object with only ``name``: a registered, enabled server linked to ``agent``. An object
            with more keys (``command``, ``url``, ...) is an inline spec.
        allow_inline: ``True`` lets inline specs through (a caller that is the process owner,
            e.g. a local stdio transport); ``False`` never does; ``None`` decides by
            :func:`~tools_app.permissions.can_use_inline_mcp_servers`. Inline HTTP specs are
            never ``trusted``: their URL always passes the address check.

    Raises:
        InvalidInput: ``requested`` does not have that shape, or an inline spec is invalid (400).
        McpServerNotAllowed: an inline spec without the permission, a name that is not a
            registered enabled server the agent may use, or an HTTP server whose address the
            address check refuses (403). Nothing has been started when it is raised.
    """
    names, inline = _parse_requested(requested)
    if inline:
        if not (can_use_inline_mcp_servers(user=user) if allow_inline is None else allow_inline):
            raise McpServerNotAllowed(
                f"MCP server {_entry_name(inline[0])}: a request may only name registered MCP servers; "
                "giving a command or url needs the tools_app.use_inline_mcp_servers permission.")
        for entry in inline:
            if entry.get("trusted"):
                raise McpServerNotAllowed(f"MCP server {_entry_name(entry)}: only an admin's registered server can be trusted.")

    links = _links_of(agent.pk)
    rows = [link.server for link in links.values() if link.always]
    for name in names:
        if name not in links:
            raise McpServerNotAllowed(
                f"MCP server {name!r} is not a registered, enabled MCP server that agent {agent.role!r} may use.")
        if links[name].server not in rows:
            rows.append(links[name].server)

    registered = [_row_spec(row) for row in rows]
    try:
        # Inline HTTP specs are never trusted: their URL is the caller's choice.
        own = [{**spec, "trusted": False} if "url" in spec else spec for spec in validate_mcp_servers(inline)]
    except McpConfigError as exc:
        raise InvalidInput(str(exc), code="invalid_input") from exc
    seen = {spec.get("name") for spec in registered}
    for spec in own:
        if spec["name"] in seen:
            raise InvalidInput(f"MCP server name {spec['name']!r} is used twice in this run "
                               "(the agent's own servers included).", code="invalid_input")
        seen.add(spec["name"])
    for spec in registered:
        _check_address(spec, inline=False)
    for spec in own:
        _check_address(spec, inline=True)
    return registered + own


# agent id -> {server name: link}. Every run asks; admins change these rarely, and any save or
# delete of a server or link clears this at once in this process (tools_app/apps.py); other
# processes see a change within AGENT_CACHE_SECONDS, like the agent's own settings (served once
# more while it reloads in the background: core/refreshing_cache.py).
_LINKS: RefreshingCache[dict[str, AgentMcpServer]] = RefreshingCache(
    "MCP links", ttl=seconds_setting("AGENT_CACHE_SECONDS"))


def _load_links(agent_id: Any) -> dict[str, AgentMcpServer]:
    return {link.server.name: link for link in AgentMcpServer.objects.select_related("server")
            .filter(agent_id=agent_id, server__enabled=True).order_by("server__name")}


def _links_of(agent_id: Any) -> dict[str, AgentMcpServer]:
    return _LINKS.get(agent_id, lambda: _load_links(agent_id))


def mcp_links_cache_clear(**_: Any) -> None:
    _LINKS.clear()


def _parse_requested(requested: Any) -> tuple[list[str], list[dict[str, Any]]]:
    if requested in (None, ""):
        return [], []
    if not isinstance(requested, list):
        raise InvalidInput(REQUEST_SHAPE, code="invalid_input")
    names: list[str] = []
    inline: list[dict[str, Any]] = []
    for entry in requested:
        if isinstance(entry, dict) and set(entry) - {"name"}:
            inline.append(entry)
            continue
        name = entry.get("name") if isinstance(entry, dict) else entry
        if not isinstance(name, str) or not SERVER_NAME_RE.fullmatch(name):
            raise InvalidInput(f"{REQUEST_SHAPE} Got {entry!r}."[:500], code="invalid_input")
        if name not in names:
            names.append(name)
    return names, inline


def _entry_name(entry: dict[str, Any]) -> str:
    name = entry.get("name")
    return repr(name) if isinstance(name, str) else "(unnamed)"


def _row_spec(row: McpServer) -> dict[str, Any]:
    spec = row.to_spec()
    try:
        (spec,) = validate_mcp_servers([spec])
    except McpConfigError as exc:
        # An admin's broken row (saved around the admin's validation): passed on as it is, so
        # the run fails with ``invalid_mcp_config`` before starting anything, as McpToolset
        # validates the whole list first.
        logger.warning("MCP server %s has an invalid configuration: %s", row.name, exc)
    return spec


def _check_address(spec: dict[str, Any], *, inline: bool) -> None:
    if "url" not in spec or spec.get("trusted") or not isinstance(spec["url"], str):
        return
    refusal = mcp_url_refusal(spec["url"])
    if refusal is None:
        return
    if inline:  # the caller's own URL: saying what it resolves to reveals nothing of ours
        raise McpServerNotAllowed(f"MCP server {spec['name']!r}: address not allowed ({refusal}).")
    # A registered server's address is an admin's configuration: do not show it to the caller.
    logger.warning("MCP server %s refused by the address check: %s", spec["name"], refusal)
    raise McpServerNotAllowed(f"MCP server {spec['name']!r} is at an address the address check refuses "
                              "(an admin can mark it trusted).")

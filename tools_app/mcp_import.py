"""Moving the old per-agent MCP JSON (``Agent.mcp_servers``) into ``McpServer`` rows and back.

Used by the data migration ``tools_app/migrations/0003_agent_mcp_servers_to_rows.py`` with the
migration's historical models (so it reads no current model class), and by its tests.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

from .mcp_client import McpConfigError, validate_mcp_servers

logger = logging.getLogger("orchestrator.tools.mcp")

# The row fields that make two servers "the same server" (name, switches and notes aside).
_CONFIG_FIELDS = ("transport", "command", "env", "cwd", "url", "headers", "timeout", "requires_approval")
_MAX_NAME = 64


def row_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``McpServer`` config fields for one *validated* server spec."""
    http = "url" in spec
    return {
        "transport": "http" if http else "stdio",
        "command": [] if http else list(spec["command"]),
        "env": {} if http else dict(spec.get("env") or {}),
        "cwd": "" if http else spec.get("cwd") or "",
        "url": spec["url"] if http else "",
        "headers": dict(spec.get("headers") or {}) if http else {},
        "timeout": spec.get("timeout"),
        "requires_approval": spec["requires_approval"],
    }


def _candidate_names(name: str) -> Iterable[str]:
    yield name
    n = 2
    while True:
        suffix = f"-{n}"
        yield name[: _MAX_NAME - len(suffix)] + suffix
        n += 1


def import_agent_mcp_servers(*, agents: Iterable[tuple[Any, str, Any]], server_model: Any, link_model: Any) -> list[str]:
    """Turn each agent's JSON entries into ``McpServer`` rows attached with ``always=True``.

    ``agents`` yields ``(agent_id, role, mcp_servers_json)``. An entry equal to a row that already
    has its name (or a suffixed form of it) reuses that row, so agents that shared a server share
    the row, and running this twice changes nothing. The same name with a different config gets
    the first free suffix: ``calc``, ``calc-2``, ... (the agent's tools are then named after the
    new name). HTTP servers are imported ``trusted``: admins wrote them and they connected to
    their addresses before, so they keep working; untick it for public servers. Entries that are
    not valid configs are skipped with a warning (they failed every run of their agent already).

    Returns:
        The names of the rows created.
    """
    created: list[str] = []
    for agent_id, role, raw in agents:
        for index, entry in enumerate(raw if isinstance(raw, list) else [raw] if raw else []):
            try:
                (spec,) = validate_mcp_servers([entry])
            except McpConfigError as exc:
                logger.warning("agent %s: MCP server #%d not imported, invalid config: %s", role, index + 1, exc)
                continue
            fields = row_fields(spec)
            for name in _candidate_names(spec["name"]):
                row = server_model.objects.filter(name=name).first()
                if row is None:
                    row = server_model.objects.create(
                        name=name, **fields, enabled=True, trusted=fields["transport"] == "http",
                        description=f"Imported from the mcp_servers of agent {role}"
                                    + (f" (was named {spec['name']!r} there)" if name != spec["name"] else "") + ".",
                    )
                    created.append(name)
                    break
                if {f: getattr(row, f) for f in _CONFIG_FIELDS} == fields:
                    break
            link, _ = link_model.objects.get_or_create(agent_id=agent_id, server=row, defaults={"always": True})
            if not link.always:
                link.always = True
                link.save(update_fields=["always"])
    return created


def export_agent_mcp_servers(*, link_model: Any) -> dict[Any, list[dict[str, Any]]]:
    """The reverse: each agent's ``always`` servers as the old JSON list, by agent id."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for link in link_model.objects.filter(always=True).select_related("server").order_by("agent_id", "server__name"):
        row = link.server
        entry: dict[str, Any] = {"name": row.name, "requires_approval": row.requires_approval}
        if row.transport == "http":
            entry.update(url=row.url, headers=row.headers)
        else:
            entry.update(command=row.command, env=row.env)
            if row.cwd:
                entry["cwd"] = row.cwd
        if row.timeout is not None:
            entry["timeout"] = row.timeout
        out.setdefault(link.agent_id, []).append(entry)
    return out

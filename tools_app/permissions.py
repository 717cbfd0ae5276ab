"""Permission checks as small functions, called inside services."""
from __future__ import annotations

from typing import Any


def can_decide_confirmation(*, user: Any, confirmation: Any) -> bool:
    """Only the owner of the run's conversation decides its tool calls."""
    return bool(user and user.is_authenticated and confirmation.run.conversation.owner_id == user.id)


def can_decide_any_confirmation(*, user: Any) -> bool:
    """Staff who may change tool confirmations decide anyone's from the admin console."""
    return bool(user and user.is_active and user.is_staff and user.has_perm("tools_app.change_toolconfirmation"))


INLINE_MCP_SERVERS_PERMISSION = "tools_app.use_inline_mcp_servers"


def can_use_inline_mcp_servers(*, user: Any) -> bool:
    """May this user give full MCP server specs (a command to start, a URL to reach) in a request?

    Only with the ``tools_app.use_inline_mcp_servers`` permission, which no one has by default.
    Active superusers count (Django's ``has_perm`` grants them every permission): they can
    register any server in the admin anyway, so refusing them here would protect nothing.
    """
    return bool(user and user.is_authenticated and user.has_perm(INLINE_MCP_SERVERS_PERMISSION))
def can_make_agent_rules(*, user: Any) -> bool:
    """Agent (and global) rules change what every user of an agent is asked: staff only."""
    return bool(user and user.is_authenticated and user.is_staff)


def can_change_tool_rule(*, user: Any, rule: Any) -> bool:
    """A conversation rule belongs to its conversation's owner; agent and global rules to staff."""
    if not (user and user.is_authenticated):
        return False
    if rule.scope == "conversation":
        return rule.owner_id == user.id
    return bool(user.is_staff)

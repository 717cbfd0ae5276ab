"""Tool confirmations (a person's decision on a risky tool call is a row, the source of truth) and
the MCP servers admins register for agents, and the approval-policy rules that decide which calls
need a person."""
from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from . import conf


class ToolConfirmation(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("chat_app.Run", on_delete=models.CASCADE, related_name="confirmations")
    tool_call_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    output = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tool} ({self.status})"


def validate_mcp_server_name(value: str) -> None:
    from .mcp_client import SERVER_NAME_RE

    if not SERVER_NAME_RE.fullmatch(value or ""):
        raise ValidationError("Use 1-64 letters, digits, '_' or '-', starting with a letter or digit.")


def requires_approval_default() -> bool:
    """An MCP server's tools can do anything: by default a person approves each call."""
    return True


def _literal_address(url: str):
    """The IP address in ``url``'s host if the host is a literal address (or localhost), else None."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return ipaddress.ip_address("127.0.0.1")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class McpServer(models.Model):
    """An MCP server an admin registered; runs get its tools (``tools_app/mcp_client.py``).

    Only admins create these: a request can only *name* a registered, enabled server that the
    run's agent may use (``AgentMcpServer``), see ``tools_app/mcp_policy.py``.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio", "stdio (start a local process)"
        HTTP = "http", "streamable HTTP"

    name = models.CharField(
        max_length=64, unique=True, validators=[validate_mcp_server_name],
        help_text="What requests name (mcpServers: [\"name\"]); tools appear as mcp__<name>__<tool>.",
    )
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.STDIO)
    command = models.JSONField(default=list, blank=True,
                               help_text='stdio: the argv list, e.g. ["python", "-m", "calc_server"].')
    env = models.JSONField(default=dict, blank=True,
                           help_text="stdio: variables set over a minimal environment (PATH, HOME, ...); this service's own (API keys) are not inherited.")
    cwd = models.CharField(max_length=500, blank=True, help_text="stdio: working directory (blank: inherited).")
    url = models.CharField(max_length=2000, blank=True, help_text="http: the streamable HTTP endpoint, e.g. https://host/mcp.")
    headers = models.JSONField(default=dict, blank=True, help_text='http: request headers, e.g. {"Authorization": "Bearer ..."}.')
    timeout = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.001)],
                                help_text="Seconds for each tool call (blank: TOOL_TIMEOUT).")
    requires_approval = models.JSONField(
        default=requires_approval_default,
        help_text='true: a person approves every call of this server\'s tools; false: none; or a list of the '
                  'tool names that need approval, e.g. ["delete"]. Approval rules (agent, conversation, global) still decide.',
    )
    enabled = models.BooleanField(default=True, help_text="Disabled servers are never started or connected.")
    trusted = models.BooleanField(
        default=False,
        help_text="http only: skip the address check (loopback, private, link-local addresses are otherwise "
                  "refused, like web_fetch). Tick it for a server on your own network.",
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        permissions = [
            ("use_inline_mcp_servers",
             "Can give MCP server specs (command, url, ...) in a request instead of naming registered servers"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.transport}{'' if self.enabled else ', disabled'})"

    def to_spec(self) -> dict[str, Any]:
        """The row as the config dict ``McpToolset`` takes (not yet validated: see :meth:`clean`).

        Fields of the other transport are included when filled in, so validation refuses a row
        that mixes them instead of silently ignoring half of it.
        """
        spec: dict[str, Any] = {"name": self.name, "type": self.transport, "requires_approval": self.requires_approval}
        stdio = self.transport == self.Transport.STDIO
        if stdio or self.command:
            spec["command"] = self.command
        if stdio or self.env:
            spec["env"] = self.env
        if self.cwd:
            spec["cwd"] = self.cwd
        if not stdio or self.url:
            spec["url"] = self.url
        if not stdio or self.headers:
            spec["headers"] = self.headers
        if not stdio or self.trusted:
            spec["trusted"] = self.trusted
        if self.timeout is not None:
            spec["timeout"] = self.timeout
        return spec

    def clean(self) -> None:
        from tools_app.tools.web_fetch import forbidden_reason

        from .mcp_client import McpConfigError, validate_mcp_servers

        try:
            validate_mcp_servers([self.to_spec()])
        except McpConfigError as exc:
            raise ValidationError(str(exc)) from exc
        # Only a literal address is checked here (no DNS on save); names are checked at run time.
        address = _literal_address(self.url) if self.transport == self.Transport.HTTP and not self.trusted else None
        reason = address and forbidden_reason(address, allow_private=bool(conf.setting("WEB_FETCH_ALLOW_PRIVATE", False)))
        if reason:
            raise ValidationError({"trusted": f"{self.url} is {reason}: runs would refuse it. Tick 'trusted' if "
                                              "this server is on your own network."})


class AgentMcpServer(models.Model):
    """Which agents may use an MCP server: ``always`` attaches it to every run of the agent,
    otherwise a request may name it (``mcpServers``)."""

    agent = models.ForeignKey("agents_app.Agent", on_delete=models.CASCADE, related_name="mcp_server_links")
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="agent_links")
    always = models.BooleanField(
        default=False, help_text="Attach to every run of this agent. Unticked: only when a request names it.")

    class Meta:
        ordering = ["server__name"]
        verbose_name = "agent allowed to use it"
        constraints = [models.UniqueConstraint(fields=["agent", "server"], name="unique_agent_mcp_server")]

    def __str__(self) -> str:
        return f"{self.agent_id} → {self.server_id} ({'always' if self.always else 'on request'})"
class ToolRule(models.Model):
    """One approval-policy rule: ``effect`` for calls of ``tool`` (whose main argument matches
    ``argument``) in a scope. Evaluated by :func:`tools_app.policy.policy_evaluate`."""

    class Effect(models.TextChoices):
        ALLOW = "allow"
        ASK = "ask"
        DENY = "deny"

    class Scope(models.TextChoices):
        GLOBAL = "global"
        AGENT = "agent"
        CONVERSATION = "conversation"

    effect = models.CharField(max_length=8, choices=Effect.choices)
    tool = models.CharField(max_length=100, help_text="Tool name or glob, e.g. bash or mcp__filesystem__*.")
    argument = models.CharField(
        max_length=500, blank=True,
        help_text="Optional pattern on the tool's main argument: a bash command (git status*), a path in the "
                  "workspace (src/**), or a web_fetch host (*.example.com). Blank: any call.",
    )
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.GLOBAL)
    agent = models.ForeignKey("agents_app.Agent", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="tool_rules", help_text="Only for agent rules.")
    # Not a foreign key: tools_app sits below chat_app, so it keeps the id, not the model.
    conversation_id = models.UUIDField(null=True, blank=True, db_index=True, help_text="Only for conversation rules.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="tool_rules", help_text="Who made it (a conversation rule: its owner).")
    name = models.CharField(max_length=200, blank=True, help_text="Shown when the rule decides a call. Blank: generated.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        from .policy import rule_label

        return rule_label(self)

    def clean(self) -> None:
        from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

        from .policy import rule_problems

        problems = rule_problems(effect=self.effect, tool=self.tool, argument=self.argument, scope=self.scope,
                                 agent_id=self.agent_id, conversation_id=self.conversation_id, name=self.name)
        # Scope consistency spans several fields (and forms may not show them all): not a field error.
        scope = [problems.pop(key) for key in ("scope", "agent", "conversation_id") if key in problems]
        if scope:
            problems[NON_FIELD_ERRORS] = scope
        if problems:
            raise ValidationError(problems)

    def save(self, *args, **kwargs) -> None:
        super().save(*args, **kwargs)
        if not self.name:
            # The generated name carries the id, so it is set once the row has one.
            self.name = self.label
            type(self).objects.filter(pk=self.pk).update(name=self.name)

"""Tool confirmations (a person's decision on a risky tool call is a row, the source of truth) and
the approval-policy rules that decide which calls need one."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


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

"""Conversations, messages, runs and each run's ordered event log."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=300, blank=True)
    agent = models.ForeignKey("agents_app.Agent", null=True, blank=True, on_delete=models.SET_NULL)
    engine_session_id = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title or str(self.id)


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        SYSTEM = "system"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey("chat_app.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="runs")
    agent = models.ForeignKey("agents_app.Agent", null=True, blank=True, on_delete=models.SET_NULL)
    engine = models.CharField(max_length=40)
    provider = models.CharField(max_length=80, blank=True)
    model = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    usage = models.JSONField(default=dict, blank=True)
    # USD at the price known when the run ended (``pricing``), for the provider and model it ran on.
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    # {"input", "output", "cacheRead", "cacheWrite" (USD per million tokens), "source"}.
    pricing = models.JSONField(default=dict, blank=True)
    # Why the router chose this engine, provider and model (e.g. "claude has no API key: using mock").
    route_note = models.CharField(max_length=1000, blank=True)
    # Set by a cancel request; the executing process re-checks it (the doorbell may be lost).
    cancel_requested = models.BooleanField(default=False)
    # The executing process renews this while the run is live (RUN_LEASE_SECONDS). A run that is
    # not finished and whose lease ran out executes nowhere (its server stopped): it is reaped.
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class RunEvent(models.Model):
    # No index of its own: the (run, seq) unique constraint's index leads with the run, so it serves
    # every lookup by run (the timeline, the cascade on delete); a second one only cost each of a
    # stream's event rows another b-tree insert in the group-commit writer.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    event = models.CharField(max_length=40)
    at = models.DateTimeField()
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="unique_run_event_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.event}"


class RunUsage(Run):
    """Runs seen as usage and cost (an admin view: the sums GET /v1/usage reports)."""

    class Meta:
        proxy = True
        verbose_name = "run usage"
        verbose_name_plural = "usage and cost"

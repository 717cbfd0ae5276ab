"""Serializers for the chat REST API (seed 001 camelCase field names)."""
from __future__ import annotations

import functools
import re
from typing import Any

from django.core import validators as django_validators
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from chat_app.models import Conversation, Message, Run, RunEvent


class StrictCharField(serializers.CharField):
    """A string and nothing else: numbers, booleans, lists and objects are 400, not coerced to text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_VALIDATORS = (django_validators.MaxLengthValidator, django_validators.MinLengthValidator,
                     django_validators.ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator)
_UNSUPPORTED = object()


def fast_validated_data(serializer_cls: type[serializers.Serializer], data: Any) -> dict[str, Any] | None:
    """What ``serializer_cls(data=data).validated_data`` is, for a plain valid body; else None.

    A DRF serializer deep-copies its fields for every instance, about a third of a millisecond
    on each stream start. For a body whose declared fields are clean strings (``StrictCharField``,
    no NUL or surrogate, within the length limits, not blank where blank is refused) and real
    booleans this returns exactly what the serializer returns (trimmed where it trims, defaults
    filled, its ``validate`` applied). Anything else — another field type, a wrong type, a blank
    or too long value, a failing ``validate`` — returns None and the caller runs the serializer,
    which gives its usual error, so errors never differ. What each field allows is read once
    per serializer class (:func:`_plan`): a stream start runs cold, and every attribute and
    validator looked up again was a cache miss.
    """
    if not isinstance(data, dict):
        return None
    attrs: dict[str, Any] = {}
    for name, field, kind, allow_null, trim, allow_blank, max_length, min_length in _plan(serializer_cls):
        value = data.get(name, empty)
        if value is empty:
            if field.required:
                return None
            if field.default is not empty:
                attrs[name] = field.get_default()
            continue
        if kind is _UNSUPPORTED:
            return None
        if value is None:
            if not allow_null:
                return None
        elif kind is bool:
            if type(value) is not bool:
                return None
        elif not isinstance(value, str):
            return None
        else:
            if trim:
                value = value.strip()
            if value == "":
                if not allow_blank:
                    return None
            elif (max_length is not None and len(value) > max_length) or (
                    min_length is not None and len(value) < min_length) or "\x00" in value or (
                    not value.isascii() and _SURROGATE.search(value)):
                return None
        attrs[name] = value
    try:
        return _validate(serializer_cls)(attrs)
    except serializers.ValidationError:
        return None


@functools.cache
def _validate(serializer_cls: type[serializers.Serializer]) -> Any:
    """The serializer's ``validate``, bound to one instance kept for the class (building one per
    request deep-copies every field). The serializers given to :func:`fast_validated_data`
    validate from ``attrs`` alone: nothing of the instance's state is read or written."""
    return serializer_cls().validate


@functools.cache
def _plan(serializer_cls: type[serializers.Serializer]) -> tuple[tuple[Any, ...], ...]:
    """Per declared field: (name, field, kind, allow_null, trim_whitespace, allow_blank,
    max_length, min_length); kind is ``str`` (a ``StrictCharField``), ``bool`` (a
    ``BooleanField``) or unsupported (any value given for it goes to the serializer)."""
    plan = []
    for name, field in serializer_cls._declared_fields.items():
        kind: Any = _UNSUPPORTED
        if not (field.read_only or field.source not in (None, field.field_name) or (
                field.validators and not all(isinstance(v, _PLAIN_VALIDATORS) for v in field.validators))):
            if type(field) is serializers.BooleanField:
                kind = bool
            elif isinstance(field, StrictCharField):
                kind = str
        plan.append((name, field, kind, field.allow_null, getattr(field, "trim_whitespace", False),
                     getattr(field, "allow_blank", False), getattr(field, "max_length", None),
                     getattr(field, "min_length", None)))
    return tuple(plan)


class ConversationCreateInput(serializers.Serializer):
    title = StrictCharField(required=False, allow_blank=True, max_length=300, default="")
    agentRole = serializers.SlugField(required=False, max_length=64)


class ConversationUpdateInput(serializers.Serializer):
    title = StrictCharField(allow_blank=True, max_length=300)


class ConversationOutput(serializers.ModelSerializer):
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    agentRole = serializers.SerializerMethodField()
    sessionId = serializers.CharField(source="engine_session_id")

    class Meta:
        model = Conversation
        fields = ["id", "title", "agentRole", "sessionId", "createdAt", "updatedAt"]

    def get_agentRole(self, obj: Conversation) -> str | None:
        return obj.agent.role if obj.agent_id else None


class MessageOutput(serializers.ModelSerializer):
    conversationId = serializers.UUIDField(source="conversation_id")
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = Message
        fields = ["id", "conversationId", "runId", "role", "content", "metadata", "createdAt"]


class RunEventOutput(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "event", "at", "payload"]


class RunTimelineOutput(serializers.Serializer):
    runId = serializers.UUIDField(source="id")
    conversationId = serializers.UUIDField(source="conversation_id")
    status = serializers.CharField()
    engine = serializers.CharField()
    model = serializers.CharField()
    provider = serializers.CharField()
    routeNote = serializers.CharField(source="route_note")
    # A decimal string in USD ("0.004200"), never a float: sums of costs must not drift.
    cost = serializers.DecimalField(max_digits=12, decimal_places=6, coerce_to_string=True)
    startedAt = serializers.DateTimeField(source="started_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    error = serializers.CharField(allow_blank=True)
    usage = serializers.JSONField()
    # Tokens and the price (USD per million) the run's cost was computed with (chat_app/usage.py).
    tokens = serializers.SerializerMethodField()
    pricing = serializers.JSONField()
    events = serializers.SerializerMethodField()

    def get_tokens(self, obj: Run) -> dict:
        return {"input": obj.input_tokens, "output": obj.output_tokens, "cacheRead": obj.cache_read_tokens,
                "cacheWrite": obj.cache_write_tokens}

    def get_events(self, obj: Run) -> list[dict]:
        return RunEventOutput(self.context["events"], many=True).data

"""Tool confirmation and approval-rule services: deciding is atomic, the first decision wins."""
from __future__ import annotations

import functools
import os
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from core.doorbell import ring
from core.errors import Conflict, Forbidden, InvalidInput, NotFound

from .models import ToolConfirmation, ToolRule
from .permissions import (can_change_tool_rule, can_decide_any_confirmation, can_decide_confirmation,
                          can_make_agent_rules)
from .policy import Effect, policy_evaluate, rule_matches, rule_problems
from .selectors import tool_confirmations_still_waiting, tool_rules_for_call

# Where a decision can be remembered (``remember`` on approve/deny).
REMEMBER_SCOPES = (ToolRule.Scope.CONVERSATION.value, ToolRule.Scope.AGENT.value)


def tool_confirmation_get(*, user: Any, confirmation_id: str) -> ToolConfirmation:
    confirmation = (
        ToolConfirmation.objects.select_related("run__conversation").filter(id=confirmation_id).first()
        if _is_uuid(confirmation_id)
        else None
    )
    if confirmation is None or not can_decide_confirmation(user=user, confirmation=confirmation):
        raise NotFound("Tool confirmation not found.", code="confirmation_not_found")
    return confirmation


def tool_confirmation_decide(*, user: Any, confirmation_id: str, approved: bool, reason: str = "",
                             remember: str | None = None, pattern: str | None = None) -> ToolConfirmation:
    """Approve or deny a pending confirmation, then wake the waiting run.

    With ``remember`` (``"conversation"``, or ``"agent"`` for staff) the decision also becomes a
    rule in that scope — ``allow`` when approved, ``deny`` when denied — for this tool and, when
    given, ``pattern`` on its main argument; every other pending confirmation the new rule now
    decides (same conversation and owner, or same agent) is decided the same way. All of it is
    one transaction; each affected run is woken after commit.

    Returns:
        The decided confirmation, with ``remembered_rule`` (the new :class:`ToolRule` or None)
        and ``also_decided`` (ids of the other confirmations decided) set on it.

    Raises:
        NotFound: unknown id, or another user's confirmation.
        Conflict: ``confirmation_expired`` past its ``expiresAt`` or when its run no longer
            executes anywhere (the row becomes ``expired``); ``confirmation_already_decided``
            otherwise. The first decision wins.
        InvalidInput: an unknown ``remember``, a ``pattern`` without it, or a pattern that is not
            valid for the tool.
        Forbidden: ``remember="agent"`` by a user who is not staff.
    """
    confirmation = tool_confirmation_get(user=user, confirmation_id=confirmation_id)
    _expire_if_stale(confirmation)
    pattern = (pattern or "").strip()
    if remember is not None and remember not in REMEMBER_SCOPES:
        raise InvalidInput(f"remember must be one of: {', '.join(REMEMBER_SCOPES)}.", code="invalid_input")
    if pattern and remember is None:
        raise InvalidInput("pattern only applies with remember (conversation or agent).", code="invalid_input")
    if remember == ToolRule.Scope.AGENT and not can_make_agent_rules(user=user):
        raise Forbidden("Only staff can remember a decision for the whole agent; use remember: conversation.")
    status = ToolConfirmation.Status.APPROVED if approved else ToolConfirmation.Status.DENIED
    rule: ToolRule | None = None
    also_decided: list[str] = []
    with transaction.atomic():
        updated = ToolConfirmation.objects.filter(id=confirmation.id, status=ToolConfirmation.Status.PENDING).update(
            status=status, decided_by=user, decided_at=timezone.now(), reason=reason[:2000]
        )
        if not updated:
            confirmation.refresh_from_db()
            raise Conflict(
                f"Tool confirmation was already {confirmation.status}.",
                code="confirmation_already_decided",
                extra={"status": confirmation.status},
            )
        run_id = str(confirmation.run_id)
        transaction.on_commit(lambda: _ring_sync(run_id, str(confirmation.id)))
        if remember is not None:
            run = confirmation.run
            if remember == ToolRule.Scope.AGENT and run.agent_id is None:
                raise InvalidInput("This run's agent no longer exists; remember the decision for the conversation.",
                                   code="invalid_input")
            rule = tool_rule_create(
                user=user, effect=Effect.ALLOW if approved else Effect.DENY, tool=confirmation.tool, argument=pattern,
                scope=remember, owner=user,
                agent_id=run.agent_id if remember == ToolRule.Scope.AGENT else None,
                conversation_id=run.conversation_id if remember == ToolRule.Scope.CONVERSATION else None,
            )
            also_decided = _covered_confirmations_decide(user=user, rule=rule, exclude_id=confirmation.id)
    confirmation.refresh_from_db()
    confirmation.remembered_rule = rule  # type: ignore[attr-defined]
    confirmation.also_decided = also_decided  # type: ignore[attr-defined]
    return confirmation


def tool_confirmation_admin_decide(*, admin: Any, confirmation_id: Any, approved: bool,
                                   reason: str = "") -> ToolConfirmation:
    """A decision from the admin console, on any user's confirmation.

    The same first-decision-wins update and the same wake-up of the waiting run (wherever it
    executes) as :func:`tool_confirmation_decide`; recorded as decided by the admin. No rule is
    remembered from here (admins add rules in the rule admin).

    Raises:
        Forbidden: the user is not active staff with ``tools_app.change_toolconfirmation``.
        NotFound: unknown id.
        Conflict: ``confirmation_expired`` / ``confirmation_already_decided``, as for the owner.
    """
    if not can_decide_any_confirmation(user=admin):
        raise Forbidden("Only staff who may change tool confirmations decide them from the admin.")
    confirmation = (ToolConfirmation.objects.select_related("run__conversation").filter(id=confirmation_id).first()
                    if _is_uuid(str(confirmation_id)) else None)
    if confirmation is None:
        raise NotFound("Tool confirmation not found.", code="confirmation_not_found")
    _expire_if_stale(confirmation)
    status = ToolConfirmation.Status.APPROVED if approved else ToolConfirmation.Status.DENIED
    with transaction.atomic():
        if not ToolConfirmation.objects.filter(id=confirmation.id, status=ToolConfirmation.Status.PENDING).update(
                status=status, decided_by=admin, decided_at=timezone.now(), reason=(reason or "")[:2000]):
            confirmation.refresh_from_db()
            raise Conflict(f"Tool confirmation was already {confirmation.status}.",
                           code="confirmation_already_decided", extra={"status": confirmation.status})
        run_id, key = str(confirmation.run_id), str(confirmation.id)
        transaction.on_commit(lambda: _ring_sync(run_id, key))
    confirmation.refresh_from_db()
    return confirmation


def _expire_if_stale(confirmation: ToolConfirmation) -> None:
    """Nobody approves a ghost: a confirmation past its deadline, or whose run ended or executes
    nowhere any more (lease expired: its server stopped), becomes ``expired`` and says so."""
    run = confirmation.run
    now = timezone.now()
    if confirmation.status == ToolConfirmation.Status.PENDING:
        reason = ""
        if confirmation.expires_at is not None and confirmation.expires_at <= now:
            reason = "nobody decided in time"
        elif run.status in ("succeeded", "failed", "cancelled"):
            reason = f"its run already {run.status}"
        elif run.lease_expires_at is None or run.lease_expires_at <= now:
            reason = "its run no longer executes (the server stopped)"
        if reason and ToolConfirmation.objects.filter(id=confirmation.id, status=ToolConfirmation.Status.PENDING).update(
                status=ToolConfirmation.Status.EXPIRED, decided_at=now, reason=reason):
            confirmation.status = ToolConfirmation.Status.EXPIRED
            confirmation.reason = reason
    if confirmation.status == ToolConfirmation.Status.EXPIRED:
        raise Conflict(f"Tool confirmation expired: {confirmation.reason or 'nobody decided in time'}.",
                       code="confirmation_expired", extra={"status": confirmation.status})
def _covered_confirmations_decide(*, user: Any, rule: ToolRule, exclude_id: Any) -> list[str]:
    """Decide the still-waiting confirmations that ``rule`` matches and the whole policy now
    decides its way (an ask or deny rule elsewhere keeps a call waiting). Inside the caller's
    transaction."""
    candidates = tool_confirmations_still_waiting().exclude(id=exclude_id).select_related("run__agent")
    if rule.scope == ToolRule.Scope.CONVERSATION:
        candidates = candidates.filter(run__conversation_id=rule.conversation_id, run__conversation__owner=user)
    else:
        candidates = candidates.filter(run__agent_id=rule.agent_id)
    status = ToolConfirmation.Status.APPROVED if rule.effect == Effect.ALLOW else ToolConfirmation.Status.DENIED
    rules_for: dict[tuple[Any, Any], list[ToolRule]] = {}
    decided: list[str] = []
    for candidate in candidates.order_by("created_at"):
        run = candidate.run
        workspace = os.path.realpath(run.agent.workspace_path) if run.agent is not None else None
        if not rule_matches(rule=rule, tool_name=candidate.tool, tool_input=candidate.input, workspace=workspace):
            continue
        key = (run.agent_id, run.conversation_id)
        if key not in rules_for:
            rules_for[key] = tool_rules_for_call(agent_id=run.agent_id, conversation_id=run.conversation_id)
        decision = policy_evaluate(tool_name=candidate.tool, tool_input=candidate.input, rules=rules_for[key],
                                   default_effect=Effect.ASK, workspace=workspace)
        if decision.effect != rule.effect:
            continue
        updated = ToolConfirmation.objects.filter(id=candidate.id, status=ToolConfirmation.Status.PENDING).update(
            status=status, decided_by=user, decided_at=timezone.now(), reason=f"decided by rule: {rule.name}"[:2000])
        if updated:
            transaction.on_commit(functools.partial(_ring_sync, str(candidate.run_id), str(candidate.id)))
            decided.append(str(candidate.id))
    return decided


# --- approval rules ------------------------------------------------------------------------------

def tool_rule_create(*, user: Any, effect: str, tool: str, scope: str, argument: str = "", name: str = "",
                     agent_id: Any = None, conversation_id: Any = None, owner: Any = None) -> ToolRule:
    """Validate and save one approval rule (a blank name is generated from the rule).

    Raises:
        Forbidden: an agent or global rule by a user who is not staff, or a conversation rule
            owned by someone else.
        InvalidInput: a field is not valid (``errors`` maps each field to what is wrong).
    """
    rule = ToolRule(effect=effect, tool=_stripped(tool), argument=_stripped(argument), scope=scope,
                    agent_id=agent_id, conversation_id=conversation_id, owner=owner or user, name=_stripped(name))
    if not can_change_tool_rule(user=user, rule=rule):
        raise Forbidden("Only staff make agent and global rules; a conversation rule belongs to the conversation's owner.")
    problems = rule_problems(effect=rule.effect, tool=rule.tool, argument=rule.argument, scope=rule.scope,
                             agent_id=rule.agent_id, conversation_id=rule.conversation_id, name=rule.name)
    if problems:
        raise InvalidInput("; ".join(f"{field}: {message}" for field, message in problems.items()),
                           code="invalid_input", extra={"errors": problems})
    rule.save()
    return rule


def tool_rule_delete(*, user: Any, rule_id: Any, conversation_id: Any) -> None:
    """Delete one of a conversation's own rules.

    Raises:
        NotFound: no such rule in this conversation, or not the caller's (``tool_rule_not_found``).
    """
    pk = _int_or_none(rule_id)
    rule = (ToolRule.objects.filter(pk=pk, scope=ToolRule.Scope.CONVERSATION, conversation_id=conversation_id).first()
            if pk is not None else None)
    if rule is None or not can_change_tool_rule(user=user, rule=rule):
        raise NotFound("Tool rule not found.", code="tool_rule_not_found")
    rule.delete()


def _stripped(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _int_or_none(value: Any) -> int | None:
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if 0 < number < 2**63 else None


def _ring_sync(run_id: str, confirmation_id: str) -> None:
    async_to_sync(ring)(run_id, "confirmation", key=confirmation_id)


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True

"""Chat services: conversations and the run service every transport adapts.

A run is started by :func:`run_create` — the one short burst of database work a request does:
it validates the turn, picks the engine, and records the run, the user message and its
``agent.start`` event in one transaction — then handed to the executor
(``chat_app/executor.py``), whose task goes straight to the engine. :func:`run_start` does both
for async callers. Events are read with :func:`run_subscribe` (or a dialect, through
``chat_app.transports.stream_run``). The run belongs to the server, not the connection: a
transport that goes away just stops reading, unless its dialect cancels the run.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from agents_app.models import Agent
from agents_app.router import route_run
from agents_app.selectors import agent_for_run
from core.doorbell import ring
from core.errors import Conflict, ErrorCode, InvalidInput, NotFound
from core.events import RecordedEvent, RunEnded, RunError, RunStarted
from tools_app.mcp_policy import mcp_servers_for_run

from .eventlog import in_thread, insert_events
from .executor import RunLaunch, RunRecord, get_executor, orphaned_runs_q, record_run
from .models import Conversation, Message, Run, RunEvent
from .selectors import NOT_SUPERSEDED, conversation_get, conversation_last_turn, run_get
from .usage import RunSpend

logger = logging.getLogger("orchestrator.runs")

MAX_INPUT_CHARS = 200_000


# --- conversations -------------------------------------------------------------------------------

def conversation_create(*, user: Any, title: str = "", agent: Agent | None = None) -> Conversation:
    return Conversation.objects.create(owner=user, title=(title or "")[:300], agent=agent)


def conversation_rename(*, user: Any, conversation_id: Any, title: str) -> Conversation:
    """Set a conversation's title (trimmed, at most 300 characters; blank clears it)."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    conversation.title = (title or "").strip()[:300]
    # Renaming is not activity: the list order (updated_at) stays as it was.
    Conversation.objects.filter(pk=conversation.pk).update(title=conversation.title)
    return conversation


async def conversation_delete(*, user: Any, conversation_id: Any) -> None:
    """Delete a conversation with its messages, runs, timelines, confirmations and rules.

    Its live runs are cancelled first (wherever they execute), so nothing keeps writing to a
    conversation that is gone and no confirmation of it is left waiting.

    Raises:
        NotFound: unknown conversation, or another user's.
    """
    conversation = await in_thread(conversation_get)(user=user, conversation_id=conversation_id)
    live = await in_thread(lambda: [str(i) for i in Run.objects.filter(conversation=conversation)
                                    .exclude(status__in=Run.TERMINAL).values_list("id", flat=True)])()
    for run_id in live:
        try:
            await run_cancel(user=user, run_id=run_id)
        except Conflict:
            pass  # it ended on its own meanwhile
    await in_thread(_conversation_delete_rows)(conversation=conversation)


def _conversation_delete_rows(*, conversation: Conversation) -> None:
    from tools_app.models import ToolRule

    with transaction.atomic():
        ToolRule.objects.filter(scope=ToolRule.Scope.CONVERSATION, conversation_id=conversation.id).delete()
        conversation.delete()


# --- runs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunCreated:
    """A prepared run: its launch (what the executor runs) and its start rows (built on first use)."""

    record: RunRecord
    launch: RunLaunch

    @property
    def conversation_created(self) -> bool:
        return self.record.conversation_created

    @property
    def run(self) -> Run:
        return self.record.run

    @property
    def conversation(self) -> Conversation:
        return self.record.conversation

    @property
    def user_message(self) -> Message:
        return self.record.message


def run_create(
    *,
    user: Any,
    input: str,
    conversation_id: str | None = None,
    agent_role: str | None = None,
    engine: str | None = None,
    model: str | None = None,
    provider: str | None = None,
    history: list[dict[str, str]] | None = None,
    options: dict[str, Any] | None = None,
    title: str | None = None,
    allow_inline_mcp: bool = False,
    defer_commit: bool = False,
) -> RunCreated:
    """Validate a chat turn, choose the engine, and record the run (one commit, maybe deferred).

    The run is created ``running`` with its user message and its ``agent.start`` event (seq 1),
    and everything the engine needs (history, the frozen agent spec with its prompt) is gathered
    here, so executing it starts with the provider call, not with more database work.

    Args:
        history: explicit earlier turns (seed 000's ``conversation_history``); when None the
            conversation's stored messages are the history.
        provider: pin a provider (also ``options["provider"]``, ACP's ``--provider``); the
            router's rules, budgets' cheapest-model switch and failover then stay on it.
        options: engine options for this run only. ``mcp_servers`` is what the request asked
            for (names of registered servers); it is replaced by the full list the policy allows.
        allow_inline_mcp: let ``mcp_servers`` carry inline specs (command/url) without the
            permission: only for a caller that is the process owner (ACP over stdio), never HTTP.
        defer_commit: validate and prepare everything but leave the rows to ``launch.record``
            (a :class:`~chat_app.executor.RunRecord`), which the executor hands to the
            group-commit writer when it starts the run: no commit stands between the request and
            the provider call, and concurrent starts share one transaction. Subscribers see
            nothing before it lands. For a caller that hands the run to the executor at once
            (``AsyncApiView.start_stream``).

    Raises:
        InvalidInput: empty or oversized input, unknown engine/provider/model, a malformed ``mcp_servers``.
        ApplicationError: 429 ``budget_exceeded``, 503 ``provider_unavailable`` (see the router).
        NotFound: unknown (or another user's) conversation or agent.
        McpServerNotAllowed: (403) an MCP server the user or agent may not use; nothing is recorded.
    """
    if not isinstance(input, str) or not input.strip():
        raise InvalidInput("input must be a non-empty string.", code="invalid_input")
    if len(input) > MAX_INPUT_CHARS:
        raise InvalidInput(f"input is longer than {MAX_INPUT_CHARS} characters.", code="input_too_long")
    conversation = conversation_get(user=user, conversation_id=conversation_id) if conversation_id else None
    role = agent_role or (conversation.agent.role if conversation and conversation.agent else None) or settings.DEFAULT_AGENT_ROLE
    agent, spec = agent_for_run(role=role)
    if history is None:
        history = _stored_history(conversation) if conversation is not None else []
    route = route_run(agent=agent, engine=engine, model=model, provider=provider or (options or {}).get("provider"),
                      user=user, task=input, history=history, spend=RunSpend())
    # Decided here, before anything is recorded or started: the only MCP servers a run opens.
    options = {**(options or {}), "mcp_servers": mcp_servers_for_run(
        user=user, agent=agent, requested=(options or {}).get("mcp_servers"),
        allow_inline=True if allow_inline_mcp else None)}
    created = conversation is None
    if created:
        conversation_id, session_id = uuid.uuid4(), ""
    else:
        # The conversation's activity time (and its agent, if it had none) move with the turn.
        conversation.agent_id = conversation.agent_id or agent.pk
        conversation_id, session_id = conversation.id, conversation.engine_session_id
    run_id = uuid.uuid4()

    def build() -> tuple[Conversation, Run, Message]:
        # The model instances, made when first needed (RunRecord): by the writer, for a deferred commit.
        turn = conversation if conversation is not None else Conversation(
            id=conversation_id, owner=user, title=(title or input.strip().splitlines()[0][:80])[:300], agent=agent)
        run = Run(
            id=run_id, conversation=turn, agent=agent, engine=route.engine, provider=route.provider,
            model=route.model, route_note=route.note, status=Run.Status.RUNNING,
            lease_expires_at=timezone.now() + timedelta(seconds=float(settings.RUN_LEASE_SECONDS)),
        )
        return turn, run, Message(conversation=turn, run=run, role=Message.Role.USER, content=input)

    started = RecordedEvent(str(run_id), 1, RunStarted(
        run_id=str(run_id), conversation_id=str(conversation_id), agent_role=agent.role, engine=route.engine,
        model=route.model, provider=route.provider, session_id=session_id, route_note=route.note))
    record = RunRecord(build=build, conversation_created=created, started=started)
    if not defer_commit:
        with transaction.atomic():
            record_run(record)
    launch = RunLaunch(run_id=str(run_id), conversation_id=str(conversation_id), agent=spec, engine=route.engine,
                       model=route.model, provider=route.provider, user_input=input, history=history,
                       session_id=session_id, started=started, options=options,
                       route=route, record=record if defer_commit else None)
    return RunCreated(record=record, launch=launch)


def _stored_history(conversation: Conversation) -> list[dict[str, str]]:
    # Unanswered turns (failed, cancelled) stay in: after "try again" the model still needs the
    # question, and a repeated prompt costs less than a lost one.
    # A turn superseded by a regenerate or an edit stays on record (messages, timeline) but is
    # never sent to the model again.
    rows = Message.objects.filter(NOT_SUPERSEDED, conversation=conversation,
                                  role__in=[Message.Role.USER, Message.Role.ASSISTANT])
    return [{"role": role, "content": content} for role, content in rows.order_by("created_at", "id").values_list("role", "content")]


async def run_start(**kwargs: Any) -> RunCreated:
    """``run_create`` (in a worker thread) then submit to the executor, for async callers."""
    created = await in_thread(run_create)(**kwargs)
    get_executor().submit(created.launch)
    return created


T = TypeVar("T")

# How much longer than RUN_RECORD_(MAX_)DELAY a run announced by another process may take to be read.
ANNOUNCED_GRACE = 0.5


async def run_read(read: Callable[[], Awaitable[T]], *, run_id: str) -> T:
    """``await read()``: a read of a run whose id a client may have been given a moment ago.

    A stream announces its run (the id in its first frames) before the run's start rows are
    committed: they are written ``RUN_RECORD_DELAY`` later, or at once when something needs them.
    A run started in this process is waited for (its rows are written at once). One started in
    another process cannot be asked: a ``run_not_found`` is read again, after growing pauses,
    until the longer of ``RUN_RECORD_DELAY`` and ``RUN_RECORD_MAX_DELAY`` + 0.5 s have passed,
    and only then is the answer. So an unknown
    (or another user's) run id is answered that much later, alike; a malformed one at once.
    """
    await get_executor().wait_recorded(run_id)
    try:
        uuid.UUID(str(run_id))
    except ValueError:
        return await read()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(float(settings.RUN_RECORD_DELAY), float(settings.RUN_RECORD_MAX_DELAY)) + ANNOUNCED_GRACE
    pause = 0.01
    while True:
        try:
            return await read()
        except NotFound as exc:
            if exc.code != "run_not_found" or loop.time() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.16)


def run_subscribe(*, run_id: str, after_seq: int = 0) -> AsyncIterator[RecordedEvent]:
    """Every event of a run after ``after_seq``, in order, then live ones until the run ends."""
    return aiter(get_executor().subscribe(str(run_id), after_seq=after_seq))


async def run_cancel(*, user: Any, run_id: str) -> Run:
    """Cancel a run wherever it executes: locally at once, elsewhere by the doorbell and a flag.

    A run whose engine already returned can no longer be cancelled: it finishes as it was going
    to, and the caller gets the same 409 as for a run that had already ended.

    Raises:
        NotFound: unknown run, or another user's.
        Conflict: ``run_not_active``, the run ended (or finished despite the request).
    """
    run = await run_read(lambda: in_thread(run_get)(user=user, run_id=run_id), run_id=str(run_id))
    if run.is_terminal:
        raise Conflict(f"Run already {run.status}.", code="run_not_active", extra={"status": run.status})
    await in_thread(lambda: Run.objects.filter(id=run.id).update(cancel_requested=True))()
    if not await get_executor().cancel(str(run.id)):
        await ring(str(run.id), "cancel")
        await _wait_terminal(str(run.id), timeout=10.0)
    run = await in_thread(lambda: Run.objects.select_related("conversation").get(id=run.id))()
    if run.is_terminal and run.status != Run.Status.CANCELLED:
        raise Conflict(f"Run already {run.status}.", code="run_not_active", extra={"status": run.status})
    return run


async def run_reap_orphans() -> int:
    """End runs that execute nowhere any more (not finished, lease expired: their server stopped).

    Each is marked failed (``run_lost``) with an ``error`` and ``agent.end`` appended to its
    timeline in the same transaction, and its pending confirmations expire, so nobody approves a
    ghost. Returns how many.
    """
    executor = get_executor()
    now = timezone.now()
    stale = await in_thread(lambda: [str(i) for i in Run.objects.filter(orphaned_runs_q(now)).values_list("id", flat=True)])()
    reaped = 0
    for run_id in stale:
        if not getattr(executor, "is_live", lambda _: False)(run_id) and await in_thread(_reap_one)(run_id=run_id, now=now):
            reaped += 1
            await ring(run_id, "events")
    return reaped


def _reap_one(*, run_id: str, now: Any) -> bool:
    from tools_app.models import ToolConfirmation

    message = "The server executing this run stopped before it finished."
    with transaction.atomic():
        if not Run.objects.filter(orphaned_runs_q(now), id=run_id).update(
                status=Run.Status.FAILED, ended_at=now, error=message):
            return False  # renewed or finished meanwhile
        last = RunEvent.objects.filter(run_id=run_id).aggregate(last=Max("seq"))["last"] or 0
        insert_events(run_id, [
            RecordedEvent(run_id, last + 1, RunError(code=ErrorCode.RUN_LOST, message=message)),
            RecordedEvent(run_id, last + 2, RunEnded(status=Run.Status.FAILED, error=message,
                                                     error_code=ErrorCode.RUN_LOST)),
        ])
        ToolConfirmation.objects.filter(run_id=run_id, status=ToolConfirmation.Status.PENDING).update(
            status=ToolConfirmation.Status.EXPIRED, decided_at=now, reason="run lost")
    logger.warning("reaped run %s: its server stopped before it finished", run_id)
    return True


async def _wait_terminal(run_id: str, *, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    read = in_thread(lambda: Run.objects.filter(id=run_id).values_list("status", flat=True).first())
    while loop.time() < deadline:
        if await read() in Run.TERMINAL:
            return
        await asyncio.sleep(0.1)


def run_create_again(
    *,
    user: Any,
    conversation_id: Any,
    input: str | None = None,
    agent_role: str | None = None,
    engine: str | None = None,
    model: str | None = None,
    provider: str | None = None,
) -> RunCreated:
    """Regenerate the conversation's last answer (``input`` None) or edit-and-resend its last message.

    The last user message and everything after it (the answer, tool calls) are marked
    ``metadata.superseded`` (with ``supersededBy``: the new run's id): they stay in the messages
    and their run's timeline stays whole, but the history given to the model leaves them out.
    The new run gets the same or the edited text as a new user message.

    Raises:
        NotFound: unknown conversation, or another user's.
        InvalidInput: ``nothing_to_regenerate`` (no user message yet), or an invalid edited input.
        Conflict: ``conversation_busy`` while one of its runs is still running (stop it first).
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    if Run.objects.filter(conversation=conversation).exclude(status__in=Run.TERMINAL).exists():
        raise Conflict("A run of this conversation is still going; stop it first.", code="conversation_busy")
    last = conversation_last_turn(conversation=conversation)
    if last is None:
        raise InvalidInput("This conversation has no message to regenerate.", code="nothing_to_regenerate")
    rows = list(Message.objects.filter(NOT_SUPERSEDED, conversation=conversation,
                                       role__in=[Message.Role.USER, Message.Role.ASSISTANT])
                .order_by("created_at", "id").values_list("id", "role", "content"))
    cut = next(i for i, row in enumerate(rows) if row[0] == last.id)
    history = [{"role": role, "content": content} for _, role, content in rows[:cut]]
    created = run_create(user=user, input=last.content if input is None else input,
                         conversation_id=str(conversation.id), agent_role=agent_role, engine=engine, model=model,
                         provider=provider, history=history)
    # Not yet submitted to the executor: nothing of the new run but its user message exists.
    stale = (Message.objects.filter(conversation=conversation, created_at__gte=last.created_at)
             .filter(NOT_SUPERSEDED).exclude(id=created.user_message.id))
    with transaction.atomic():
        for message in stale.select_for_update():
            message.metadata = {**(message.metadata or {}), "superseded": True, "supersededBy": str(created.run.id)}
            message.save(update_fields=["metadata"])
    return created

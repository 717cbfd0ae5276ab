"""The run executor: where a created run executes, and how its events reach subscribers.

:class:`RunExecutor` is the interface every transport and the run service use — ``submit`` a
run that :func:`chat_app.services.run_create` recorded, ``cancel`` it, ``subscribe`` to its
events — so a worker pool or a task queue can replace :class:`InProcessExecutor` (runs as
tasks on this process's event loop) without touching a transport.

A run's life here: ``submit`` registers its :class:`~chat_app.eventlog.LiveRun` (``agent.start``
is already in it, recorded with the run) and starts a task that goes straight to the engine — no
database write stands between the request and the provider call. Events are published to
subscribers at once and recorded in batches. The end (the answer, the final status, the last
events) is committed in one transaction, written once: a run whose engine already returned can
no longer be cancelled. One keeper task per process renews the leases of its live runs, notices
cancels requested from other processes (behind the doorbell), and ends runs whose process died.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Protocol

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from agents_app.engines import EngineContext, EngineResult, get_engine
from agents_app.specs import AgentSpec, agent_spec
from core.doorbell import RunDoorbell
from core.errors import EngineError, ErrorCode
from core.events import (AssistantMessage, RecordedEvent, RunEnded, RunError, RunEventBase, ToolCallState,
                         ToolStatus)
from core.refreshing_cache import defer_loads_while
from core.scheduling import detach, yield_to_readers
from tools_app.runner import ToolRunner

from .eventlog import LiveRun, LiveSubscription, StoredSubscription, Subscription, in_thread, insert_events
from .group_commit import WRITER, hold_reads_until, insert_rows, update_row
from .failover import engine_attempts
from .models import Conversation, Message, Run
from .usage import run_cost_fields

logger = logging.getLogger("orchestrator.runs")

# How long a finished run stays in memory for late subscribers before they read the database.
LINGER_SECONDS = 30.0
_ACTIVE = (Run.Status.QUEUED, Run.Status.RUNNING)


class RunRecord:
    """A run's start rows, prepared by ``run_create``: the conversation (new, or its activity
    time), the run, the user message and ``agent.start``. Written by :func:`record_run` (or,
    for many runs at once, :func:`record_runs`) in one transaction.

    The three model instances are built from ``build`` on first use, once: for a run whose
    commit is deferred that is in the group-commit writer, off the event loop, after the run's
    provider request went out (model instances were a fifth of a stream request's view time).
    Their ids are fixed before (``agent.start`` and the stream carry them).
    """

    __slots__ = ("conversation_created", "started", "_build", "_rows", "_lock")

    def __init__(self, *, build: Callable[[], tuple[Conversation, Run, Message]], conversation_created: bool,
                 started: RecordedEvent):
        self.conversation_created = conversation_created
        self.started = started
        self._build: Callable[[], tuple[Conversation, Run, Message]] | None = build
        self._rows: tuple[Conversation, Run, Message] | None = None
        self._lock = threading.Lock()

    def _built(self) -> tuple[Conversation, Run, Message]:
        rows = self._rows
        if rows is None:
            with self._lock:  # the writer thread and the loop may ask at once
                if self._rows is None:
                    assert self._build is not None
                    self._rows, self._build = self._build(), None
                rows = self._rows
        return rows

    @property
    def conversation(self) -> Conversation:
        return self._built()[0]

    @property
    def run(self) -> Run:
        return self._built()[1]

    @property
    def message(self) -> Message:
        return self._built()[2]


def record_run(record: RunRecord) -> None:
    """Insert one run's start rows (call inside a transaction)."""
    record_runs([(record,)])


def record_runs(jobs: list[tuple[RunRecord]]) -> None:
    """Many runs' start rows at once: one statement per table (the group commit's merge)."""
    records = [job[0] for job in jobs]
    insert_rows(Conversation, [r.conversation for r in records if r.conversation_created])
    now = timezone.now()
    for r in records:
        if not r.conversation_created:
            Conversation.objects.filter(pk=r.conversation.pk).update(agent_id=r.conversation.agent_id, updated_at=now)
    insert_rows(Run, [r.run for r in records])
    insert_rows(Message, [r.message for r in records])
    for r in records:
        insert_events(str(r.run.id), [r.started])


@dataclass(frozen=True)
class RunLaunch:
    """Everything a run needs to execute, gathered in its start burst: plain data, no ORM rows."""

    run_id: str
    conversation_id: str
    agent: AgentSpec
    engine: str
    model: str
    provider: str
    user_input: str
    # Earlier turns, oldest first: [{"role": "user"|"assistant", "content": str}].
    history: list[dict[str, str]]
    session_id: str
    started: RecordedEvent  # agent.start, seq 1, committed with the run
    options: dict[str, Any] = field(default_factory=dict)
    route: Any = None  # the router's Route: candidates for failover (chat_app/failover.py)
    # The run's start rows when run_create(defer_commit=True) left them to the executor: the
    # group-commit writer inserts them beside the engine's start; batches, the end and
    # subscribers wait for that commit.
    record: RunRecord | None = None


class RunExecutor(Protocol):
    def submit(self, launch: RunLaunch) -> None: ...

    async def cancel(self, run_id: str) -> bool:
        """Cancel a run executing here; False when it does not execute here."""
        ...

    def subscribe(self, run_id: str, *, after_seq: int = 0) -> Subscription: ...

    async def wait_output(self, run_id: str, *, timeout: float) -> None:
        """Until a run submitted here publishes its first output after ``agent.start`` or ends,
        at most ``timeout`` seconds (at once for any other id)."""
        ...

    async def wait_recorded(self, run_id: str) -> None:
        """Until a run submitted here has its rows in the database (at once for any other id).

        A stream's first frames (with the run's id) go out before its start rows are committed;
        what a client does next with the id (cancel, re-attach) waits here first.
        """
        ...


class InProcessExecutor:
    """Runs execute as tasks on this process's event loop."""

    def __init__(self) -> None:
        self.live: dict[str, LiveRun] = {}
        self._keeper: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        # Runs submitted that have not yet published anything after agent.start (their model's
        # first output): while any is, deferred start rows wait (see submit).
        self._starting: set[str] = set()
        # The caches' background reloads (agent specs, the registry, tokens) wait for that too.
        defer_loads_while(self._bursting)

    # --- the interface -----------------------------------------------------------------------
    def submit(self, launch: RunLaunch) -> None:
        if launch.run_id in self.live:
            return
        live = LiveRun(launch.run_id, first=launch.started)
        self.live[launch.run_id] = live
        # A fresh context: the run must not inherit the request's (asgiref's thread-sensitive
        # executor, which dies with the request).
        live.task = asyncio.create_task(self._execute(launch, live), name=f"run-{launch.run_id}",
                                        context=contextvars.Context())
        run_id = launch.run_id
        self._starting.add(run_id)
        live.on_output = functools.partial(self._starting.discard, run_id)
        live.task.add_done_callback(lambda _task: self._starting.discard(run_id))
        if launch.record is not None:
            # After the provider call's start, and while other runs of a burst are still waiting
            # for their first output, after those too (up to RUN_RECORD_MAX_DELAY): the writer
            # thread takes the GIL. At once if someone waits for the rows.
            written = WRITER.write_later(float(settings.RUN_RECORD_DELAY), record_run, launch.record, merge=record_runs,
                                         busy=self._bursting, latest=float(settings.RUN_RECORD_MAX_DELAY))
            hold_reads_until((launch.run_id, launch.conversation_id), written)
            live.await_record(written)
        self._ensure_keeper()

    def _bursting(self) -> bool:
        return bool(self._starting)

    async def cancel(self, run_id: str) -> bool:
        live = self.live.get(str(run_id))
        if live is None or live.task is None or live.task.done():
            return False
        live.request_cancel()
        await asyncio.wait({live.task}, timeout=10)
        return True

    def subscribe(self, run_id: str, *, after_seq: int = 0) -> Subscription:
        live = self.live.get(str(run_id))
        if live is not None:
            return LiveSubscription(live, after_seq)
        return StoredSubscription(str(run_id), after_seq, find_live=self.live.get)

    async def wait_output(self, run_id: str, *, timeout: float) -> None:
        live = self.live.get(str(run_id))
        if live is not None and timeout > 0:
            try:
                async with asyncio.timeout(timeout):
                    await live.wait_output()
            except TimeoutError:
                pass

    async def wait_recorded(self, run_id: str) -> None:
        live = self.live.get(str(run_id))
        if live is not None:
            await live.wait_recorded()

    def is_live(self, run_id: str) -> bool:
        return str(run_id) in self.live

    # --- one run -----------------------------------------------------------------------------
    async def _execute(self, launch: RunLaunch, live: LiveRun) -> None:
        doorbell = RunDoorbell(launch.run_id)
        # A cancel rung from another process: check the row, then cancel (the keeper re-checks the
        # flag on a timer, the safety net for a lost ring). A callback, not a task per run.
        doorbell.on("cancel", functools.partial(_cancel_rung, live))
        attaching = None if doorbell.attach_now() else asyncio.create_task(doorbell.start())
        final: list[RunEventBase]
        spend = _Spend()
        try:
            live.cancellable = True
            if live.cancel_requested:  # cancelled before it got going
                raise asyncio.CancelledError
            result = await _run_engine(launch, live, doorbell, spend)
            # The engine has returned: from here the run finishes as it is; a late cancel changes nothing.
            live.cancellable = False
            message_id = str(uuid.uuid4())
            final = [AssistantMessage(message_id=message_id, content=result.text),
                     RunEnded(status=Run.Status.SUCCEEDED, usage=result.usage, message_id=message_id,
                              session_id=result.session_id, text=result.text)]
            commit = _success_commit(launch, result, message_id)
        except asyncio.CancelledError:
            live.cancellable = False
            final = [RunEnded(status=Run.Status.CANCELLED, error="Run was cancelled.", error_code=ErrorCode.CANCELLED)]
            commit = _failure_commit(launch, Run.Status.CANCELLED, "Run was cancelled.", spend)
        except Exception as exc:  # noqa: BLE001 - every failure ends the run readably
            live.cancellable = False
            code, message = describe_failure(exc, launch=launch)
            final = [RunError(code=code, message=message),
                     RunEnded(status=Run.Status.FAILED, error=message, error_code=code)]
            commit = _failure_commit(launch, Run.Status.FAILED, message, spend)
        finally:
            if attaching is not None:
                attaching.cancel()
        if not await live.wait_recorded():
            # Its rows never reached the database (run_create deferred the commit to us): the
            # subscribers learn why; there is nothing to record the end in.
            message = f"The run could not be recorded: {type(live.record_error).__name__}: {live.record_error}"
            for data in (RunError(code=ErrorCode.INTERNAL_ERROR, message=message),
                         RunEnded(status=Run.Status.FAILED, error=message, error_code=ErrorCode.INTERNAL_ERROR)):
                live.publish(live.make(data), persist=False)
            live.finish_unrecorded()
            await doorbell.stop()
            self.live.pop(launch.run_id, None)
            return
        try:
            await live.finish(final, commit)
        except Exception:  # noqa: BLE001 - nothing may keep subscribers waiting forever
            logger.exception("recording the end of run %s failed", launch.run_id)
            live.done = True
            live.publish(live.make(final[-1]), persist=False)
        finally:
            await doorbell.stop()  # after the end is out (a slow channel layer must not delay it), always
        live.retire()
        loop = asyncio.get_running_loop()
        loop.call_later(LINGER_SECONDS, self._forget, launch.run_id, live)

    def _forget(self, run_id: str, live: LiveRun) -> None:
        """The end of a finished run's linger (unless a newer LiveRun took its id)."""
        if self.live.get(run_id) is live:
            del self.live[run_id]

    # --- the keeper: one task per process for all its live runs -------------------------------
    def _ensure_keeper(self) -> None:
        loop = asyncio.get_running_loop()
        if self._keeper is None or self._keeper[0] is not loop or self._keeper[1].done():
            self._keeper = (loop, loop.create_task(self._keep(), name="run-keeper"))

    async def _keep(self) -> None:
        """Renew this process's run leases, notice cancels requested elsewhere (the safety net
        behind the doorbell) and reap runs whose process died: one query each per interval."""
        from .services import run_reap_orphans

        lease = float(settings.RUN_LEASE_SECONDS)
        loop = asyncio.get_running_loop()
        next_reap = loop.time()
        while True:
            live = [run_id for run_id, run in self.live.items() if not run.done]
            try:
                if live:
                    cancelled = await in_thread(_renew_leases)(live, lease)
                    for run_id in cancelled:
                        if (run := self.live.get(run_id)) is not None:
                            run.request_cancel()
                if loop.time() >= next_reap:
                    next_reap = loop.time() + lease
                    await run_reap_orphans()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - e.g. a database hiccup: try again next interval
                logger.warning("run keeper pass failed", exc_info=True)
            if not self.live:
                return
            await asyncio.sleep(lease / 3)


def _renew_leases(run_ids: list[str], lease: float) -> list[str]:
    Run.objects.filter(id__in=run_ids).update(lease_expires_at=timezone.now() + timedelta(seconds=lease))
    return [str(i) for i in Run.objects.filter(id__in=run_ids, cancel_requested=True).values_list("id", flat=True)]


def _cancel_rung(live: LiveRun) -> None:
    """A cancel ring for ``live``: the database is the truth, so read the flag, then cancel."""
    async def check() -> None:
        if await in_thread(lambda: Run.objects.filter(id=live.run_id, cancel_requested=True).exists())():
            live.request_cancel()

    if live.done or not live.cancellable:  # ended, or its engine already returned: nothing to cancel
        return
    detach(check())


async def _run_engine(launch: RunLaunch, live: LiveRun, doorbell: RunDoorbell, spend: "_Spend") -> EngineResult:
    engine_cls = get_engine(launch.engine)
    if engine_cls is None:
        raise EngineError(f"Engine {launch.engine!r} is not installed.", code=ErrorCode.UNKNOWN_ENGINE)
    options = launch.options
    extra_tools: dict[str, Any] = {}
    mcp_stack = None
    if options.get("mcp_servers"):
        from tools_app.mcp_client import McpToolset

        mcp_stack = McpToolset(options["mcp_servers"])
        extra_tools = await mcp_stack.__aenter__()

    async def emit(event: RunEventBase) -> None:
        await live.record(event)
        if isinstance(event, ToolCallState) and event.status in ToolStatus.TERMINAL:
            # The run service records what it sees: a tool call and its result become a message.
            await in_thread(_tool_message_create)(launch, event)

    try:
        tools = ToolRunner(run_id=launch.run_id, conversation_id=launch.conversation_id, agent=launch.agent,
                           emit=emit, doorbell=doorbell, extra_tools=extra_tools,
                           config=options.get("tool_config") or {}, tool_allowlist=options.get("tool_allowlist"))
        ctx = EngineContext(
            run_id=launch.run_id, conversation_id=launch.conversation_id, agent=launch.agent, model=launch.model,
            user_input=launch.user_input, history=launch.history, tools=tools, session_id=launch.session_id,
            system_prompt=launch.agent.system_prompt, workspace=launch.agent.workspace_path,
            options=options, load_agent=_load_agent, spent=spend.tokens,
        )
        spend.ctx = ctx
        result: EngineResult | None = None
        seconds = float(options.get("timeout") or settings.RUN_TIMEOUT)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                async for item in engine_attempts(launch, ctx, record=live.record):
                    if isinstance(item, EngineResult):
                        result = item
                    elif item.durable:
                        await live.record(item)
                    else:  # a delta: published now, written with the next batch
                        first = not live.has_output
                        live.publish(live.make(item))
                        if first:  # the run's first output: its stream writes it before the run reads on
                            await yield_to_readers()
        except TimeoutError as exc:
            if deadline.expired():  # this run's own deadline (RUN_TIMEOUT or options["timeout"])
                raise EngineError(f"Run timed out after {seconds:g} s.", code=ErrorCode.RUN_TIMEOUT) from exc
            raise
        if result is None:
            raise EngineError("The engine ended without an answer.", code=ErrorCode.NO_ANSWER)
        return result
    finally:
        if mcp_stack is not None:
            await mcp_stack.__aexit__(None, None, None)


async def _load_agent(role: str) -> AgentSpec | None:
    def load() -> AgentSpec | None:
        from agents_app.models import Agent

        agent = Agent.objects.filter(role=role, enabled=True).first()
        return agent_spec(agent) if agent is not None else None

    return await in_thread(load)()


def _tool_message_create(launch: RunLaunch, event: ToolCallState) -> None:
    failed = event.status != ToolStatus.SUCCEEDED
    content = (event.error if failed else event.output) or ""
    Message.objects.create(conversation_id=launch.conversation_id, run_id=launch.run_id, role=Message.Role.TOOL,
                           content=content, metadata={
                               "toolCallId": event.tool_call_id, "name": event.name, "input": event.input,
                               "status": event.status, "isError": failed,
                               **({"confirmationId": event.confirmation_id} if event.confirmation_id else {}),
                               **({"policy": event.policy} if event.policy else {}),
                           })


def _success_commit(launch: RunLaunch, result: EngineResult, message_id: str):
    def commit(recorded: list[RecordedEvent]) -> bool:
        now = timezone.now()
        # Conditional: a final status is written once and never overwritten.
        if not update_row(Run, launch.run_id, {"status": Run.Status.SUCCEEDED, "ended_at": now, "usage": result.usage,
                                               **run_cost_fields(launch, result)}, only_if_in=("status", _ACTIVE)):
            return False
        insert_rows(Message, [Message(
            id=message_id, conversation_id=launch.conversation_id, run_id=launch.run_id,
            role=Message.Role.ASSISTANT, content=result.text,
            metadata={"runId": launch.run_id, "engine": launch.engine, "model": launch.model, "usage": result.usage,
                      **({"sessionId": result.session_id} if result.session_id else {}), **result.metadata},
        )])
        updates: dict[str, Any] = {"updated_at": now}
        if result.session_id:
            updates["engine_session_id"] = result.session_id
        update_row(Conversation, launch.conversation_id, updates)
        return True

    return commit


class _Spend:
    """What the provider billed a run that ends without an EngineResult (see ``EngineContext.spent``)."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.ctx: Any = None

    def fields(self, launch: RunLaunch) -> dict[str, Any]:
        """The run's usage and cost columns, or nothing when no tokens were reported."""
        if not any(self.tokens.values()):
            return {}
        provider, model = getattr(self.ctx, "spent_on", None) or (launch.provider, launch.model)
        spent = EngineResult(text="", usage=dict(self.tokens), provider=provider, model=model)
        return {"usage": spent.usage, **run_cost_fields(launch, spent)}


def _failure_commit(launch: RunLaunch, status: str, error: str, spend: _Spend | None = None):
    billed = spend.fields(launch) if spend is not None else {}

    def commit(recorded: list[RecordedEvent]) -> bool:
        # No partial assistant message is saved; the user message stays so the turn can be
        # retried. What the provider billed before the run stopped is its usage and cost.
        now = timezone.now()
        if not update_row(Run, launch.run_id, {"status": status, "ended_at": now, "error": error[:10_000], **billed},
                          only_if_in=("status", _ACTIVE)):
            return False
        update_row(Conversation, launch.conversation_id, {"updated_at": now})
        return True

    return commit


def describe_failure(exc: BaseException, *, launch: RunLaunch) -> tuple[str, str]:
    """A stable code and a readable message naming where it failed (agent, engine, model, provider)."""
    where = (f"agent {launch.agent.role} (engine {launch.engine}, model {launch.model or 'default'}, "
             f"provider {launch.provider or 'n/a'})")
    if isinstance(exc, TimeoutError):
        logger.warning("run %s timed out for %s", launch.run_id, where)
        return ErrorCode.RUN_TIMEOUT, f"Run timed out after {settings.RUN_TIMEOUT:g} s: {where}."
    if isinstance(exc, EngineError):
        logger.warning("run %s failed for %s: %s", launch.run_id, where, exc.message)
        return exc.code, f"{exc.message} [{where}]"
    logger.exception("run %s crashed for %s", launch.run_id, where)
    return ErrorCode.INTERNAL_ERROR, f"Unexpected {type(exc).__name__}: {exc} [{where}]"


def orphaned_runs_q(now) -> Q:
    """Runs that are not finished and whose lease ran out: they execute nowhere."""
    return Q(status__in=_ACTIVE) & (Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))


EXECUTOR: RunExecutor = InProcessExecutor()


def get_executor() -> RunExecutor:
    return EXECUTOR

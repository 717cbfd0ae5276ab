"""Chat services: conversations and the run service every transport adapts.

A run is started by :func:`run_create` (records the run and the user message, picks the engine)
plus :func:`run_launch` (executes it as a server-side task), or by :func:`run_start` doing both.
Its events are read with :func:`run_subscribe`. The run belongs to the server, not the
connection: a transport that goes away just stops reading, unless it asks for
:func:`run_cancel` (the seed-003 stream does; ``/v1/agent/chat`` does not).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F
from django.utils import timezone

from agents_app.engines import EngineContext, EngineError, EngineResult, get_engine
from agents_app.models import Agent
from agents_app.router import route_run
from agents_app.selectors import agent_get_for_run
from orchestrator_site.errors import Conflict, InvalidInput, NotFound
from tools_app.mcp_policy import mcp_servers_for_run
from tools_app.runner import ToolRunner

from . import runtime
from .doorbell import RunDoorbell, ring
from .events import AssistantMessage, RecordedEvent, RunEnded, RunError, RunEventBase, RunStarted
from .models import Conversation, Message, Run
from .selectors import conversation_get, run_get

logger = logging.getLogger("orchestrator.runs")

MAX_INPUT_CHARS = 200_000


# --- conversations -------------------------------------------------------------------------------

def conversation_create(*, user: Any, title: str = "", agent: Agent | None = None) -> Conversation:
    return Conversation.objects.create(owner=user, title=(title or "")[:300], agent=agent)


# --- runs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunCreated:
    run: Run
    conversation: Conversation
    conversation_created: bool
    user_message: Message


def run_create(
    *,
    user: Any,
    input: str,
    conversation_id: str | None = None,
    agent_role: str | None = None,
    engine: str | None = None,
    model: str | None = None,
    history: list[dict[str, str]] | None = None,
    options: dict[str, Any] | None = None,
    title: str | None = None,
) -> RunCreated:
    """Validate a chat turn, record the run and the user message, and choose the engine.

    Args:
        history: explicit earlier turns (seed 000's ``conversation_history``); when None the
            conversation's stored messages are the history.
        options: engine options for this run only. ``mcp_servers`` is what the request asked
            for (names of registered servers); it is replaced by the full list the policy allows.

    Raises:
        InvalidInput: empty or oversized input, unknown engine, a malformed ``mcp_servers``.
        NotFound: unknown (or another user's) conversation or agent.
        McpServerNotAllowed: (403) an MCP server the user or agent may not use; nothing is recorded.
    """
    if not isinstance(input, str) or not input.strip():
        raise InvalidInput("input must be a non-empty string.", code="invalid_input")
    if len(input) > MAX_INPUT_CHARS:
        raise InvalidInput(f"input is longer than {MAX_INPUT_CHARS} characters.", code="input_too_long")
    conversation = conversation_get(user=user, conversation_id=conversation_id) if conversation_id else None
    role = agent_role or (conversation.agent.role if conversation and conversation.agent else None) or settings.DEFAULT_AGENT_ROLE
    agent = agent_get_for_run(role=role)
    route = route_run(agent=agent, engine=engine, model=model)
    # Decided here, before anything is recorded or started: the only MCP servers a run opens.
    options = {**(options or {}), "mcp_servers": mcp_servers_for_run(
        user=user, agent=agent, requested=(options or {}).get("mcp_servers"))}
    with transaction.atomic():
        created = conversation is None
        if created:
            conversation = conversation_create(user=user, title=title or input.strip().splitlines()[0][:80], agent=agent)
        elif conversation.agent_id is None:
            conversation.agent = agent
        run = Run.objects.create(
            conversation=conversation,
            agent=agent,
            engine=route.engine,
            provider=route.provider,
            model=route.model,
            route_note=route.note,
        )
        message = Message.objects.create(conversation=conversation, run=run, role=Message.Role.USER, content=input)
        conversation.save(update_fields=["agent", "updated_at"])
    run._launch_spec = {"history": history, "options": options}  # type: ignore[attr-defined]
    return RunCreated(run=run, conversation=conversation, conversation_created=created, user_message=message)


async def run_launch(*, run: Run, history: list[dict[str, str]] | None = None, options: dict[str, Any] | None = None) -> None:
    """Start executing a created run as a task on this process's event loop; returns at once."""
    run_id = str(run.id)
    if run_id in runtime.LIVE_RUNS:
        return
    spec = getattr(run, "_launch_spec", {})
    live = runtime.LiveRun(run_id)
    runtime.register(live)
    # A fresh context: the run must not inherit the launching request's thread-sensitive
    # executor (asgiref), which is shut down when that request ends.
    live.task = asyncio.create_task(
        _execute(live, history=history if history is not None else spec.get("history"),
                 options=options if options is not None else spec.get("options") or {}),
        name=f"run-{run_id}",
        context=contextvars.Context(),
    )


async def run_start(**kwargs: Any) -> RunCreated:
    """``run_create`` then ``run_launch``, for async callers (WebSocket, ACP, tests)."""
    created = await sync_to_async(run_create)(**kwargs)
    await run_launch(run=created.run)
    return created


def run_subscribe(*, run_id: str, after_seq: int = 0) -> AsyncIterator[RecordedEvent]:
    return runtime.subscribe(str(run_id), after_seq=after_seq)


async def run_cancel(*, user: Any, run_id: str) -> Run:
    """Cancel a run wherever it executes: locally at once, elsewhere by the doorbell and a flag."""
    run = await sync_to_async(run_get)(user=user, run_id=run_id)
    if run.is_terminal:
        raise Conflict(f"Run already {run.status}.", code="run_not_active", extra={"status": run.status})
    await Run.objects.filter(id=run.id).aupdate(cancel_requested=True)
    if not await runtime.cancel_local(str(run.id)):
        await ring(str(run.id), "cancel")
        await _wait_terminal(str(run.id), timeout=10.0)
    return await Run.objects.aget(id=run.id)


async def _wait_terminal(run_id: str, *, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        status = await Run.objects.filter(id=run_id).values_list("status", flat=True).afirst()
        if status in Run.TERMINAL:
            return
        await asyncio.sleep(0.1)


# --- execution -----------------------------------------------------------------------------------

async def _execute(live: runtime.LiveRun, *, history: list[dict[str, str]] | None, options: dict[str, Any]) -> None:
    run = await Run.objects.select_related("conversation", "agent").aget(id=live.run_id)
    conversation = run.conversation
    agent = run.agent
    doorbell = RunDoorbell(live.run_id)
    await doorbell.start()
    watcher = asyncio.create_task(_watch_cancel(live, doorbell), name=f"run-cancel-watch-{live.run_id}")
    ended: RunEnded
    try:
        live.cancellable = True
        if live.cancel_requested:  # cancelled before it got going
            raise asyncio.CancelledError
        await Run.objects.filter(id=run.id).aupdate(status=Run.Status.RUNNING)
        await live.emit(RunStarted(
            run_id=live.run_id, conversation_id=str(conversation.id), agent_role=agent.role if agent else "",
            engine=run.engine, model=run.model, provider=run.provider, session_id=conversation.engine_session_id,
            route_note=run.route_note,
        ))
        if agent is None:
            raise EngineError("The run's agent no longer exists.", code="agent_not_found")
        if history is None:
            history = await _stored_history(conversation_id=str(conversation.id), before_run=str(run.id))
        user_message = await Message.objects.filter(run_id=run.id, role=Message.Role.USER).afirst()
        result = await _run_engine(run=run, agent=agent, live=live, doorbell=doorbell, history=history,
                                   options=options, user_input=user_message.content if user_message else "")
        message = await _finish_success(run=run, result=result)
        await live.emit(AssistantMessage(message_id=str(message.id), content=result.text))
        live.cancellable = False
        ended = RunEnded(status=Run.Status.SUCCEEDED, usage=result.usage, message_id=str(message.id),
                         session_id=result.session_id, text=result.text)
    except asyncio.CancelledError:
        live.cancellable = False
        await _finish_failure(run=run, status=Run.Status.CANCELLED, error="Run was cancelled.")
        ended = RunEnded(status=Run.Status.CANCELLED, error="Run was cancelled.", error_code="cancelled")
    except Exception as exc:  # noqa: BLE001 - every failure ends the run readably
        live.cancellable = False
        code, message = _describe_failure(exc, run=run, agent=agent)
        await _finish_failure(run=run, status=Run.Status.FAILED, error=message)
        await live.emit(RunError(code=code, message=message))
        ended = RunEnded(status=Run.Status.FAILED, error=message, error_code=code)
    finally:
        watcher.cancel()
        await doorbell.stop()
    await live.emit(ended)
    await live.flush()
    live.finish()
    runtime.linger_then_forget(live)
    # Runs do their ORM work on asgiref's shared thread, outside any request: release its
    # connection the way a request would, so idle servers hold none (CONN_MAX_AGE is 0).
    await sync_to_async(close_old_connections)()


async def _run_engine(*, run: Run, agent: Agent, live: runtime.LiveRun, doorbell: RunDoorbell,
                      history: list[dict[str, str]], options: dict[str, Any], user_input: str) -> EngineResult:
    engine_cls = get_engine(run.engine)
    if engine_cls is None:
        raise EngineError(f"Engine {run.engine!r} is not installed.", code="unknown_engine")
    extra_tools: dict[str, Any] = {}
    mcp_servers = list(options.get("mcp_servers") or [])  # decided by run_create (tools_app.mcp_policy)
    mcp_stack = None
    if mcp_servers:
        from tools_app.mcp_client import McpToolset

        mcp_stack = McpToolset(mcp_servers)
        extra_tools = await mcp_stack.__aenter__()
    try:
        tools = ToolRunner(run_id=live.run_id, conversation_id=str(run.conversation_id), agent=agent,
                           emit=live.emit, doorbell=doorbell, extra_tools=extra_tools, config=options.get("tool_config") or {})
        ctx = EngineContext(
            run_id=live.run_id, conversation_id=str(run.conversation_id), agent=agent, model=run.model,
            user_input=user_input, history=history, tools=tools, session_id=run.conversation.engine_session_id,
            system_prompt=await sync_to_async(agent.effective_system_prompt)(), workspace=agent.workspace_path,
            options=options, load_agent=_load_agent,
        )
        result: EngineResult | None = None
        seconds = float(options.get("timeout") or settings.RUN_TIMEOUT)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                async for item in engine_cls().run(ctx):
                    if isinstance(item, EngineResult):
                        result = item
                    elif isinstance(item, RunEventBase):
                        await live.emit(item)
        except TimeoutError as exc:
            if deadline.expired():  # this run's own deadline (RUN_TIMEOUT or options["timeout"])
                raise EngineError(f"Run timed out after {seconds:g} s.", code="run_timeout") from exc
            raise
        if result is None:
            raise EngineError("The engine ended without an answer.", code="no_answer")
        return result
    finally:
        if mcp_stack is not None:
            await mcp_stack.__aexit__(None, None, None)


async def _watch_cancel(live: runtime.LiveRun, doorbell: RunDoorbell) -> None:
    """Cancel this run when another process asks (doorbell), re-checking the flag on a timer."""
    while True:
        await doorbell.wait("cancel", float(settings.CONFIRMATION_RECHECK_INTERVAL))
        requested = await Run.objects.filter(id=live.run_id).values_list("cancel_requested", flat=True).afirst()
        if requested:
            live.request_cancel()
            return


async def _load_agent(role: str) -> Agent | None:
    return await Agent.objects.filter(role=role, enabled=True).afirst()


async def _stored_history(*, conversation_id: str, before_run: str) -> list[dict[str, str]]:
    # Unanswered turns (failed, cancelled) stay in: after "try again" the model still needs the
    # question, and a repeated prompt costs less than a lost one.
    rows = Message.objects.filter(
        conversation_id=conversation_id, role__in=[Message.Role.USER, Message.Role.ASSISTANT]
    ).exclude(run_id=before_run, role=Message.Role.USER).order_by("created_at", "id")
    return [{"role": m.role, "content": m.content} async for m in rows]


@sync_to_async
def _finish_success(*, run: Run, result: EngineResult) -> Message:
    with transaction.atomic():
        message = Message.objects.create(
            conversation_id=run.conversation_id, run=run, role=Message.Role.ASSISTANT, content=result.text,
            metadata={"runId": str(run.id), "engine": run.engine, "model": run.model, "usage": result.usage,
                      **({"sessionId": result.session_id} if result.session_id else {}), **result.metadata},
        )
        Run.objects.filter(id=run.id).update(status=Run.Status.SUCCEEDED, ended_at=timezone.now(), usage=result.usage)
        updates: dict[str, Any] = {"updated_at": timezone.now()}
        if result.session_id:
            updates["engine_session_id"] = result.session_id
        Conversation.objects.filter(id=run.conversation_id).update(**updates)
    return message


@sync_to_async
def _finish_failure(*, run: Run, status: str, error: str) -> None:
    # No partial assistant message is saved; the user message stays so the turn can be retried.
    Run.objects.filter(id=run.id).update(status=status, ended_at=timezone.now(), error=error[:10_000])
    Conversation.objects.filter(id=run.conversation_id).update(updated_at=timezone.now())


def _describe_failure(exc: Exception, *, run: Run, agent: Agent | None) -> tuple[str, str]:
    where = f"agent {agent.role if agent else '?'} (engine {run.engine}, model {run.model or 'default'}, provider {run.provider or 'n/a'})"
    if isinstance(exc, TimeoutError):
        timeout = settings.RUN_TIMEOUT
        logger.warning("run %s timed out for %s", run.id, where)
        return "run_timeout", f"Run timed out after {timeout:g} s: {where}."
    if isinstance(exc, EngineError):
        logger.warning("run %s failed for %s: %s", run.id, where, exc.message)
        return exc.code, f"{exc.message} [{where}]"
    logger.exception("run %s crashed for %s", run.id, where)
    return "internal_error", f"Unexpected {type(exc).__name__}: {exc} [{where}]"

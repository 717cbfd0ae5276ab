"""ACP (Agent Client Protocol, version 1) over stdio: editors and other orchestrators drive runs.

Two parts, one module, on the ``agent-client-protocol`` package (``import acp``):

- :class:`AcpDialect` — the streaming core's interface for ACP: typed run events → frames
  (:class:`Update`: a ``session/update`` payload; :class:`Notice`: a seed-002 notification the
  client asked for; :class:`PermissionAsk`: ask the client before a tool the policy says to ask
  about). Mapping:

  ============================================  ==============================================
  run event                                     ACP
  ============================================  ==============================================
  ``agent.delta``                               ``agent_message_chunk``
  ``agent.thought``, a step's ``thought``       ``agent_thought_chunk``
  ``context.patch`` kind ``step`` (Ollama)      ``plan`` (one entry per step; earlier ones
                                                ``completed``, the current ``in_progress``)
  ``tool.state`` ``pending``                    ``tool_call`` (``pending``, kind, title,
                                                ``rawInput``, file locations)
  ``tool.state`` ``awaiting_input``             ``session/request_permission`` (a request)
  ``tool.state`` ``running``                    ``tool_call_update`` ``in_progress``
  ``tool.state`` ``succeeded``                  ``tool_call_update`` ``completed`` + output
  ``tool.state`` ``failed``/``denied``          ``tool_call_update`` ``failed`` + the reason
  ``agent.end``                                 the ``session/prompt`` answer's ``stopReason``
  ============================================  ==============================================

  In replay mode (``session/load``) a tool call is sent once, as ``tool_call`` with its final
  state, and nothing is asked.

- :class:`OrchestratorAcpAgent` — the ``acp.Agent``: a session is a conversation owned by the
  process's user; ``session/prompt`` is :func:`chat_app.services.run_start` streamed through
  :func:`~chat_app.transports.base.stream_run` with the dialect; permissions are decided with
  :func:`tools_app.services.tool_confirmation_decide` (an "always" option becomes a
  conversation-scoped rule); ``session/cancel`` is :func:`chat_app.services.run_cancel`.

The stdio framing and the raw-line error answers are in ``acp_stdio.py``; the command is
``manage.py acp`` (``chat_app/management/commands/acp.py``).
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, ClassVar, Iterable

import acp
from acp import RequestError
from acp.schema import (AgentCapabilities, AllowedOutcome, DeniedOutcome, EmbeddedResourceContentBlock,
                        FileEditToolCallContent, HttpMcpServer, Implementation, InitializeResponse,
                        ListSessionsResponse, LoadSessionResponse, McpCapabilities, McpServerStdio,
                        NewSessionResponse, PermissionOption, PlanEntry, PromptCapabilities, PromptResponse,
                        ResourceContentBlock, SessionCapabilities, SessionInfo, SessionListCapabilities,
                        SseMcpServer, TextContentBlock, TextResourceContents, ToolCallLocation, ToolCallUpdate)
from django.conf import settings

from core.events import (ContextPatch, RecordedEvent, RunEnded, RunError, RunStarted, TextDelta, Thought,
                         ToolCallState, ToolStatus)

from .acp_stdio import ALIAS_META_KEY
from .base import Dialect, coalesce

logger = logging.getLogger("orchestrator.acp")

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
# Seed-002 notifications a client may ask for at initialize: ``_meta: {"notifications": [...]}``.
# ``permission/request`` switches permission asks to the seed's notification + ``permission/response``.
SEED_NOTIFICATIONS = ("session/progress", "session/output", "permission/request")

PERMISSION_OPTIONS = (
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Always allow in this session", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
    PermissionOption(option_id="reject_always", name="Always reject in this session", kind="reject_always"),
)

_TOOL_KINDS = {"read_file": "read", "write_file": "edit", "bash": "execute", "run_python": "execute",
               "web_fetch": "fetch", "mcp_filesystem": "read"}
_MAIN_ARGUMENT = ("command", "path", "url", "code", "query")
_TITLE_CHARS = 120


# --- frames ---------------------------------------------------------------------------------------

@dataclass
class Update:
    """One ``session/update`` notification's ``update`` (an ``acp.schema`` model)."""

    update: Any


@dataclass
class Notice:
    """A seed-002 notification (``session/progress``, ``session/output``) the client asked for."""

    method: str
    params: dict[str, Any]


@dataclass
class PermissionAsk:
    """Ask the client about a tool call waiting for a person (``confirmation_id``)."""

    confirmation_id: str
    tool_call: ToolCallUpdate


def stop_reason_for(ended: RunEnded | None, message_metadata: dict[str, Any] | None = None) -> str | None:
    """The ACP stop reason of a finished run, or None when it failed (answered with an error).

    An engine reports why its model stopped in the assistant message's ``stopReason``:
    ``max_tokens`` and ``refusal`` pass through, ``step_limit`` (the agent's ``max_steps``) is
    ``max_turn_requests``.
    """
    if ended is None:
        return None
    if ended.status == "cancelled":
        return "cancelled"
    reason = (message_metadata or {}).get("stopReason")
    if ended.status == "succeeded":
        if reason in ("max_tokens", "refusal"):
            return reason
        if reason in ("step_limit", "max_steps"):
            return "max_turn_requests"
        return "end_turn"
    if ended.error_code == "max_steps":
        return "max_turn_requests"
    return None


class AcpDialect(Dialect):
    """Run events → ACP frames for one prompt turn (or, with ``replay``, for ``session/load``)."""

    name = "acp"
    media_type = "application/x-ndjson"
    cancel_on_disconnect: ClassVar[bool] = True

    def __init__(self, *, run_id: str, conversation_id: str, session_id: str | None = None,
                 notifications: Iterable[str] = (), replay: bool = False, workspace: str | None = None,
                 max_steps: int = 10, **options: Any):
        super().__init__(run_id=run_id, conversation_id=conversation_id, **options)
        self.session_id = session_id or self.conversation_id
        self.notifications = frozenset(notifications)
        self.replay = replay
        self.workspace = workspace
        self.max_steps = max(1, int(max_steps or 10))
        self.plan: list[PlanEntry] = []
        self.ended: RunEnded | None = None
        self.error: RunError | None = None
        self._open_calls: dict[str, ToolCallState] = {}

    def ping(self) -> list[Any]:
        return []  # the stdio pipe needs no keep-alive

    def translate(self, event: RecordedEvent) -> list[Any]:
        if self.finished:
            return []
        data = event.data
        kind = type(data)
        if kind is TextDelta:
            return self._text(data.text, thought=False) if data.text else []
        if kind is Thought:
            return self._text(data.text, thought=True) if data.text else []
        if kind is ToolCallState:
            return self._tool(data)
        if kind is ContextPatch and data.kind == "step":
            return self._step(data.data)
        if kind is RunError:
            self.error = data
            return []
        if kind is RunEnded:
            return self._end(data)
        if kind is RunStarted and "session/progress" in self.notifications and not self.replay:
            return [self._progress(step=0, percent=0)]
        return []  # AssistantMessage, other patches: nothing new for the client

    # --- text -----------------------------------------------------------------------------------
    def _text(self, text: str, *, thought: bool) -> list[Any]:
        update = acp.update_agent_thought_text(text) if thought else acp.update_agent_message_text(text)
        frames: list[Any] = [Update(update)]
        if "session/output" in self.notifications and not self.replay:
            frames.append(Notice("session/output", {"sessionId": self.session_id, "runId": self.run_id,
                                                    "type": "thought" if thought else "text", "content": text}))
        return frames

    # --- tools ----------------------------------------------------------------------------------
    def _tool(self, call: ToolCallState) -> list[Any]:
        status = call.status
        if self.replay:
            if status in ToolStatus.TERMINAL:
                self._open_calls.pop(call.tool_call_id, None)
                return [Update(self._start(call, final=True))]
            self._open_calls[call.tool_call_id] = call
            return []
        if status == ToolStatus.PENDING:
            return [Update(self._start(call, final=False))]
        if status == ToolStatus.AWAITING_INPUT and call.confirmation_id:
            return [PermissionAsk(confirmation_id=call.confirmation_id, tool_call=ToolCallUpdate(
                tool_call_id=call.tool_call_id, title=self._title(call), kind=self._kind(call.name),
                status="pending", raw_input=call.input, locations=self._locations(call) or None))]
        if status == ToolStatus.RUNNING:
            return [Update(acp.update_tool_call(call.tool_call_id, status="in_progress"))]
        if status in ToolStatus.TERMINAL:
            succeeded = status == ToolStatus.SUCCEEDED
            text = (call.output if succeeded else call.error) or ""
            frames: list[Any] = [Update(acp.update_tool_call(
                call.tool_call_id, status="completed" if succeeded else "failed",
                content=[acp.tool_content(acp.text_block(text))] if text else None,
                raw_output={"status": status, ("output" if succeeded else "error"): text}))]
            if "session/output" in self.notifications:
                frames.append(Notice("session/output", {
                    "sessionId": self.session_id, "runId": self.run_id, "type": "tool_output",
                    "toolCallId": call.tool_call_id, "name": call.name, "status": status, "content": text}))
            return frames
        return []

    def _start(self, call: ToolCallState, *, final: bool) -> Any:
        content: list[Any] = []
        if call.name == "write_file" and isinstance(call.input.get("content"), str) and call.input.get("path"):
            content.append(FileEditToolCallContent(type="diff", path=self._abs(str(call.input["path"])),
                                                   new_text=call.input["content"]))
        status, raw_output = "pending", None
        if final:
            succeeded = call.status == ToolStatus.SUCCEEDED
            text = (call.output if succeeded else call.error) or ""
            status = "completed" if succeeded else "failed"
            raw_output = {"status": call.status, ("output" if succeeded else "error"): text}
            if text:
                content.append(acp.tool_content(acp.text_block(text)))
        return acp.start_tool_call(call.tool_call_id, self._title(call), kind=self._kind(call.name), status=status,
                                   content=content or None, locations=self._locations(call) or None,
                                   raw_input=call.input, raw_output=raw_output)

    @staticmethod
    def _kind(name: str) -> str:
        return _TOOL_KINDS.get(name, "other")

    @staticmethod
    def _title(call: ToolCallState) -> str:
        for key in _MAIN_ARGUMENT:
            value = call.input.get(key) if isinstance(call.input, dict) else None
            if isinstance(value, str) and value.strip():
                first = value.strip().splitlines()[0]
                return f"{call.name}: {first[:_TITLE_CHARS]}"
        return call.name

    def _abs(self, path: str) -> str:
        if os.path.isabs(path) or not self.workspace:
            return path
        return os.path.normpath(os.path.join(self.workspace, path))

    def _locations(self, call: ToolCallState) -> list[ToolCallLocation]:
        path = call.input.get("path") if isinstance(call.input, dict) else None
        return [ToolCallLocation(path=self._abs(path))] if isinstance(path, str) and path else []

    # --- steps (the Ollama orchestrator) -------------------------------------------------------
    def _step(self, step: dict[str, Any]) -> list[Any]:
        frames: list[Any] = []
        thought = step.get("thought")
        if isinstance(thought, str) and thought.strip():
            frames.extend(self._text(thought, thought=True))
        if self.replay:
            return frames
        for entry in self.plan:
            entry.status = "completed"
        self.plan.append(PlanEntry(content=_step_title(step), priority="medium", status="in_progress"))
        frames.append(Update(acp.update_plan([entry.model_copy() for entry in self.plan])))
        if "session/progress" in self.notifications:
            number = int(step.get("step") or len(self.plan))
            frames.append(self._progress(step=number, percent=min(99, round(100 * number / self.max_steps))))
        return frames

    def _progress(self, *, step: int, percent: int, **extra: Any) -> Notice:
        return Notice("session/progress", {"sessionId": self.session_id, "runId": self.run_id, "step": step,
                                           "maxSteps": self.max_steps, "percent": percent, **extra})

    # --- the end --------------------------------------------------------------------------------
    def _end(self, ended: RunEnded) -> list[Any]:
        self.ended = ended
        self.finished = True
        frames: list[Any] = []
        if self.replay:
            # A call the run never finished (cancelled while it waited): show it as failed.
            for call in self._open_calls.values():
                frames.append(Update(self._start(ToolCallState(
                    tool_call_id=call.tool_call_id, name=call.name, status=ToolStatus.FAILED, input=call.input,
                    error=f"the run ended ({ended.status}) before the tool finished"), final=True)))
            self._open_calls.clear()
            return frames
        if ended.status == "succeeded" and self.plan:
            for entry in self.plan:
                entry.status = "completed"
            frames.append(Update(acp.update_plan([entry.model_copy() for entry in self.plan])))
        if "session/progress" in self.notifications:
            frames.append(self._progress(step=len(self.plan), percent=100, status=ended.status))
        return frames


def _step_title(step: dict[str, Any]) -> str:
    number, agent, action = step.get("step"), step.get("agent") or "agent", step.get("action") or ""
    if action == "use_tool":
        what = f"use {step.get('tool') or 'a tool'}"
    elif action == "delegate":
        what = f"delegate to {step.get('target_agent') or 'another agent'}"
    elif action == "final":
        what = "answer"
    else:
        what = action or "think"
    return f"Step {number}: {agent} — {what}"


# --- prompt content and MCP servers ---------------------------------------------------------------

def prompt_to_input(blocks: list[Any]) -> str:
    """The run input for a prompt: text as is, resource links named, embedded text resources inlined.

    Raises:
        RequestError: (-32602) a block this agent does not accept (image, audio, binary resources).
    """
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            label = block.title or block.name or block.uri
            parts.append(f"[Resource: {label}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(block.resource, TextResourceContents):
            resource = block.resource
            parts.append(f'<resource uri="{resource.uri}">\n{resource.text}\n</resource>')
        else:
            kind = getattr(block, "type", type(block).__name__)
            raise RequestError.invalid_params({"details": f"prompt content of type {kind!r} is not supported "
                                                          "(text, resource_link and embedded text resources are)"})
    text = "\n\n".join(part for part in parts if part)
    if not text.strip():
        raise RequestError.invalid_params({"details": "the prompt has no text"})
    return text


def mcp_specs_from_acp(servers: list[Any] | None) -> list[dict[str, Any]]:
    """ACP ``mcpServers`` entries → the server dicts ``tools_app.mcp_client`` takes (validated).

    stdio ``{name, command, args, env: [{name, value}]}`` → ``{name, command, args, env: {…}}``;
    HTTP ``{type: "http", name, url, headers: [{name, value}]}`` → ``{name, url, headers: {…}}``.
    SSE and ACP-transport servers are refused (-32602): the MCP client speaks stdio and streamable HTTP.
    """
    from tools_app.mcp_client import McpConfigError, validate_mcp_servers

    specs: list[dict[str, Any]] = []
    for server in servers or []:
        if isinstance(server, McpServerStdio):
            spec: dict[str, Any] = {"name": server.name, "command": server.command, "args": list(server.args)}
            if server.env:
                spec["env"] = {item.name: item.value for item in server.env}
        elif isinstance(server, HttpMcpServer):
            spec = {"name": server.name, "url": server.url}
            if server.headers:
                spec["headers"] = {item.name: item.value for item in server.headers}
        elif isinstance(server, SseMcpServer):
            raise RequestError.invalid_params({"details": f"MCP server {server.name!r}: SSE servers are not "
                                                          "supported (use stdio or streamable HTTP)"})
        else:
            name = getattr(server, "name", "?")
            raise RequestError.invalid_params({"details": f"MCP server {name!r}: this transport is not supported"})
        specs.append(spec)
    try:
        validate_mcp_servers(specs)
    except McpConfigError as exc:
        raise RequestError.invalid_params({"details": str(exc)}) from exc
    return specs


# --- the agent ------------------------------------------------------------------------------------

@dataclass
class AcpSession:
    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None
    cancel_requested: bool = False
    busy: bool = False
    asks: set[asyncio.Task] = field(default_factory=set)
    seed_asks: dict[str, asyncio.Future] = field(default_factory=dict)


def _version() -> str:
    try:
        return metadata.version("agent-orchestrator")
    except metadata.PackageNotFoundError:
        return "2.0.0"


class OrchestratorAcpAgent(acp.Agent):
    """The ACP agent: sessions are the ``user``'s conversations; prompts are runs."""

    def __init__(self, *, user: Any, notify: Any = None, agent_role: str | None = None, model: str | None = None,
                 provider: str | None = None, allowed_tools: list[str] | None = None):
        self.user = user
        self.agent_role = agent_role
        self.model = model
        self.provider = provider
        self.allowed_tools = allowed_tools
        self._notify = notify  # raw notifications (seed-002 names), in order with the package's
        self._conn: Any = None
        self.sessions: dict[str, AcpSession] = {}
        self.notifications: frozenset[str] = frozenset()

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    # --- initialize -----------------------------------------------------------------------------
    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> InitializeResponse:
        alias = kwargs.get(ALIAS_META_KEY)
        if protocol_version not in SUPPORTED_VERSIONS and alias == "acp/initialize":
            # The seed's handshake: an unsupported version is an error naming the supported ones.
            raise RequestError(-32602, "Unsupported protocol version",
                               {"requested": protocol_version, "supportedVersions": list(SUPPORTED_VERSIONS)})
        asked = kwargs.get("notifications")
        self.notifications = frozenset(n for n in asked if n in SEED_NOTIFICATIONS) if isinstance(asked, list) else frozenset()
        logger.info("acp: initialize from %s (protocol %s)", getattr(client_info, "name", "a client"), protocol_version)
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True, sse=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            agent_info=Implementation(name="agent-orchestrator", title="Agent Orchestrator", version=_version()),
            auth_methods=[],
            field_meta={"supportedVersions": list(SUPPORTED_VERSIONS), "notifications": sorted(self.notifications),
                        "agentRole": self.agent_role or settings.DEFAULT_AGENT_ROLE},
        )

    # --- sessions -------------------------------------------------------------------------------
    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any) -> NewSessionResponse:
        specs = mcp_specs_from_acp(mcp_servers)
        conversation = await _in_thread(_conversation_new)(user=self.user, role=self.agent_role, cwd=cwd)
        session_id = str(conversation.id)
        self.sessions[session_id] = AcpSession(session_id=session_id, cwd=cwd, mcp_servers=specs)
        logger.info("acp: new session %s (cwd %s, %d MCP server(s))", session_id, cwd, len(specs))
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           **kwargs: Any) -> LoadSessionResponse:
        specs = mcp_specs_from_acp(mcp_servers)
        frames = await _in_thread(session_history)(user=self.user, session_id=session_id)
        if frames is None:
            raise RequestError(-32002, "Session not found", {"sessionId": session_id})
        for frame in frames:
            await self._conn.session_update(session_id=session_id, update=frame.update)
        session = self.sessions.get(session_id)
        if session is None or not session.busy:
            self.sessions[session_id] = AcpSession(session_id=session_id, cwd=cwd, mcp_servers=specs)
        logger.info("acp: loaded session %s (%d updates replayed)", session_id, len(frames))
        return LoadSessionResponse()

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any) -> ListSessionsResponse:
        try:
            offset = max(0, int(cursor or 0))
        except ValueError:
            raise RequestError.invalid_params({"details": "cursor is not one this agent gave"}) from None
        rows, more = await _in_thread(_conversation_page)(user=self.user, offset=offset, limit=50)
        shown_cwd = cwd or os.getcwd()
        return ListSessionsResponse(
            sessions=[SessionInfo(session_id=str(c.id), cwd=shown_cwd, title=c.title or None,
                                  updated_at=c.updated_at.isoformat()) for c in rows],
            next_cursor=str(offset + len(rows)) if more else None,
        )

    # --- prompt ---------------------------------------------------------------------------------
    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        from chat_app import services
        from chat_app.executor import get_executor
        from core.errors import ApplicationError

        from .base import stream_run

        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params({"sessionId": session_id,
                                               "details": "unknown session: call session/new or session/load first"})
        if session.busy:
            raise RequestError.invalid_request({"sessionId": session_id, "details": "a prompt is already running"})
        text = prompt_to_input(prompt)
        session.busy, session.cancel_requested, session.run_id = True, False, None
        try:
            options: dict[str, Any] = {}
            if session.mcp_servers:
                options["mcp_servers"] = session.mcp_servers
            if self.allowed_tools is not None:
                options["tool_allowlist"] = list(self.allowed_tools)
            if self.provider:
                options["provider"] = self.provider
            try:
                created = await asyncio.shield(services.run_start(
                    user=self.user, input=text, conversation_id=session_id, agent_role=self.agent_role,
                    model=self.model, options=options, allow_inline_mcp=True))
            except ApplicationError as exc:
                raise _request_error(exc) from exc
            run_id = str(created.run.id)
            session.run_id = run_id
            if session.cancel_requested:  # cancelled while the run was being recorded
                await self._cancel_run(session)
            agent = created.run.agent
            dialect = AcpDialect(run_id=run_id, conversation_id=session_id, session_id=session_id,
                                 notifications=self.notifications,
                                 workspace=str(agent.workspace_path) if agent is not None else None,
                                 max_steps=agent.max_steps if agent is not None else 10)
            frames = stream_run(dialect, get_executor().subscribe(run_id),
                                ping_interval=float(settings.SSE_PING_INTERVAL))
            async for batch in frames:
                for frame in batch:
                    await self._deliver(session, frame)
            return await self._answer(dialect)
        except asyncio.CancelledError:
            # The connection is closing (the client went away): the run must not go on unattended.
            if session.run_id:
                await asyncio.shield(self._cancel_run(session))
            raise
        finally:
            for task in list(session.asks):
                task.cancel()
            session.busy, session.run_id = False, None

    async def _answer(self, dialect: AcpDialect) -> PromptResponse:
        ended = dialect.ended
        meta: dict[str, Any] = {}
        if ended is not None and ended.status == "succeeded" and ended.message_id:
            meta = await _in_thread(_message_metadata)(message_id=ended.message_id)
        reason = stop_reason_for(ended, meta)
        if reason is None:
            error = dialect.error
            message = (ended.error if ended else None) or (error.message if error else "The run ended without an answer.")
            code = (ended.error_code if ended else None) or (error.code if error else "run_failed")
            raise RequestError(-32603, message, {"errorCode": code, "runId": dialect.run_id})
        usage = (ended.usage or {}) if ended else {}
        return PromptResponse(stop_reason=reason, field_meta={"runId": dialect.run_id, "usage": usage})

    async def _deliver(self, session: AcpSession, frame: Any) -> None:
        if isinstance(frame, Update):
            await self._conn.session_update(session_id=session.session_id, update=frame.update)
        elif isinstance(frame, Notice):
            if self._notify is not None:
                await self._notify(frame.method, frame.params)
        elif isinstance(frame, PermissionAsk):
            # Its own task: the stream goes on (and a cancel can arrive) while the client decides.
            task = asyncio.create_task(self._ask(session, frame), name=f"acp-permission-{frame.confirmation_id}")
            session.asks.add(task)
            task.add_done_callback(session.asks.discard)

    # --- permissions ----------------------------------------------------------------------------
    async def _ask(self, session: AcpSession, ask: PermissionAsk) -> None:
        from core.errors import ApplicationError
        from tools_app.services import tool_confirmation_decide

        try:
            if "permission/request" in self.notifications and self._notify is not None:
                outcome = await self._ask_seed(session, ask)
            else:
                response = await self._conn.request_permission(session_id=session.session_id,
                                                               tool_call=ask.tool_call, options=list(PERMISSION_OPTIONS))
                outcome = response.outcome
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a client that cannot ask: refuse the call, go on
            logger.warning("acp: permission request for %s failed (%s); refusing the call", ask.tool_call.tool_call_id, exc)
            outcome = AllowedOutcome(outcome="selected", option_id="reject_once")
        if isinstance(outcome, DeniedOutcome) or getattr(outcome, "outcome", None) == "cancelled":
            logger.info("acp: permission for %s cancelled: cancelling the turn", ask.tool_call.tool_call_id)
            session.cancel_requested = True
            await self._cancel_run(session)
            return
        option = getattr(outcome, "option_id", "")
        if option not in {o.option_id for o in PERMISSION_OPTIONS}:
            logger.warning("acp: unknown permission option %r: treated as reject_once", option)
            option = "reject_once"
        try:
            await _in_thread(tool_confirmation_decide)(
                user=self.user, confirmation_id=ask.confirmation_id, approved=option.startswith("allow"),
                reason=f"ACP client: {option}", remember="conversation" if option.endswith("always") else None)
        except ApplicationError as exc:  # decided meanwhile (a remembered rule, REST) or expired
            logger.info("acp: confirmation %s not decided here: %s", ask.confirmation_id, exc.message)

    async def _ask_seed(self, session: AcpSession, ask: PermissionAsk) -> Any:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        session.seed_asks[ask.confirmation_id] = future
        try:
            await self._notify("permission/request", {
                "sessionId": session.session_id, "requestId": ask.confirmation_id,
                "toolCall": ask.tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
                "options": [o.model_dump(mode="json", by_alias=True, exclude_none=True) for o in PERMISSION_OPTIONS]})
            return await future
        finally:
            session.seed_asks.pop(ask.confirmation_id, None)

    def _seed_answer(self, params: dict[str, Any]) -> bool:
        request_id = params.get("requestId")
        for session in self.sessions.values():
            future = session.seed_asks.get(request_id) if isinstance(request_id, str) else None
            if future is None or future.done():
                continue
            outcome = params.get("outcome")
            if isinstance(outcome, dict) and outcome.get("outcome") == "cancelled":
                future.set_result(DeniedOutcome(outcome="cancelled"))
            else:
                option = (outcome.get("optionId") if isinstance(outcome, dict) else None) or params.get("optionId")
                if option is None and isinstance(params.get("approved"), bool):
                    option = "allow_once" if params["approved"] else "reject_once"
                future.set_result(AllowedOutcome(outcome="selected", option_id=str(option or "reject_once")))
            return True
        return False

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "orchestrator/permission_response":
            if not self._seed_answer(params):
                raise RequestError.invalid_params({"details": "no permission request is waiting with this requestId"})
            return {}
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "orchestrator/permission_response" and not self._seed_answer(params):
            logger.info("acp: permission/response for no waiting request: %s", params.get("requestId"))

    # --- cancel ---------------------------------------------------------------------------------
    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self.sessions.get(session_id)
        if session is None or not session.busy:
            logger.info("acp: session/cancel for %s, which runs nothing", session_id)
            return
        session.cancel_requested = True
        for future in session.seed_asks.values():
            if not future.done():
                future.set_result(DeniedOutcome(outcome="cancelled"))
        await self._cancel_run(session)

    async def _cancel_run(self, session: AcpSession) -> None:
        from chat_app import services
        from core.errors import ApplicationError

        if not session.run_id:
            return  # the prompt cancels it as soon as it is recorded
        try:
            await services.run_cancel(user=self.user, run_id=session.run_id)
        except ApplicationError as exc:  # already ended
            logger.info("acp: run %s not cancelled: %s", session.run_id, exc.message)

    async def shutdown(self) -> None:
        """End the runs still streaming (the client went away) so none is left running unread."""
        for session in list(self.sessions.values()):
            if session.busy and session.run_id:
                await self._cancel_run(session)


def _request_error(exc: Any) -> RequestError:
    status = getattr(exc, "status", 500)
    data = {"code": exc.code, **(exc.extra or {})}
    if status == 404:
        return RequestError(-32002, exc.message, data)
    if 400 <= status < 500:
        return RequestError(-32602, exc.message, data)
    return RequestError(-32603, exc.message, data)


# --- blocking database work (run on the database pool) --------------------------------------------

def _in_thread(func: Any) -> Any:
    from chat_app.eventlog import in_thread

    return in_thread(func)


def _conversation_new(*, user: Any, role: str | None, cwd: str) -> Any:
    from agents_app.selectors import agent_get_for_run
    from chat_app.services import conversation_create

    agent = agent_get_for_run(role=role or settings.DEFAULT_AGENT_ROLE)
    name = os.path.basename(os.path.normpath(cwd)) if cwd else ""
    return conversation_create(user=user, title=f"ACP session{f' in {name}' if name else ''}", agent=agent)


def _conversation_page(*, user: Any, offset: int, limit: int) -> tuple[list[Any], bool]:
    from chat_app.models import Conversation

    rows = list(Conversation.objects.filter(owner=user).order_by("-updated_at", "id")[offset:offset + limit + 1])
    return rows[:limit], len(rows) > limit


def _message_metadata(*, message_id: str) -> dict[str, Any]:
    from chat_app.models import Message

    return Message.objects.filter(id=message_id).values_list("metadata", flat=True).first() or {}


def session_history(*, user: Any, session_id: str) -> list[Update] | None:
    """The ``session/update`` frames that replay a conversation, or None when it is not the user's.

    Each run in order: its user message (``user_message_chunk``), then its recorded events through
    :class:`AcpDialect` in replay mode (text, thoughts, each tool call once with its final state).
    """
    from chat_app.models import Message, Run, RunEvent
    from chat_app.selectors import conversation_get
    from core.errors import NotFound

    try:
        conversation = conversation_get(user=user, conversation_id=session_id)
    except NotFound:
        return None
    frames: list[Update] = []
    prompts: dict[str, list[str]] = {}
    for run_id, content in (Message.objects.filter(conversation=conversation, role=Message.Role.USER)
                            .order_by("created_at", "id").values_list("run_id", "content")):
        prompts.setdefault(str(run_id), []).append(content)
    runs = list(Run.objects.filter(conversation=conversation).select_related("agent").order_by("started_at", "id"))
    events: dict[str, list[RecordedEvent]] = {}
    for run_id, seq, name, payload in (RunEvent.objects.filter(run__conversation=conversation)
                                       .order_by("run_id", "seq").values_list("run_id", "seq", "event", "payload")):
        events.setdefault(str(run_id), []).append(RecordedEvent.from_payload(str(run_id), seq, name, payload))
    for run in runs:
        run_id = str(run.id)
        for content in prompts.get(run_id, []):
            frames.append(Update(acp.update_user_message_text(content)))
        dialect = AcpDialect(run_id=run_id, conversation_id=session_id, replay=True,
                             workspace=str(run.agent.workspace_path) if run.agent is not None else None)
        for event in coalesce(events.get(run_id, [])):
            frames.extend(f for f in dialect.translate(event) if isinstance(f, Update))
    return frames


# --- serving ---------------------------------------------------------------------------------------

async def serve(*, user: Any, protocol_fd: int, agent_role: str | None = None, model: str | None = None,
                provider: str | None = None, allowed_tools: list[str] | None = None) -> None:
    """Serve ACP on stdin / ``protocol_fd`` until the client closes stdin."""
    from .acp_stdio import LineTransport, stdio_pair

    reader, writer = await stdio_pair(protocol_fd)
    transport = LineTransport(reader, writer)
    agent = OrchestratorAcpAgent(user=user, notify=transport.notify, agent_role=agent_role, model=model,
                                 provider=provider, allowed_tools=allowed_tools)
    try:
        # The package's runner, over our line filter (a message transport).
        await acp.run_agent(agent, transport)
    finally:
        await agent.shutdown()

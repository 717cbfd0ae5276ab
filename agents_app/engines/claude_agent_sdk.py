"""The optional ``claude_agent_sdk`` engine: Claude Code as the agent, through ``claude-agent-sdk``.

Install with the extra: ``pip install '.[agent-sdk]'`` (package ``claude-agent-sdk``). This module
imports the package at the top, so the engine is registered only when it is importable; without
it ``engines/__init__.py`` leaves it out and agents cannot select it.

What it needs at run time:

- the Claude Code CLI. Recent ``claude-agent-sdk`` wheels bundle a native ``claude`` binary
  (``claude_agent_sdk/_bundled/claude``); older ones, or platforms without a bundled binary,
  need ``claude`` on ``PATH`` (``npm install -g @anthropic-ai/claude-code``, which needs Node.js
  18+). Without either, :meth:`unavailable_reason` says so and runs fall back to ``mock``;
- ``ANTHROPIC_API_KEY`` (or ``ANTHROPIC_AUTH_TOKEN``, sent as a bearer token), and optionally
  ``ANTHROPIC_BASE_URL``: passed to the CLI's environment;
- a writable home directory: the CLI keeps each session's transcript under
  ``~/.claude/projects/<workspace>/``. That store is what ``resume`` reads, so a conversation
  resumes only on a machine (and home directory) that ran its earlier turns.

How it maps the run:

- ``query(prompt=..., options=ClaudeAgentOptions(...))`` with the agent's system prompt, model,
  workspace as ``cwd``, ``max_turns = agent.max_steps`` and ``include_partial_messages`` (so text
  streams as it is generated);
- sessions: the conversation's stored session id is passed as ``resume`` when it is a Claude Code
  session id (a UUID). Any other id (the conversation started on another engine) cannot be
  resumed by the CLI, so the earlier turns are put in front of the prompt instead. The session id
  the CLI reports (``init`` system message, then the result) is returned and stored;
- MCP: the run's ``ctx.options["mcp_servers"]`` (the list ``tools_app/mcp_policy.py`` allowed
  when the run was created: the agent's registered servers and those the request named) are
  converted to the SDK's ``mcp_servers`` option (``{"type": "stdio", "command", "args", "env"}``
  or ``{"type": "http", "url", "headers"}``); the CLI connects them itself and names their tools
  ``mcp__<server>__<tool>``, as this project does;
- tools and approval: the agent's tools map to Claude Code's built-ins (``bash`` → Bash,
  ``read_file`` → Read/Glob/Grep, ``write_file`` → Write/Edit, ``web_fetch`` → WebFetch). The CLI
  runs tools itself and cannot pause for this service's confirmation flow, so a tool that needs
  approval or is denied (tool default, server config, or an approval rule) is *not allowed*
  in this engine: it is listed in ``disallowed_tools`` and the CLI refuses the call. Tool calls
  the CLI makes are reported as ``tool.state`` events (``running`` → ``succeeded``/``failed``).
- errors: a missing CLI, a crashed CLI process and error results become ``EngineError`` with a
  code (``authentication_failed`` for a rejected key, ``agent_sdk_error`` otherwise).
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from contextlib import aclosing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import claude_agent_sdk as sdk
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    query,
)
from django.conf import settings

from core.events import RunEventBase, TextDelta, ToolCallState, ToolStatus

from .base import Engine, EngineContext, EngineError, EngineResult, ErrorCode

logger = logging.getLogger("orchestrator.engines.agent_sdk")

# This project's tool names → the Claude Code built-ins that do the same job.
BUILTIN_TOOL_MAP: dict[str, list[str]] = {
    "bash": ["Bash"],
    "read_file": ["Read", "Glob", "Grep"],
    "write_file": ["Write", "Edit"],
    "web_fetch": ["WebFetch"],
}

_ERROR_CODES = {401: ErrorCode.AUTHENTICATION_FAILED, 403: ErrorCode.PERMISSION_DENIED, 429: ErrorCode.RATE_LIMITED,
                529: ErrorCode.PROVIDER_OVERLOADED}


def _cli_path() -> str | None:
    bundled = Path(sdk.__file__).parent / "_bundled" / "claude"
    if bundled.is_file():
        return str(bundled)
    return shutil.which("claude")


class ClaudeAgentSdkEngine(Engine):
    name = "claude_agent_sdk"
    provider = "anthropic"
    description = "Claude Code as the agent, through the claude-agent-sdk package (optional extra)."
    fallback = "mock"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not settings.ANTHROPIC_API_KEY:
            return "no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN configured"
        if _cli_path() is None:
            return "the Claude Code CLI is not installed (no bundled binary and no `claude` on PATH)"
        return None

    @classmethod
    def default_model(cls) -> str:
        return settings.ANTHROPIC_MODEL

    async def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        resume = ctx.session_id if _is_uuid(ctx.session_id) else None
        options = ClaudeAgentOptions(**build_options(ctx, resume=resume))
        prompt = ctx.user_input if resume or not ctx.history else _with_history(ctx.history, ctx.user_input)
        session_id = resume or ""
        streamed_text = False
        turn_text: list[str] = []
        failure_code: str | None = None
        tools: dict[str, dict[str, Any]] = {}
        result: ResultMessage | None = None
        try:
            # The SDK's messages are read to the end, or closed at once when the run stops early.
            async with aclosing(_messages(prompt, options)) as messages:
                async for message in messages:
                    if isinstance(message, SystemMessage) and message.subtype == "init":
                        session_id = str(message.data.get("session_id") or session_id)
                    elif isinstance(message, StreamEvent):
                        if message.parent_tool_use_id:
                            continue  # a subagent's own text; its result arrives as a tool result
                        event = message.event or {}
                        if event.get("type") == "message_start":
                            turn_text = []
                        delta = event.get("delta") or {}
                        if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                            streamed_text = True
                            yield TextDelta(text=delta.get("text", ""))
                    elif isinstance(message, AssistantMessage):
                        if message.parent_tool_use_id:
                            continue
                        failure_code = _ERROR_NAMES.get(message.error or "", failure_code)
                        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
                        turn_text.extend(texts)
                        if texts and not streamed_text:
                            yield TextDelta(text="".join(texts))
                        for block in message.content:
                            if isinstance(block, ToolUseBlock):
                                tools[block.id] = {"tool_call_id": block.id, "name": block.name,
                                                   "input": block.input if isinstance(block.input, dict) else {}}
                                yield ToolCallState(status=ToolStatus.RUNNING, **tools[block.id])
                    elif isinstance(message, UserMessage) and isinstance(message.content, list):
                        for block in message.content:
                            if isinstance(block, ToolResultBlock) and block.tool_use_id in tools:
                                output = _block_text(block.content)
                                state = tools.pop(block.tool_use_id)
                                if block.is_error:
                                    yield ToolCallState(status=ToolStatus.FAILED, error=output, **state)
                                else:
                                    yield ToolCallState(status=ToolStatus.SUCCEEDED, output=output, **state)
                    elif isinstance(message, ResultMessage):
                        result = message
                        session_id = message.session_id or session_id
        except sdk.CLINotFoundError as exc:
            raise EngineError(f"Claude Code CLI not found: {exc}", code="engine_unavailable") from exc
        except sdk.ProcessError as exc:
            # The CLI exits non-zero after an error result; that result says more than the exit code.
            if result is None or not result.is_error:
                stderr = (getattr(exc, "stderr", "") or "").strip()[-500:]
                raise EngineError(f"Claude Code CLI failed (exit {getattr(exc, 'exit_code', '?')}): {stderr or exc}",
                                  code=failure_code or "agent_sdk_error") from exc
        except sdk.ClaudeSDKError as exc:
            raise EngineError(f"Claude Agent SDK error: {exc}", code=failure_code or "agent_sdk_error") from exc

        if result is None:
            raise EngineError("Claude Code ended without a result.", code="no_answer")
        if result.is_error:
            code = _ERROR_CODES.get(result.api_error_status or 0) or failure_code or (
                "max_steps" if result.subtype == "error_max_turns" else "agent_sdk_error")
            detail = "; ".join(result.errors or []) or result.result or result.subtype
            logger.warning("claude_agent_sdk run %s failed (%s): %s", ctx.run_id, code, detail)
            lead = _ERROR_LEADS.get(code, f"Claude Code reported an error ({result.subtype})")
            raise EngineError(f"{lead}: {detail}", code=code)
        text = result.result if result.result is not None else "".join(turn_text)
        usage = {k: v for k, v in (result.usage or {}).items() if isinstance(v, (int, float))}
        metadata = {"numTurns": result.num_turns,
                    **({"costUsd": result.total_cost_usd} if result.total_cost_usd is not None else {})}
        yield EngineResult(text=text, usage=usage, session_id=session_id or f"agent-sdk-{uuid.uuid4().hex}",
                           metadata=metadata)


async def _messages(prompt: str, options: ClaudeAgentOptions) -> AsyncIterator[Any]:
    """``query()``'s messages, read by a helper task that can be stopped the way the SDK expects.

    Cancelling the run's task directly would deliver a raw asyncio cancellation inside the SDK,
    which skips its terminate/kill escalation and can leave the CLI process running. Instead the
    helper runs ``query()`` in an anyio cancel scope; when the run ends early that scope is
    cancelled, so the SDK's shielded cleanup stops the CLI, and the run waits (bounded) for it.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    scope = anyio.CancelScope()

    async def pump() -> None:
        try:
            with scope:
                async with aclosing(query(prompt=prompt, options=options)) as stream:
                    async for message in stream:
                        queue.put_nowait(message)
        except Exception as exc:  # noqa: BLE001 - handed to the run, which classifies it
            queue.put_nowait(_Failure(exc))
        finally:
            queue.put_nowait(_END)

    task = asyncio.create_task(pump(), name="claude-agent-sdk-query")
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        if not task.done():
            scope.cancel()
            with suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT)


_END = object()
_CLOSE_TIMEOUT = 30.0  # the SDK bounds its own terminate → kill escalation at about 20 s


@dataclass
class _Failure:
    exc: Exception


_ERROR_LEADS = {
    "authentication_failed": "The model provider rejected the API key (check ANTHROPIC_AUTH_TOKEN / ANTHROPIC_API_KEY)",
    "rate_limited": "The model provider is rate-limiting requests; try again shortly",
    "max_steps": "Claude Code stopped at the agent's step limit (max_steps)",
}
_ERROR_NAMES = {"authentication_failed": "authentication_failed", "billing_error": "billing_error",
                "rate_limit": "rate_limited", "invalid_request": "invalid_request", "server_error": "provider_error"}


def build_options(ctx: EngineContext, *, resume: str | None) -> dict[str, Any]:
    """The ``ClaudeAgentOptions`` keyword arguments for a run (plain data, easy to inspect)."""
    from tools_app.mcp_client import McpConfigError, validate_mcp_servers
    from tools_app.workspace import ensure_workspace

    try:
        # The run's servers as tools_app.mcp_policy decided them when the run was created.
        servers = validate_mcp_servers(list(ctx.options.get("mcp_servers") or []))
    except McpConfigError as exc:
        raise EngineError(f"Invalid MCP server configuration: {exc}", code="invalid_mcp_config") from exc
    offered = list(ctx.agent.allowed_tools or [])
    allowed: list[str] = []
    disallowed: list[str] = []
    base_tools: list[str] = []
    for name in offered:
        mapped = BUILTIN_TOOL_MAP.get(name, [])
        base_tools.extend(mapped)
        (disallowed if ctx.tools.requires_approval(name) else allowed).extend(mapped)
    for name in ctx.tools.names():  # MCP tools the run service connected: same names as the CLI's
        if name.startswith("mcp__"):
            (disallowed if ctx.tools.requires_approval(name) else allowed).append(name)
    env = {"ANTHROPIC_AUTH_TOKEN" if settings.ANTHROPIC_AUTH_IS_BEARER else "ANTHROPIC_API_KEY": settings.ANTHROPIC_API_KEY}
    if settings.ANTHROPIC_BASE_URL:
        env["ANTHROPIC_BASE_URL"] = settings.ANTHROPIC_BASE_URL
    # The CLI retries failed requests (even a 401) up to 10 times with backoff; use our budget.
    env["CLAUDE_CODE_MAX_RETRIES"] = str(int(getattr(settings, "ANTHROPIC_MAX_RETRIES", 2)))
    options: dict[str, Any] = {
        "system_prompt": ctx.system_prompt or None,
        "model": ctx.model or None,
        "cwd": str(ensure_workspace(ctx.workspace)),
        "resume": resume,
        "max_turns": ctx.agent.max_steps,
        "include_partial_messages": True,
        "tools": sorted(set(base_tools)),
        "allowed_tools": sorted(set(allowed)),
        "disallowed_tools": sorted(set(disallowed)),
        "mcp_servers": {s["name"]: _sdk_server(s) for s in servers},
        "env": env,
    }
    cli = _cli_path()
    if cli:
        options["cli_path"] = cli
    return options


def _sdk_server(server: dict[str, Any]) -> dict[str, Any]:
    if "url" in server:
        return {"type": "http", "url": server["url"], **({"headers": server["headers"]} if server["headers"] else {})}
    argv = server["command"]
    return {"type": "stdio", "command": argv[0], "args": argv[1:], **({"env": server["env"]} if server["env"] else {})}


def _with_history(history: list[dict[str, str]], user_input: str) -> str:
    turns = "\n\n".join(f"{m['role']}: {m['content']}" for m in history)
    return f"Earlier in this conversation:\n\n{turns}\n\nThe user now says:\n\n{user_input}"


def _block_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return bool(value)

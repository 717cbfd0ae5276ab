"""The ``ollama`` engine: seed 004's JSON-action loop (``run_agent`` + ``orchestrate``) on Ollama.

Each step, the current agent (the run's agent first, normally ``orchestrator``) gets
``[system: its prompt, system: "Context from previous steps:\\n…" (when there is context),
user: the current query]`` and answers one JSON action
``{thought, action: use_tool|delegate|final, tool, target_agent, args, answer}``:

- ``use_tool`` runs the tool through the run's :class:`ToolRunner` (same registry, workspace
  confinement and approval rules as every engine; ``tool.state`` events come from the runner)
  and feeds its output back to the same agent. Only the tools that agent is allowed count as
  known; any other name gets the seed's "Unknown tool" query, back to the run's agent.
- ``delegate`` switches to ``target_agent`` (an enabled ``Agent`` row, with its own prompt,
  tools, approval rules and workspace) with ``args.task``; an unknown agent gets the seed's
  message, back to the run's agent.
- ``final`` ends the run with ``answer`` (or ``[NO ANSWER]``); anything else gets the seed's
  "Invalid action" message. After ``max_steps`` (the run's agent's) the answer is the seed's
  ``[MAX STEPS REACHED - No final answer provided]``.

Where the seed hard-codes "back to orchestrator", this goes back to the run's own agent, which is
``orchestrator`` for seed-004 runs. Conversation history (earlier turns) is kept simple: it is
prepended to the first user query as plain "role: text" context lines.

Events: each step is a ``ContextPatch(kind="step", data={step, agent, action, tool,
target_agent, thought})`` — the seed's event — and a delegation also a ``ContextPatch(kind=
"delegation")``. The raw JSON the model streams is not user text, so the only ``TextDelta``s are
the final answer: the ``answer`` string of a step whose top-level ``action`` is already known to
be ``final`` is decoded and streamed live as it arrives (a small incremental JSON scanner), and
whatever was not streamed that way (answer key before action, prose-wrapped JSON, the parser's
raw-text fallback, ``[NO ANSWER]``, the max-steps answer) is sent once the step is parsed. The
run's final text (``agent.message``/``agent.end``) is authoritative. ``EngineResult.metadata``
holds ``{"events": [the seed's event dicts]}`` for ``/chat``.

Options: ``ctx.options["stream"] = False`` uses Ollama's non-streamed answer instead (one request
per step either way).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

import requests
from django.conf import settings

from agents_app.health import CachedProbe
from core.events import ContextPatch, RunEventBase, TextDelta

from .base import Engine, EngineContext, EngineResult

if TYPE_CHECKING:
    from agents_app.specs import AgentSpec

    from .base import ToolPort

def _probe_tags(base_url: str) -> str | None:
    try:
        response = requests.get(base_url.rstrip("/") + "/api/tags", timeout=float(settings.OLLAMA_PROBE_TIMEOUT))
    except requests.RequestException as exc:
        return type(exc).__name__
    return None if response.status_code < 400 else f"GET /api/tags answered HTTP {response.status_code}"


# Shared by the router and /health: at most one probe per OLLAMA_HEALTH_TTL seconds.
OLLAMA_PROBE = CachedProbe(_probe_tags, ttl=lambda: float(settings.OLLAMA_HEALTH_TTL))

MAX_STEPS_ANSWER = "[MAX STEPS REACHED - No final answer provided]"
NO_ANSWER = "[NO ANSWER]"


def parse_action(raw: str) -> dict[str, Any]:
    """The seed's parser: direct JSON, else first ``{`` to last ``}``, else the text as a final answer."""
    data: Any = None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        pass
    if not isinstance(data, dict):
        data = None
        start, end = raw.find("{"), raw.rfind("}") + 1
        if start != -1 and end > start:
            try:
                candidate = json.loads(raw[start:end])
            except json.JSONDecodeError:
                candidate = None
            if isinstance(candidate, dict):
                data = candidate
    if data is None:
        data = {"thought": "JSON parsing failed", "action": "final", "tool": None, "target_agent": None,
                "args": {}, "answer": raw}
    data.setdefault("thought", "")
    data.setdefault("action", "final")
    data.setdefault("tool", None)
    data.setdefault("target_agent", None)
    data.setdefault("args", {})
    data.setdefault("answer", "")
    return data


def with_history(query: str, history: list[dict[str, str]]) -> str:
    """The first user query with earlier turns prepended as plain context lines."""
    turns = [f"{t.get('role', 'user')}: {t.get('content', '')}" for t in history if t.get("content")]
    if not turns:
        return query
    return "Conversation so far:\n" + "\n".join(turns) + "\n\nCurrent request:\n" + query


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _name(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class AnswerStreamer:
    """Incrementally scans a streamed JSON object and releases its top-level ``answer`` string
    once its top-level ``action`` is known to be ``final``.

    Gives up (streams nothing) when the text does not start with ``{``, so prose-wrapped JSON and
    non-JSON replies are only answered after parsing.
    """

    def __init__(self) -> None:
        self.enabled = True
        self.action: str | None = None
        self.released = ""
        self._started = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect_key = False
        self._key: str | None = None
        self._string: list[str] = []
        self._string_role: str | None = None  # "key" or "value" at depth 1, else None
        self._answer_raw: list[str] | None = None
        self._answer_done = False

    def feed(self, chunk: str) -> str:
        """Consume a piece of the reply; return newly releasable answer text."""
        if not self.enabled:
            return ""
        for ch in chunk:
            if not self._step(ch):
                self.enabled = False
                return ""
        return self._release()

    def _step(self, ch: str) -> bool:
        if not self._started:
            if ch.isspace():
                return True
            if ch != "{":
                return False
            self._started, self._depth, self._expect_key = True, 1, True
            return True
        if self._in_string:
            if self._escape:
                self._escape = False
                self._string.append(ch)
            elif ch == "\\":
                self._escape = True
                self._string.append(ch)
            elif ch == '"':
                self._in_string = False
                self._end_string()
            else:
                self._string.append(ch)
            return True
        if ch == '"':
            self._in_string = True
            self._string = []
            if self._depth == 1:
                self._string_role = "key" if self._expect_key else "value"
                if self._string_role == "value" and self._key == "answer":
                    self._answer_raw = self._string
            else:
                self._string_role = None
            return True
        if ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
        elif self._depth == 1 and ch == ":":
            self._expect_key = False
        elif self._depth == 1 and ch == ",":
            self._expect_key, self._key = True, None
        return True

    def _end_string(self) -> None:
        if self._string_role == "key":
            self._key = _decode("".join(self._string))
        elif self._string_role == "value":
            if self._key == "action":
                self.action = _decode("".join(self._string))
            elif self._key == "answer":
                self._answer_done = True
        self._string_role = None

    def _release(self) -> str:
        if self.action != "final" or self._answer_raw is None:
            return ""
        raw = "".join(self._answer_raw)
        if not self._answer_done:
            raw = _complete_escapes(raw)
        decoded = _decode(raw)
        if not self._answer_done and decoded and "\ud800" <= decoded[-1] <= "\udbff":
            decoded = decoded[:-1]  # half a surrogate pair: wait for the other half
        if not decoded.startswith(self.released):
            return ""
        new, self.released = decoded[len(self.released):], decoded
        return new


def _complete_escapes(raw: str) -> str:
    """Cut an unfinished escape sequence (``\\`` or ``\\u12``) off the end of a partial string body."""
    last = raw.rfind("\\")
    if last == -1:
        return raw
    first = last
    while first > 0 and raw[first - 1] == "\\":
        first -= 1
    if (last - first + 1) % 2 == 0:
        return raw  # the last backslash is itself escaped
    tail = raw[last + 1 :]
    if tail == "" or (tail[0] == "u" and len(tail) < 5):
        return raw[:last]
    return raw


_DECODER = json.JSONDecoder(strict=False)


def _decode(raw: str) -> str:
    try:
        value = _DECODER.decode(f'"{raw}"')
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, str) else raw


@dataclass
class _Actor:
    """The agent currently answering: its row, prompt, model and tool runner."""

    agent: "AgentSpec"
    prompt: str
    model: str
    tools: "ToolPort"

    @property
    def role(self) -> str:
        return self.agent.role


class OllamaEngine(Engine):
    name = "ollama"
    provider = "ollama"
    description = "Seed 004's JSON-action orchestrator loop (tools + delegation) on a local Ollama server."

    fallback = "mock"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why no Ollama answers at ``OLLAMA_URL`` (cached probe of ``GET /api/tags``), or None.

        Only a server that does not answer at all sends runs to the fallback; one that answers
        but fails a request (missing model, HTTP 500) fails the run readably instead.
        """
        result = OLLAMA_PROBE.result(settings.OLLAMA_URL)
        return None if result.ok else f"no Ollama answering at {settings.OLLAMA_URL}: {result.reason}"

    @classmethod
    def health_details(cls) -> dict[str, Any]:
        result = OLLAMA_PROBE.result(settings.OLLAMA_URL)
        return {"url": settings.OLLAMA_URL, "latency_ms": result.latency_ms,
                "checked_at": datetime.fromtimestamp(result.checked_at, tz=timezone.utc).isoformat()}

    @classmethod
    def default_model(cls) -> str:
        return settings.OLLAMA_MODEL

    async def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        from agents_app.ollama_client import OllamaClient

        client = OllamaClient(base_url=ctx.provider.base_url if ctx.provider is not None else None)
        stream = ctx.options.get("stream", True) is not False
        home = _Actor(agent=ctx.agent, prompt=ctx.system_prompt, model=ctx.model, tools=ctx.tools)
        actors: dict[str, _Actor] = {home.role: home}
        current = home
        current_query = with_history(ctx.user_input, ctx.history)
        context_log: list[str] = []
        events: list[dict[str, Any]] = []
        usage = {"input_tokens": 0, "output_tokens": 0}

        def result(answer: str, stop_reason: str | None = None) -> EngineResult:
            extra = {"stopReason": stop_reason} if stop_reason else {}
            return EngineResult(text=answer, usage=usage, metadata={"events": events, **extra})

        for step in range(max(1, int(ctx.agent.max_steps or 10))):
            messages = [{"role": "system", "content": current.prompt}]
            if context_log:
                messages.append({"role": "system", "content": "Context from previous steps:\n" + "\n".join(context_log)})
            messages.append({"role": "user", "content": current_query})

            streamer = AnswerStreamer()
            if stream:
                pieces: list[str] = []
                # aclosing: a run cancelled while a delta is being emitted still stops the stream now.
                async with aclosing(client.stream_chat(messages, model=current.model)) as chunks:
                    async for chunk in chunks:
                        if chunk.content:
                            pieces.append(chunk.content)
                            live = streamer.feed(chunk.content)
                            if live:
                                yield TextDelta(text=live, agent=current.role)
                        if chunk.done:
                            _add_usage(usage, chunk.usage)
                raw = "".join(pieces)
            else:
                whole = await asyncio.to_thread(client.chat, messages, model=current.model)
                _add_usage(usage, whole.usage)
                raw = whole.content

            parsed = parse_action(raw)
            thought = _text(parsed.get("thought"))
            action = parsed.get("action", "final")
            tool_name = _name(parsed.get("tool"))
            target = _name(parsed.get("target_agent"))
            args = parsed.get("args", {}) or {}
            answer = parsed.get("answer", "")

            event = {"step": step + 1, "agent": current.role, "action": _name(action), "tool": tool_name,
                     "target_agent": target, "thought": thought}
            events.append(event)
            yield ContextPatch(kind="step", data=dict(event))
            context_log.append(f"[{current.role} step {step + 1}] {json.dumps(parsed, ensure_ascii=False)}")

            if action == "final":
                final = _text(answer) or NO_ANSWER
                rest = final[len(streamer.released):] if final.startswith(streamer.released) else ""
                if rest:
                    yield TextDelta(text=rest, agent=current.role)
                yield result(final)
                return

            if action == "use_tool":
                if tool_name and tool_name in current.tools.names():
                    outcome = await current.tools.call(tool_call_id=f"ollama_{uuid.uuid4().hex[:16]}",
                                                       name=tool_name, input=args)
                    current_query = (f"Tool `{tool_name}` output:\n{outcome.output}\n\n"
                                     "Now continue your reasoning and decide next action.")
                else:
                    current = home
                    current_query = (f"Unknown tool '{tool_name}'. "
                                     "Please provide a final answer with available information.")
            elif action == "delegate":
                delegate = await self._actor(ctx, actors, target) if target else None
                if delegate is not None:
                    task = args.get("task") if isinstance(args, dict) else None
                    current_query = _text(task or answer) or f"User goal: {ctx.user_input}"
                    yield ContextPatch(kind="delegation", data={"step": step + 1, "from": current.role,
                                                                "to": delegate.role, "task": current_query})
                    current = delegate
                else:
                    current = home
                    current_query = (f"Unknown agent '{target}'. "
                                     "Please handle the task yourself or use available tools.")
            else:
                current = home
                current_query = (f"Invalid action '{action}'. "
                                 f"Previous JSON: {json.dumps(parsed)}\n"
                                 "Please provide a 'final' answer.")

        yield TextDelta(text=MAX_STEPS_ANSWER, agent=current.role)
        yield result(MAX_STEPS_ANSWER, stop_reason="step_limit")  # as the Claude engine reports it

    async def _actor(self, ctx: EngineContext, actors: dict[str, _Actor], role: str) -> _Actor | None:
        """The delegate for ``role``: an enabled agent with its own prompt, tools and approvals."""
        if role in actors:
            return actors[role]
        if ctx.load_agent is None:
            return None
        agent = await ctx.load_agent(role)
        if agent is None:
            return None
        tools = ctx.tools.for_agent(agent)
        prompt = agent.effective_system_prompt()
        # A delegate's own model only applies when it is an Ollama agent; otherwise keep the run's.
        model = agent.model if agent.engine == self.name and agent.model else ctx.model
        actors[role] = _Actor(agent=agent, prompt=prompt, model=model, tools=tools)
        return actors[role]


def _add_usage(total: dict[str, int], usage: dict[str, int]) -> None:
    for key, value in usage.items():
        total[key] = total.get(key, 0) + value

"""The Claude tool-use engine (official ``anthropic`` SDK, raw streaming events).

One run is a loop of Messages API requests: stream the answer (text deltas go out as they
arrive), collect the ``tool_use`` blocks (their ``input_json_delta`` fragments joined and parsed
once, at ``content_block_stop``), run the tools through the agent's :class:`ToolRunner` (which
emits the ``tool.state`` events and handles approvals), send the ``tool_result`` blocks back, and
go on until the model stops asking for tools or ``agent.max_steps`` requests were made.

Provider failures become :class:`EngineError` with a stable code (see :func:`classify_error`).
The SDK retries 408/409/429/5xx/529 ``ANTHROPIC_MAX_RETRIES`` times, unless the router has a
failover candidate (then ``ctx.provider.max_retries`` is 0: the router is the one retry loop).
The provider (base URL, key, auth) is ``ctx.provider``; None means the ``ANTHROPIC_*`` settings.
Each request has an overall deadline, ``ANTHROPIC_TIMEOUT`` seconds, covering the whole stream.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import anthropic
import httpx2
from django.conf import settings

from core.events import RunEventBase, TextDelta
from core.http_transport import KEEPALIVE_OPTIONS, OneWriteTransport

from .base import Engine, EngineContext, EngineError, EngineResult

logger = logging.getLogger("orchestrator.engines.claude")

# Between the text of two model requests (before and after tools), so the answer reads well.
_TURN_SEPARATOR = "\n\n"


class ClaudeEngine(Engine):
    name = "claude"
    provider = "anthropic"
    description = "Claude tool-use loop through the official anthropic SDK."
    fallback = "mock"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not settings.ANTHROPIC_API_KEY:
            return "no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN configured"
        return None

    @classmethod
    def default_model(cls) -> str:
        return settings.ANTHROPIC_MODEL

    async def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        model = ctx.model or settings.ANTHROPIC_MODEL
        client, release = lease_client(ctx.provider)
        try:
            base_url = str(client.base_url)
            messages: list[dict[str, Any]] = [
                {"role": item["role"], "content": item["content"]} for item in ctx.history if item.get("content")
            ]
            messages.append({"role": "user", "content": ctx.user_input})
            params: dict[str, Any] = {"model": model, "max_tokens": int(settings.ANTHROPIC_MAX_TOKENS)}
            if ctx.system_prompt:
                params["system"] = ctx.system_prompt
            tool_specs = ctx.tools.specs()
            if tool_specs:
                params["tools"] = tool_specs
            usage: dict[str, int] = {}
            said: list[str] = []
            stop_reason: str | None = None
            max_steps = max(1, int(getattr(ctx.agent, "max_steps", 10) or 10))
            steps = 0
            loop_time = asyncio.get_running_loop().time
            while True:
                steps += 1
                turn = _Turn(ctx.spent)
                try:
                    # The request's events are read here, not through a helper generator: a text
                    # delta (thousands a second) costs one hop to the run, and no more.
                    stream, deadline = await _open_stream(client, {**params, "messages": messages})
                    async with stream:
                        async for event in stream:
                            text = turn.feed(event)
                            if text:
                                if not turn.spoke and said:
                                    said.append(_TURN_SEPARATOR)
                                    yield TextDelta(text=_TURN_SEPARATOR)
                                turn.spoke = True
                                said.append(text)
                                yield TextDelta(text=text)
                            if loop_time() > deadline.at:
                                raise _RequestDeadline(deadline.seconds)
                except Exception as exc:  # noqa: BLE001 - every provider failure becomes an EngineError
                    raise classify_error(exc, model=model, base_url=base_url, run_id=ctx.run_id) from exc
                _add_usage(usage, turn.usage)
                stop_reason = turn.stop_reason
                tool_uses = [b for b in turn.blocks if b.type == "tool_use"]
                if stop_reason != "tool_use" or not tool_uses:
                    break
                if steps >= max_steps:
                    note = f"[Stopped: the step limit of {max_steps} model requests was reached.]"
                    if said:
                        said.append(_TURN_SEPARATOR)
                        yield TextDelta(text=_TURN_SEPARATOR)
                    said.append(note)
                    yield TextDelta(text=note)
                    stop_reason = "step_limit"
                    break
                messages.append({"role": "assistant", "content": [b.to_param() for b in turn.blocks if b.to_param()]})
                results = []
                for block in tool_uses:
                    # A bad JSON document is passed on as a string: the runner refuses it readably.
                    tool_input: Any = block.input if block.input_error is None else block.raw_json
                    result = await ctx.tools.call(tool_call_id=block.id, name=block.name, input=tool_input)
                    results.append({
                        "type": "tool_result",
                        "tool_use_id": block.id,
                        "content": result.output or "(no output)",
                        "is_error": bool(result.is_error),
                    })
                messages.append({"role": "user", "content": results})
            yield EngineResult(
                text="".join(said),
                usage=usage,
                session_id=ctx.session_id or f"claude-{uuid.uuid4().hex}",
                metadata={"stopReason": stop_reason, "steps": steps},
            )
        finally:
            release()


# Clients per configuration and event loop: building one costs milliseconds (a TLS context,
# certificates) that would come before every first token, and a pool per run would hold its
# connections for nothing. Each configuration gets ANTHROPIC_POOL_SHARDS clients (one TLS
# context between them): the connection pool scans all of its connections on every request and
# every response close, so under fifty concurrent streams one pool of fifty-plus connections
# cost ~12% of the server's CPU (py-spy); smaller pools make each scan shorter. A run takes the
# shard with the fewest runs streaming through it, the first on a tie: under load the runs spread
# evenly, and one stream at a time always finds the connection the last one left open (shards
# taken in turn left each idle for longer than its keep-alive, so every request at low
# concurrency paid a new TCP connection: ~1 ms before the first token, traced).
_CLIENTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _Shards]]" = weakref.WeakKeyDictionary()


class _Shards:
    def __init__(self, shards: int):
        self.clients: list[anthropic.AsyncAnthropic | None] = [None] * shards
        self.busy = [0] * shards
        self.tls = httpx2.create_ssl_context()


def lease_client(target: Any = None) -> tuple[anthropic.AsyncAnthropic, Any]:
    """A client for a provider target (None: the ``ANTHROPIC_*`` settings) and the function that
    gives it back: the least busy shard (see above)."""
    if target is not None:
        key, bearer, base_url = target.api_key, target.bearer, target.base_url
    else:
        key = settings.ANTHROPIC_API_KEY
        bearer = bool(getattr(settings, "ANTHROPIC_AUTH_IS_BEARER", False))
        base_url = settings.ANTHROPIC_BASE_URL or None
    timeout = float(getattr(settings, "ANTHROPIC_TIMEOUT", 120.0))
    retries = int(getattr(settings, "ANTHROPIC_MAX_RETRIES", 2))
    if target is not None and target.max_retries is not None:
        retries = target.max_retries
    pool = int(getattr(settings, "ANTHROPIC_MAX_CONNECTIONS", 2000))
    shards = max(1, int(getattr(settings, "ANTHROPIC_POOL_SHARDS", 8)))
    config = (key, bearer, base_url, timeout, retries, pool, shards)
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    entry = clients.get(config)
    if entry is None:
        entry = clients[config] = _Shards(shards)
    busy = entry.busy
    index = busy.index(min(busy))
    client = entry.clients[index]
    if client is None:
        auth = {"auth_token": key} if bearer else {"api_key": key}
        per_shard = -(-pool // shards)
        client = entry.clients[index] = anthropic.AsyncAnthropic(
            **auth,
            base_url=base_url,
            max_retries=retries,
            # The SDK's per-read timeout; the overall deadline is enforced in _open_stream.
            timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
            # Sized for many concurrent streams (ANTHROPIC_MAX_CONNECTIONS in all): one per open stream.
            # A request's head and body leave in one write (core/http_transport.py).
            http_client=anthropic.DefaultAsyncHttpxClient(transport=OneWriteTransport(
                verify=entry.tls, socket_options=KEEPALIVE_OPTIONS,
                limits=httpx2.Limits(max_connections=per_shard, max_keepalive_connections=min(per_shard, 200)))),
        )
    busy[index] += 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            busy[index] -= 1

    return client, release


class _RequestDeadline(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"no complete answer within {seconds:g} s")
        self.seconds = seconds


@dataclass(frozen=True)
class _Deadline:
    at: float  # the event loop's clock
    seconds: float


async def _open_stream(client: anthropic.AsyncAnthropic, params: dict[str, Any]) -> tuple[Any, _Deadline]:
    """Start one streamed request under an overall ``ANTHROPIC_TIMEOUT`` deadline.

    Waiting for the response is bounded by the deadline; a stream that goes silent is ended by
    the SDK's read timeout (the same number of seconds); one that keeps trickling past the
    deadline is ended by the reader at its next event (see :meth:`ClaudeEngine.run`). No timeout
    scope wraps the reading (it would wrap the engine's ``yield``, and cancel whatever the caller
    does meanwhile), and none is set per event (thousands a second).
    """
    seconds = float(getattr(settings, "ANTHROPIC_TIMEOUT", 120.0))
    deadline = _Deadline(asyncio.get_running_loop().time() + seconds, seconds)
    try:
        async with asyncio.timeout_at(deadline.at):
            stream = await client.messages.create(**params, stream=True)
    except TimeoutError as exc:
        raise _RequestDeadline(seconds) from exc
    return stream, deadline


# --- one model response, accumulated from raw events -------------------------------------------

@dataclass
class _Block:
    type: str
    # Streamed text is collected in parts and joined once (``text += delta`` on an attribute
    # copies the whole text per delta: quadratic in the answer's length).
    text_parts: list[str] = field(default_factory=list)
    id: str = ""
    name: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    json_parts: list[str] = field(default_factory=list)
    raw_json: str = ""
    input_error: str | None = None
    thinking_parts: list[str] = field(default_factory=list)
    signature: str = ""
    data: str = ""

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def thinking(self) -> str:
        return "".join(self.thinking_parts)

    def finish(self) -> None:
        if self.type != "tool_use":
            return
        self.raw_json = "".join(self.json_parts)
        self.json_parts = []
        if not self.raw_json.strip():
            return  # no arguments: keep the (empty) input from content_block_start
        try:
            parsed = json.loads(self.raw_json)
        except ValueError as exc:
            self.input_error = str(exc)
            return
        if isinstance(parsed, dict):
            self.input = parsed
        else:
            self.input_error = "tool input is not a JSON object"

    def to_param(self) -> dict[str, Any] | None:
        """The block as sent back to the API in the assistant turn (None: leave it out)."""
        if self.type == "text":
            text = self.text
            return {"type": "text", "text": text} if text else None
        if self.type == "tool_use":
            return {"type": "tool_use", "id": self.id, "name": self.name,
                    "input": self.input if self.input_error is None else {}}
        if self.type == "thinking":
            return {"type": "thinking", "thinking": self.thinking, "signature": self.signature}
        if self.type == "redacted_thinking":
            return {"type": "redacted_thinking", "data": self.data}
        return None


class _Turn:
    """Accumulates one streamed response: content blocks, stop reason, usage."""

    def __init__(self, spent: dict[str, int] | None = None) -> None:
        # The run's running token count (EngineContext.spent), kept current as usage is reported,
        # so a run that fails or is cancelled mid-stream still records what was billed.
        self.spent = spent
        self.blocks: list[_Block] = []
        self._by_index: dict[int, _Block] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.spoke = False

    def feed(self, event: Any) -> str:
        """Take one raw event; returns the text it adds to the answer (often empty)."""
        kind = getattr(event, "type", "")
        if kind == "content_block_delta":  # nearly every event: first
            block = self._by_index.get(event.index)
            delta = event.delta
            if block is None:
                return ""
            if delta.type == "text_delta":
                block.text_parts.append(delta.text)
                return delta.text
            if delta.type == "input_json_delta":
                block.json_parts.append(delta.partial_json)
            elif delta.type == "thinking_delta":
                block.thinking_parts.append(delta.thinking)
            elif delta.type == "signature_delta":
                block.signature += delta.signature
        elif kind == "message_start":
            self._report(_usage_dict(event.message.usage))
        elif kind == "content_block_start":
            cb = event.content_block
            block = _Block(type=cb.type)
            text = ""
            if cb.type == "tool_use":
                block.id, block.name = cb.id, cb.name
                block.input = dict(cb.input) if isinstance(cb.input, dict) else {}
            elif cb.type == "text":
                text = cb.text or ""
                block.text_parts.append(text)
            elif cb.type == "redacted_thinking":
                block.data = getattr(cb, "data", "")
            self._by_index[event.index] = block
            self.blocks.append(block)
            return text
        elif kind == "content_block_stop":
            block = self._by_index.get(event.index)
            if block is not None:
                block.finish()
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason
            self._report(_usage_dict(event.usage))
        return ""

    def _report(self, usage: dict[str, int]) -> None:
        """Usage as the provider reports it (cumulative per request): the turn's, and the run's."""
        if self.spent is not None:
            for key, value in usage.items():
                self.spent[key] = self.spent.get(key, 0) + value - self.usage.get(key, 0)
        self.usage.update(usage)


def _usage_dict(usage: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out


def _add_usage(total: dict[str, int], turn: dict[str, int]) -> None:
    total.setdefault("input_tokens", 0)
    total.setdefault("output_tokens", 0)
    for key, value in turn.items():
        total[key] = total.get(key, 0) + value


# --- provider errors -----------------------------------------------------------------------------

# (code, retryable) by HTTP status, and by the error body's ``type`` (a 200 stream's error event).
_BY_STATUS = {
    400: "invalid_request", 401: "authentication_failed", 402: "billing_error", 403: "permission_denied",
    404: "model_not_found", 408: "provider_timeout", 413: "request_too_large", 429: "rate_limited",
    504: "provider_timeout", 529: "provider_overloaded",
}
_BY_TYPE = {
    "invalid_request_error": "invalid_request", "authentication_error": "authentication_failed",
    "billing_error": "billing_error", "permission_error": "permission_denied", "not_found_error": "model_not_found",
    "request_too_large": "request_too_large", "rate_limit_error": "rate_limited", "api_error": "provider_error",
    "timeout_error": "provider_timeout", "overloaded_error": "provider_overloaded",
}
_RETRYABLE = {"rate_limited", "provider_error", "provider_overloaded", "provider_timeout", "provider_unreachable",
              "provider_disconnected"}


def classify_error(exc: BaseException, *, model: str, base_url: str, run_id: str = "") -> EngineError:
    """Turn an SDK or transport failure into a readable :class:`EngineError` and log it."""
    status: int | None = None
    error_type: str | None = None
    request_id: str | None = None
    retry_after: float | None = None
    if isinstance(exc, EngineError):
        return exc
    if isinstance(exc, _RequestDeadline):
        code = "provider_timeout"
        message = (f"The model provider at {base_url} did not finish answering within {exc.seconds:g} s "
                   f"(ANTHROPIC_TIMEOUT).")
    elif isinstance(exc, (anthropic.APITimeoutError, httpx2.TimeoutException)):
        code = "provider_timeout"
        seconds = float(getattr(settings, "ANTHROPIC_TIMEOUT", 120.0))
        message = (f"The model provider at {base_url} stopped responding: nothing for {seconds:g} s "
                   f"(ANTHROPIC_TIMEOUT).")
    elif isinstance(exc, anthropic.APIConnectionError):
        code = "provider_unreachable"
        message = (f"Could not connect to the model provider at {base_url} ({_root_cause(exc)}). "
                   f"Check ANTHROPIC_BASE_URL and that the service is up.")
    elif isinstance(exc, httpx2.TransportError):
        code = "provider_disconnected"
        message = f"The connection to the model provider at {base_url} broke mid-answer ({type(exc).__name__}: {exc})."
    elif isinstance(exc, anthropic.APIStatusError):
        status, error_type, request_id = exc.status_code, exc.type, exc.request_id
        detail = exc.api_message or _short(exc.body) or str(exc)
        if status in _BY_STATUS:
            code = _BY_STATUS[status]
        elif status >= 500:
            code = "provider_error"
        else:
            code = _BY_TYPE.get(error_type or "", "provider_error")
        if code == "rate_limited":
            retry_after = _retry_after(exc)
            if _QUOTA_WORDS.search(detail or ""):
                code = "quota_exhausted"
        headline, hint = (part.format(model=model, base_url=base_url)
                          for part in _STATUS_MESSAGES.get(code, ("The model provider returned an error", "")))
        if status == 200:  # an ``error`` event after the stream had started
            headline = f"The model provider sent an error in the middle of its answer ({headline[0].lower()}{headline[1:]})"
            where = error_type or "error"
        else:
            where = f"HTTP {status}{f' {error_type}' if error_type else ''}"
        if request_id:
            where += f", request id {request_id}"
        message = f"{headline}: {detail} ({where})." + (f" {hint}" if hint else "")
    elif isinstance(exc, anthropic.APIError):
        code = "provider_error"
        message = f"The model provider at {base_url} failed: {exc}"
    else:
        code = "provider_error"
        message = f"Calling the model provider at {base_url} failed: {type(exc).__name__}: {exc}"
    logger.warning(
        "claude request failed (run %s, model %s, base_url %s, status %s, type %s, request_id %s): %s: %s",
        run_id or "-", model, base_url, status, error_type, request_id, code, message,
    )
    return EngineError(message, code=code, retryable=code in _RETRYABLE, retry_after=retry_after)


# A 429 whose message says the account is out of quota/credit (Z.AI, Moonshot, DeepSeek word it
# so): no retry, no cooldown-and-retry; the run fails with quota_exhausted.
_QUOTA_WORDS = re.compile(r"quota|insufficient|balance|credit|billing|exceeded your current|suspended", re.I)


def _retry_after(exc: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if sent."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value:
            try:
                return max(0.0, float(value))
            except ValueError:
                from email.utils import parsedate_to_datetime
                import time

                return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
    return None


# code -> (headline, hint); the hint may name {model} and {base_url}.
_STATUS_MESSAGES = {
    "authentication_failed": ("The model provider rejected the API key",
                              "Check ANTHROPIC_AUTH_TOKEN / ANTHROPIC_API_KEY."),
    "permission_denied": ("The API key is not allowed to do this", "Check the key's access to model {model!r}."),
    "model_not_found": ("Model {model!r} was not found",
                        "Check the agent's model or ANTHROPIC_MODEL, and ANTHROPIC_BASE_URL ({base_url})."),
    "rate_limited": ("The model provider is rate-limiting requests", "Try again shortly."),
    "quota_exhausted": ("The model provider's quota or balance is exhausted", "Check the account's plan and balance."),
    "provider_overloaded": ("The model provider is overloaded", "Try again shortly."),
    "provider_error": ("The model provider had an internal error", "Try again shortly."),
    "provider_timeout": ("The model provider timed out", ""),
    "invalid_request": ("The model provider rejected the request as invalid", ""),
    "billing_error": ("The model provider refused the request for a billing reason", ""),
    "request_too_large": ("The request was too large for the model provider", ""),
}


def _root_cause(exc: BaseException) -> str:
    """The innermost cause, e.g. ``connection refused`` rather than the SDK's ``Connection error.``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    last = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        last = current
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        current = current.__cause__ or current.__context__
    return f"{type(last).__name__}: {last}"


def _short(body: Any) -> str:
    if body is None:
        return ""
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return text[:300]

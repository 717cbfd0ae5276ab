"""A scripted fake of the Anthropic Messages API (``POST /v1/messages``).

Point the real SDK at it::

    with FakeAnthropicServer() as server:
        server.script(text_reply(["Hel", "lo"]), tool_use_reply("search", {"q": "x"}))
        client = anthropic.AsyncAnthropic(api_key="test", base_url=server.url, max_retries=0)
        async with client.messages.stream(model="claude-x", max_tokens=100, messages=[...]) as s:
            msg = await s.get_final_message()

Wire format (what anthropic 2.12.0's SSE decoder and MessageStream accumulate):
``stream: true`` gets ``200 text/event-stream`` with chunked transfer encoding and
``event: <type>\\ndata: <json>\\n\\n`` frames in the exact API order::

    message_start        {"type","message":{id,type:"message",role:"assistant",model,content:[],
                          stop_reason:null,stop_sequence:null,usage:{input_tokens,output_tokens}}}
    content_block_start  {"type","index","content_block":{"type":"text","text":""}
                                                        | {"type":"tool_use","id","name","input":{}}}
    ping                 {"type":"ping"}            (once, after the first content_block_start)
    content_block_delta  {"type","index","delta":{"type":"text_delta","text"}
                                                | {"type":"input_json_delta","partial_json"}}
    content_block_stop   {"type","index"}
    ...                  (next blocks)
    message_delta        {"type","delta":{"stop_reason","stop_sequence"},"usage":{"output_tokens"}}
    message_stop         {"type":"message_stop"}

Without ``stream`` the same reply is returned as one Message JSON object.  Every
response carries a ``request-id`` header.  HTTP errors use the real error body
``{"type":"error","error":{"type":...,"message":...},"request_id":...}``.

Unscripted requests: when the queue is empty the server answers with
``default`` -- by default ``text_reply("OK")`` -- and records the request in
``server.unscripted_requests``.  Pass ``default=None`` to get a 500 ``api_error``
(sent with ``x-should-retry: false`` so the SDK fails at once instead of retrying).

Retries: the SDK retries 408/409/429/5xx/529 (``max_retries`` defaults to 2, so
up to 3 attempts) with 0.5s..8s backoff, honouring ``retry-after-ms`` then
``retry-after``.  Either build the client with ``max_retries=0`` or script the
error with ``times=max_retries + 1`` (and ``retry_after_ms=`` to keep it fast).

``GET /v1/models`` answers the model list ``server.models`` (status ``server.models_status``,
default 200): what a provider health check asks; it never consumes the script.

Validation (``validate=True``, the default) mirrors the API: missing auth
(``x-api-key`` or ``Authorization``) -> 401, missing ``anthropic-version`` or a
body without ``model``/``max_tokens``/``messages`` -> 400, unknown path -> 404.
Rejected requests are recorded but do not consume the script.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

from ._http import (
    _DEFAULT,
    FAULT_DISCONNECT,
    FAULT_ERROR,
    FAULT_STALL,
    Exchange,
    Fault,
    RecordedRequest,
    ScriptedHTTPServer,
    as_chunks,
    split_text,
)

__all__ = [
    "FakeAnthropicServer",
    "MessageReply",
    "TextBlock",
    "ToolUseBlock",
    "HttpError",
    "RawStream",
    "RecordedRequest",
    "text_block",
    "tool_use_block",
    "text_reply",
    "tool_use_reply",
    "message_reply",
    "max_tokens_reply",
    "http_error",
    "mid_stream_error",
    "stall",
    "disconnect",
    "raw_stream",
    "ERROR_TYPES",
    "sse",
]

#: Default error ``type`` for each HTTP status (as the real API uses them).
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_DEFAULT_MESSAGES: dict[str, str] = {
    "invalid_request_error": "Invalid request",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "Not found",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit",
    "api_error": "Internal server error",
    "timeout_error": "Request timed out",
    "overloaded_error": "Overloaded",
}

_STATUS_FOR_TYPE = {v: k for k, v in ERROR_TYPES.items()}


def sse(event: str, data: Any) -> bytes:
    """Encode one Server-Sent Event frame exactly as the API does."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode("utf-8")


def _error_body(error_type: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body


# ---------------------------------------------------------------------------
# Content blocks
# ---------------------------------------------------------------------------


@dataclass
class TextBlock:
    """A text block streamed as one ``text_delta`` per chunk."""

    chunks: list[str]

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def start_block(self, tool_id: str | None) -> dict[str, Any]:
        return {"type": "text", "text": ""}

    def deltas(self) -> list[dict[str, Any]]:
        return [{"type": "text_delta", "text": c} for c in self.chunks]

    def final_block(self, tool_id: str | None) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass
class ToolUseBlock:
    """A tool_use block; ``input`` is streamed as ``json_chunks`` partial_json
    fragments (preceded by the empty fragment the API sends first) that only
    concatenated form the JSON document."""

    name: str
    input: dict[str, Any]
    id: str | None = None
    json_chunks: int = 3

    def input_json(self) -> str:
        return json.dumps(self.input, ensure_ascii=False)

    def fragments(self) -> list[str]:
        return [""] + split_text(self.input_json(), self.json_chunks)

    def start_block(self, tool_id: str | None) -> dict[str, Any]:
        return {"type": "tool_use", "id": tool_id, "name": self.name, "input": {}}

    def deltas(self) -> list[dict[str, Any]]:
        return [{"type": "input_json_delta", "partial_json": f} for f in self.fragments()]

    def final_block(self, tool_id: str | None) -> dict[str, Any]:
        return {"type": "tool_use", "id": tool_id, "name": self.name, "input": self.input}


Block = Union[TextBlock, ToolUseBlock]


def text_block(chunks: str | Iterable[str]) -> TextBlock:
    """A text block; ``chunks`` is one string or the list of streamed deltas."""
    return TextBlock(as_chunks(chunks))


def tool_use_block(name: str, input: Mapping[str, Any], id: str | None = None, json_chunks: int = 3) -> ToolUseBlock:  # noqa: A002
    return ToolUseBlock(name=name, input=dict(input), id=id, json_chunks=json_chunks)


# ---------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------


@dataclass
class MessageReply:
    """A successful (HTTP 200) message, streamed or not.

    ``usage``: dict merged over the defaults ``input_tokens=10`` and
    ``output_tokens=<number of streamed deltas>``; ``message_start`` carries
    ``input_tokens`` (+ any extra keys) with ``output_tokens: 1`` as the API does,
    ``message_delta`` carries the final ``output_tokens``.
    ``model=None`` echoes the requested model; ``id=None`` generates ``msg_fake_...``.
    ``delay``: seconds to wait between SSE events.
    ``fault``: see :meth:`with_error`, :meth:`with_stall`, :meth:`with_disconnect`.
    """

    blocks: list[Block]
    stop_reason: str | None = "end_turn"
    stop_sequence: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    ping: bool = True
    delay: float = 0.0
    fault: Fault | None = None

    # -- fault injection (return modified copies) ------------------------------
    def with_error(
        self,
        after: int | None = None,
        error_type: str = "overloaded_error",
        message: str | None = None,
    ) -> "MessageReply":
        """Send ``event: error`` after ``after`` events (default: after the first
        content delta) and end the stream.  Non-streaming requests instead get the
        HTTP status matching ``error_type`` (overloaded_error -> 529, ...)."""
        msg = message if message is not None else _DEFAULT_MESSAGES.get(error_type, error_type)
        return dataclasses.replace(self, fault=Fault(FAULT_ERROR, after, error_type, msg))

    def with_stall(self, after: int | None = None, release: Any = None) -> "MessageReply":
        """Stop sending after ``after`` events and hang until ``release`` (a
        ``threading.Event``, created if omitted, see :attr:`release`) is set --
        then finish the stream normally -- or until the server closes (then the
        connection is dropped).  Non-streaming: hang before answering."""
        f = Fault(FAULT_STALL, after)
        if release is not None:
            f.release = release
        return dataclasses.replace(self, fault=f)

    def with_disconnect(self, after: int | None = None) -> "MessageReply":
        """Abruptly close the connection after ``after`` events (no terminating
        chunk).  Non-streaming: close without any response."""
        return dataclasses.replace(self, fault=Fault(FAULT_DISCONNECT, after))

    @property
    def release(self):
        """The ``threading.Event`` releasing a stalled stream (None if no stall)."""
        return self.fault.release if self.fault and self.fault.kind == FAULT_STALL else None

    # -- rendering --------------------------------------------------------------
    def resolved_usage(self) -> dict[str, Any]:
        out = sum(len(b.deltas()) for b in self.blocks)
        usage: dict[str, Any] = {"input_tokens": 10, "output_tokens": max(1, out)}
        usage.update(self.usage or {})
        return usage

    def render(self, model: str, server: "FakeAnthropicServer") -> "_Rendered":
        msg_id = self.id or f"msg_fake_{server.next_id():06d}"
        tool_ids = [
            (b.id or f"toolu_fake_{server.next_id():06d}") if isinstance(b, ToolUseBlock) else None
            for b in self.blocks
        ]
        usage = self.resolved_usage()
        start_usage = dict(usage)
        start_usage["output_tokens"] = min(1, usage["output_tokens"])
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": msg_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start_usage,
                    },
                },
            )
        ]
        if self.ping and not self.blocks:
            events.append(("ping", {"type": "ping"}))
        for i, (block, tid) in enumerate(zip(self.blocks, tool_ids)):
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": i, "content_block": block.start_block(tid)})
            )
            if self.ping and i == 0:
                events.append(("ping", {"type": "ping"}))
            for d in block.deltas():
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        message = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [b.final_block(t) for b, t in zip(self.blocks, tool_ids)],
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": usage,
        }
        return _Rendered(events, message)

    def default_fault_point(self, events: Sequence[tuple[str, dict[str, Any]]]) -> int:
        for i, (name, _) in enumerate(events):
            if name == "content_block_delta":
                return i + 1
        return 1


@dataclass
class _Rendered:
    events: list[tuple[str, dict[str, Any]]]
    message: dict[str, Any]


@dataclass
class HttpError:
    """An HTTP error with the API's JSON error body (same for stream / non-stream)."""

    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    body: Any = None  # overrides the generated body (dict -> JSON, str/bytes -> raw)


@dataclass
class RawStream:
    """Escape hatch: send exactly these SSE events (name, data) with ``status``."""

    events: list[tuple[str, Any]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    end: bool = True  # False: drop the connection instead of terminating the stream


def text_reply(
    chunks: str | Iterable[str] = "OK",
    *,
    stop_reason: str | None = "end_turn",
    usage: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> MessageReply:
    """A text message streamed as one ``text_delta`` per chunk.

    ``kwargs``: any :class:`MessageReply` field (stop_sequence, model, id,
    headers, times, ping, delay)."""
    return MessageReply([text_block(chunks)], stop_reason=stop_reason, usage=dict(usage) if usage else None, **kwargs)


def max_tokens_reply(chunks: str | Iterable[str] = "Truncated", **kwargs: Any) -> MessageReply:
    """A text message cut off by ``max_tokens`` (``stop_reason: "max_tokens"``)."""
    return text_reply(chunks, stop_reason="max_tokens", **kwargs)


def tool_use_reply(
    name: str,
    input: Mapping[str, Any],  # noqa: A002
    id: str | None = None,  # noqa: A002
    text_before: str | Iterable[str] | None = None,
    json_chunks: int = 3,
    *,
    stop_reason: str | None = "tool_use",
    usage: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> MessageReply:
    """Optional text block, then one tool_use block; ``stop_reason: "tool_use"``."""
    blocks: list[Block] = []
    if text_before is not None:
        blocks.append(text_block(text_before))
    blocks.append(tool_use_block(name, input, id=id, json_chunks=json_chunks))
    return MessageReply(blocks, stop_reason=stop_reason, usage=dict(usage) if usage else None, **kwargs)


def message_reply(
    *blocks: Block | str,
    stop_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> MessageReply:
    """Several content blocks in one message (plain strings become text blocks).

    ``stop_reason`` defaults to ``"tool_use"`` if any block is a tool_use, else
    ``"end_turn"``."""
    bl: list[Block] = [text_block(b) if isinstance(b, str) else b for b in blocks]
    if stop_reason is None:
        stop_reason = "tool_use" if any(isinstance(b, ToolUseBlock) for b in bl) else "end_turn"
    return MessageReply(bl, stop_reason=stop_reason, usage=dict(usage) if usage else None, **kwargs)


def http_error(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    times: int = 1,
    retry_after: float | str | None = None,
    retry_after_ms: float | None = None,
    should_retry: bool | None = None,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
) -> HttpError:
    """An HTTP error response.  ``error_type`` defaults from the status
    (401 authentication_error, 403 permission_error, 404 not_found_error,
    429 rate_limit_error, 500 api_error, 529 overloaded_error, ...).
    429 gets ``retry-after: 1`` unless ``retry_after`` is given.
    ``retry_after_ms`` adds ``retry-after-ms`` (the SDK prefers it; use a
    small value to make SDK retries fast).  ``should_retry`` sets
    ``x-should-retry``.  ``times``: answer this many consecutive requests."""
    etype = error_type or ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    h: dict[str, str] = {}
    if status == 429 and retry_after is None:
        retry_after = 1
    if retry_after is not None:
        h["retry-after"] = str(retry_after)
    if retry_after_ms is not None:
        h["retry-after-ms"] = str(retry_after_ms)
    if should_retry is not None:
        h["x-should-retry"] = "true" if should_retry else "false"
    h.update(headers or {})
    return HttpError(
        status=status,
        error_type=etype,
        message=message if message is not None else _DEFAULT_MESSAGES.get(etype, etype),
        headers=h,
        times=times,
        body=body,
    )


def mid_stream_error(
    reply: MessageReply | None = None,
    *,
    after: int | None = None,
    error_type: str = "overloaded_error",
    message: str = "Overloaded",
) -> MessageReply:
    """A 200 stream that emits ``event: error`` part-way (default reply:
    ``text_reply(["Hel", "lo"])``, error right after the first text delta)."""
    return (reply or text_reply(["Hel", "lo"])).with_error(after, error_type, message)


def stall(reply: MessageReply | None = None, *, after: int | None = None, release: Any = None) -> MessageReply:
    """A stream that hangs after ``after`` events (default: after the first
    delta) until ``.release`` is set or the server closes."""
    return (reply or text_reply(["Hel", "lo"])).with_stall(after, release)


def disconnect(reply: MessageReply | None = None, *, after: int | None = None) -> MessageReply:
    """A stream whose connection is dropped after ``after`` events."""
    return (reply or text_reply(["Hel", "lo"])).with_disconnect(after)


def raw_stream(events: Iterable[tuple[str, Any]], *, status: int = 200, end: bool = True, **kwargs: Any) -> RawStream:
    return RawStream(list(events), status=status, end=end, **kwargs)


Response = Union[MessageReply, HttpError, RawStream]


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------


class FakeAnthropicServer(ScriptedHTTPServer):
    """Scripted ``POST /v1/messages`` server.  See module docstring."""

    def __init__(self, default: Any = _DEFAULT, *, validate: bool = True) -> None:
        super().__init__(default)
        self.validate = validate
        # ``GET /v1/models`` (provider health checks): the ids it lists, and its status.
        self.models: list[str] = ["claude-fake"]
        self.models_status = 200

    def default_response(self) -> Response:
        return text_reply("OK")

    # -- dispatch ----------------------------------------------------------------
    def handle(self, request: RecordedRequest, ex: Exchange) -> None:
        rid = f"req_fake_{self.next_id():06d}"
        base_headers = {"request-id": rid}

        def fail(status: int, message: str) -> None:
            etype = ERROR_TYPES.get(status, "api_error")
            ex.send_json(status, _error_body(etype, message, rid), base_headers)

        if request.path.split("?")[0].rstrip("/") == "/v1/models" and request.method == "GET":
            # The models list: what a provider health check asks for (never scripted).
            if self.models_status != 200:
                return fail(self.models_status, "models list unavailable")
            if self.validate and not (request.header("x-api-key") or request.header("authorization")):
                return fail(401, "x-api-key header is required")
            data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                    for m in self.models]
            return ex.send_json(200, {"data": data, "has_more": False, "first_id": None, "last_id": None},
                                base_headers)
        if request.path.rstrip("/") != "/v1/messages":
            return fail(404, f"Not found: {request.method} {request.path}")
        if request.method != "POST":
            return fail(404, f"Not found: {request.method} {request.path}")
        body = request.json
        if self.validate:
            if not (request.header("x-api-key") or request.header("authorization")):
                return fail(401, "x-api-key header is required")
            if not request.header("anthropic-version"):
                return fail(400, "anthropic-version: header is required")
            if not isinstance(body, dict):
                return fail(400, "Request body must be a JSON object")
            for key, typ in (("model", str), ("max_tokens", int), ("messages", list)):
                if key not in body:
                    return fail(400, f"{key}: Field required")
                if not isinstance(body[key], typ):
                    return fail(400, f"{key}: Input should be a valid {typ.__name__}")
        body = body if isinstance(body, dict) else {}
        streaming = body.get("stream") is True
        model = body.get("model") or "claude-fake"

        response = self.next_response(request)
        if response is None:
            ex.send_json(
                500,
                _error_body("api_error", "fake anthropic server: no scripted response", rid),
                {**base_headers, "x-should-retry": "false"},
            )
            return
        if isinstance(response, HttpError):
            return self._send_http_error(ex, response, rid)
        if isinstance(response, RawStream):
            return self._send_raw(ex, response, base_headers)
        if isinstance(response, MessageReply):
            if streaming:
                return self._stream(ex, response, model, base_headers, rid)
            return self._whole(ex, response, model, base_headers, rid)
        raise TypeError(f"unsupported scripted response: {response!r}")

    # -- writers -------------------------------------------------------------------
    def _send_http_error(self, ex: Exchange, err: HttpError, rid: str) -> None:
        headers = {"request-id": rid, **err.headers}
        body = err.body if err.body is not None else _error_body(err.error_type, err.message, rid)
        if isinstance(body, (str, bytes)):
            raw = body.encode("utf-8") if isinstance(body, str) else body
            ex.send_bytes(err.status, raw, "text/plain; charset=utf-8", headers)
        else:
            ex.send_json(err.status, body, headers)

    def _send_raw(self, ex: Exchange, raw: RawStream, headers: dict[str, str]) -> None:
        ex.start_stream(raw.status, "text/event-stream; charset=utf-8", {**headers, **raw.headers})
        for name, data in raw.events:
            ex.write_chunk(sse(name, data))
        if raw.end:
            ex.end_stream()
        else:
            ex.abort()

    def _whole(self, ex: Exchange, reply: MessageReply, model: str, headers: dict[str, str], rid: str) -> None:
        rendered = reply.render(reply.model or model, self)
        fault = reply.fault
        if fault is not None:
            if fault.kind == FAULT_STALL:
                if not ex.stall(fault.release):
                    return ex.abort()
            elif fault.kind == FAULT_DISCONNECT:
                return ex.abort()
            elif fault.kind == FAULT_ERROR:
                etype = fault.error_type or "overloaded_error"
                status = _STATUS_FOR_TYPE.get(etype, 500)
                ex.send_json(status, _error_body(etype, fault.message or etype, rid), headers)
                return
        ex.send_json(200, rendered.message, {**headers, **reply.headers})

    def _stream(self, ex: Exchange, reply: MessageReply, model: str, headers: dict[str, str], rid: str) -> None:
        rendered = reply.render(reply.model or model, self)
        events = rendered.events
        fault = reply.fault
        fault_at = -1
        if fault is not None:
            fault_at = fault.after if fault.after is not None else reply.default_fault_point(events)
            fault_at = max(0, min(fault_at, len(events)))
        ex.start_stream(200, "text/event-stream; charset=utf-8", {**headers, **reply.headers})
        for i in range(len(events) + 1):
            if i == fault_at and fault is not None:
                if fault.kind == FAULT_ERROR:
                    etype = fault.error_type or "overloaded_error"
                    ex.write_chunk(sse("error", _error_body(etype, fault.message or etype)))
                    ex.end_stream()
                    return
                if fault.kind == FAULT_DISCONNECT:
                    return ex.abort()
                if fault.kind == FAULT_STALL and not ex.stall(fault.release):
                    return ex.abort()
            if i == len(events):
                break
            if i > 0 and reply.delay and not ex.pause(reply.delay):
                return ex.abort()
            name, data = events[i]
            ex.write_chunk(sse(name, data))
        ex.end_stream()

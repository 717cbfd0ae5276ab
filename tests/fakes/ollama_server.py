"""A scripted fake of the Ollama HTTP API.

Endpoints:

* ``POST /api/chat`` -- answered from the script.  ``stream`` defaults to
  **true** when omitted (as in Ollama).  Streaming: ``200 application/x-ndjson``
  (chunked), one JSON object per line::

      {"model","created_at","message":{"role":"assistant","content":<chunk>},"done":false}
      ...
      {"model","created_at","message":{"role":"assistant","content":""},"done":true,
       "done_reason":"stop","total_duration","load_duration","prompt_eval_count",
       "prompt_eval_duration","eval_count","eval_duration"}

  ``"stream": false``: one JSON object with the whole content and ``done: true``
  plus the same stats.  Errors: ``{"error": "..."}`` with the scripted status
  (a mid-stream error is an ``{"error": ...}`` line in a 200 stream, as Ollama does).
* ``GET /api/tags`` -- ``{"models":[{"name","model","modified_at","size","digest","details"}]}``
  built from ``server.models`` (set ``server.tags_error = error(...)`` to fail it).
* ``GET /api/version`` -- ``{"version": "0.12.0"}``; ``GET /`` -- ``Ollama is running``.

Unscripted ``/api/chat`` requests get ``default`` -- by default ``reply("OK")``
-- and are listed in ``server.unscripted_requests``; ``default=None`` answers
500 ``{"error": "fake ollama server: no scripted response"}`` instead.
A chat body without ``model`` gets 400 ``{"error": "model is required"}``
without consuming the script.  Every request is recorded in ``server.requests``
(``.json`` holds the parsed body: model, messages, options, format, stream...).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Union

from ._http import (
    _DEFAULT,
    FAULT_DISCONNECT,
    FAULT_ERROR,
    FAULT_STALL,
    Exchange,
    Fault,
    RecordedRequest,
    ScriptedHTTPServer,
    split_text,
)

__all__ = [
    "FakeOllamaServer",
    "ChatReply",
    "OllamaError",
    "RecordedRequest",
    "reply",
    "error",
    "model_not_found",
    "action",
    "action_json",
    "stream_error",
    "stall",
    "disconnect",
    "now_iso",
]


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ChatReply:
    """A successful /api/chat answer.

    ``chunks``: the content pieces streamed one per NDJSON line.
    ``tool_calls``: optional Ollama tool calls (``[{"function": {"name", "arguments"}}]``),
    sent on the last content line (stream) / in the message (non-stream).
    ``prompt_eval_count`` / ``eval_count`` default to 10 / number of chunks.
    ``model=None`` echoes the requested model.  ``delay``: seconds between lines.
    """

    chunks: list[str]
    tool_calls: list[dict[str, Any]] | None = None
    done_reason: str = "stop"
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    model: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    delay: float = 0.0
    fault: Fault | None = None

    @property
    def content(self) -> str:
        return "".join(self.chunks)

    def with_error(self, message: str = "an error was encountered while running the model", after: int | None = None) -> "ChatReply":
        """Emit an ``{"error": message}`` line after ``after`` lines (default 1)
        of a 200 stream and end it.  Non-streaming: HTTP 500 with that error."""
        return dataclasses.replace(self, fault=Fault(FAULT_ERROR, after, None, message))

    def with_stall(self, after: int | None = None, release: Any = None) -> "ChatReply":
        """Hang after ``after`` lines (default 1) until ``.release`` is set (then
        finish normally) or the server closes.  Non-streaming: hang before answering."""
        f = Fault(FAULT_STALL, after)
        if release is not None:
            f.release = release
        return dataclasses.replace(self, fault=f)

    def with_disconnect(self, after: int | None = None) -> "ChatReply":
        """Drop the connection after ``after`` lines (default 1)."""
        return dataclasses.replace(self, fault=Fault(FAULT_DISCONNECT, after))

    @property
    def release(self):
        return self.fault.release if self.fault and self.fault.kind == FAULT_STALL else None

    def stats(self) -> dict[str, Any]:
        prompt = 10 if self.prompt_eval_count is None else self.prompt_eval_count
        evals = max(1, len(self.chunks)) if self.eval_count is None else self.eval_count
        return {
            "total_duration": 123_456_789,
            "load_duration": 1_234_567,
            "prompt_eval_count": prompt,
            "prompt_eval_duration": 12_345_678,
            "eval_count": evals,
            "eval_duration": 98_765_432,
        }

    def lines(self, model: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        chunks = self.chunks or [""]
        for i, chunk in enumerate(chunks):
            msg: dict[str, Any] = {"role": "assistant", "content": chunk}
            if self.tool_calls and i == len(chunks) - 1:
                msg["tool_calls"] = self.tool_calls
            out.append({"model": model, "created_at": now_iso(), "message": msg, "done": False})
        out.append(
            {
                "model": model,
                "created_at": now_iso(),
                "message": {"role": "assistant", "content": ""},
                "done_reason": self.done_reason,
                "done": True,
                **self.stats(),
            }
        )
        return out

    def whole(self, model: str) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return {
            "model": model,
            "created_at": now_iso(),
            "message": msg,
            "done_reason": self.done_reason,
            "done": True,
            **self.stats(),
        }


@dataclass
class OllamaError:
    """HTTP error ``{"error": message}``.  ``message`` may contain ``{model}``,
    filled with the requested model."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1


Response = Union[ChatReply, OllamaError]


def reply(
    content: str | Iterable[str] = "OK",
    chunks: int = 3,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> ChatReply:
    """A chat reply.  ``content`` as a string is split into ``chunks`` pieces;
    a list of strings is streamed as given.  ``kwargs``: any :class:`ChatReply`
    field (done_reason, prompt_eval_count, eval_count, model, headers, times, delay)."""
    pieces = split_text(content, chunks) if isinstance(content, str) else list(content)
    return ChatReply(pieces, tool_calls=tool_calls, **kwargs)


def error(status: int, message: str, *, times: int = 1, headers: Mapping[str, str] | None = None) -> OllamaError:
    return OllamaError(status, message, dict(headers or {}), times)


def model_not_found(model: str | None = None, *, times: int = 1) -> OllamaError:
    """404 ``{"error": "model 'x' not found"}`` (x = the requested model if omitted)."""
    return OllamaError(404, f"model '{model if model is not None else '{model}'}' not found", {}, times)


def action_json(
    thought: str = "",
    action: str = "final",
    answer: str | None = None,
    tool: str | None = None,
    target_agent: str | None = None,
    args: Mapping[str, Any] | None = None,
    **extra: Any,
) -> str:
    """The JSON string of an agent action.  ``thought`` and ``action`` are always
    present; ``answer``/``tool``/``target_agent``/``args`` only when not None;
    ``extra`` keys are added verbatim (use them for other fields or explicit nulls)."""
    obj: dict[str, Any] = {"thought": thought, "action": action}
    for key, value in (("answer", answer), ("tool", tool), ("target_agent", target_agent)):
        if value is not None:
            obj[key] = value
    if args is not None:
        obj["args"] = dict(args)
    obj.update(extra)
    return json.dumps(obj, ensure_ascii=False)


def action(
    thought: str = "",
    action: str = "final",  # noqa: A002 - mirrors the JSON key
    answer: str | None = None,
    tool: str | None = None,
    target_agent: str | None = None,
    args: Mapping[str, Any] | None = None,
    *,
    chunks: int = 3,
    reply_kwargs: Mapping[str, Any] | None = None,
    **extra: Any,
) -> ChatReply:
    """A chat reply whose content is :func:`action_json` (streamed in ``chunks``)."""
    text = action_json(thought, action, answer, tool, target_agent, args, **extra)
    return reply(text, chunks, **dict(reply_kwargs or {}))


def stream_error(
    message: str = "an error was encountered while running the model",
    *,
    base: ChatReply | None = None,
    after: int | None = None,
) -> ChatReply:
    """A 200 stream that yields ``after`` (default 1) content lines then ``{"error": message}``."""
    return (base or reply("Hello there", 3)).with_error(message, after)


def stall(base: ChatReply | None = None, *, after: int | None = None, release: Any = None) -> ChatReply:
    return (base or reply("Hello there", 3)).with_stall(after, release)


def disconnect(base: ChatReply | None = None, *, after: int | None = None) -> ChatReply:
    return (base or reply("Hello there", 3)).with_disconnect(after)


def _tag_entry(m: str | Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(m, str):
        return dict(m)
    family = m.split(":", 1)[0].split("/")[-1].split("-")[0]
    return {
        "name": m,
        "model": m,
        "modified_at": "2025-01-01T00:00:00.000000000Z",
        "size": 4_661_224_676,
        "digest": "f" * 64,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": "8.0B",
            "quantization_level": "Q4_K_M",
        },
    }


class FakeOllamaServer(ScriptedHTTPServer):
    """Scripted Ollama server.  See module docstring.

    ``models``: names (or full dicts) listed by ``GET /api/tags``; mutable via
    ``server.models``.  ``tags_error``: an :class:`OllamaError` returned by
    ``/api/tags`` instead (not consumed)."""

    version = "0.12.0"

    def __init__(self, default: Any = _DEFAULT, *, models: Iterable[str | Mapping[str, Any]] = ("llama3.2:latest",)) -> None:
        super().__init__(default)
        self.models: list[str | Mapping[str, Any]] = list(models)
        self.tags_error: OllamaError | None = None

    def default_response(self) -> Response:
        return reply("OK", 1)

    def chat_requests(self) -> list[RecordedRequest]:
        return self.requests_to("/api/chat", "POST")

    def handle(self, request: RecordedRequest, ex: Exchange) -> None:
        path = request.path
        if path == "/" and request.method in ("GET", "HEAD"):
            return ex.send_bytes(200, b"Ollama is running", "text/plain; charset=utf-8")
        if path == "/api/version" and request.method == "GET":
            return ex.send_json(200, {"version": self.version})
        if path == "/api/tags" and request.method == "GET":
            if self.tags_error is not None:
                return ex.send_json(self.tags_error.status, {"error": self.tags_error.message}, self.tags_error.headers)
            return ex.send_json(200, {"models": [_tag_entry(m) for m in list(self.models)]})
        if path == "/api/chat" and request.method == "POST":
            return self._chat(request, ex)
        ex.send_bytes(404, b"404 page not found", "text/plain")

    def _chat(self, request: RecordedRequest, ex: Exchange) -> None:
        body = request.json
        if not isinstance(body, dict):
            return ex.send_json(400, {"error": "invalid request body"})
        model = body.get("model")
        if not model:
            return ex.send_json(400, {"error": "model is required"})
        streaming = body.get("stream", True) is not False

        response = self.next_response(request)
        if response is None:
            return ex.send_json(500, {"error": "fake ollama server: no scripted response"})
        if isinstance(response, OllamaError):
            msg = response.message.replace("{model}", str(model))
            return ex.send_json(response.status, {"error": msg}, response.headers)
        if not isinstance(response, ChatReply):
            raise TypeError(f"unsupported scripted response: {response!r}")
        model_name = response.model or model
        fault = response.fault

        if not streaming:
            if fault is not None:
                if fault.kind == FAULT_STALL and not ex.stall(fault.release):
                    return ex.abort()
                if fault.kind == FAULT_DISCONNECT:
                    return ex.abort()
                if fault.kind == FAULT_ERROR:
                    return ex.send_json(500, {"error": fault.message}, response.headers)
            return ex.send_json(200, response.whole(model_name), response.headers)

        lines = response.lines(model_name)
        fault_at = -1
        if fault is not None:
            fault_at = 1 if fault.after is None else max(0, min(fault.after, len(lines)))
        ex.start_stream(200, "application/x-ndjson", response.headers)
        for i in range(len(lines) + 1):
            if fault is not None and i == fault_at:
                if fault.kind == FAULT_ERROR:
                    ex.write_chunk(json.dumps({"error": fault.message}, separators=(",", ":")).encode() + b"\n")
                    return ex.end_stream()
                if fault.kind == FAULT_DISCONNECT:
                    return ex.abort()
                if fault.kind == FAULT_STALL and not ex.stall(fault.release):
                    return ex.abort()
            if i == len(lines):
                break
            if i > 0 and response.delay and not ex.pause(response.delay):
                return ex.abort()
            ex.write_chunk(json.dumps(lines[i], ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n")
        ex.end_stream()

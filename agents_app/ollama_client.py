"""A small Ollama chat client on ``requests`` (seed 004 §4), with NDJSON streaming for async callers.

``chat`` is the seed's blocking call; ``stream_chat`` reads Ollama's NDJSON stream with
``iter_lines`` in a worker thread that feeds an ``asyncio`` queue, so each piece reaches the
event loop as it arrives and the loop never blocks on the socket. Every failure is an
:class:`EngineError` naming the model and the endpoint, with a stable code:

- ``provider_unreachable``: no connection (Ollama not running, wrong ``OLLAMA_URL``);
- ``provider_timeout``: no answer within ``OLLAMA_TIMEOUT`` seconds (connect or between bytes);
- ``model_not_found``: HTTP 404 (Ollama's answer for a model that is not pulled);
- ``provider_error``: any other HTTP error, an ``{"error": ...}`` line mid-stream, a dropped or
  garbled stream.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import requests
import urllib3
from django.conf import settings

from agents_app.engines.base import EngineError

DEFAULT_TEMPERATURE = 0.2


@dataclass(frozen=True)
class ChatChunk:
    """One NDJSON line of a streamed answer (or the whole answer when not streamed)."""

    content: str
    done: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def usage(self) -> dict[str, int]:
        """Token counts Ollama reports on the ``done`` line, in the run's usage shape."""
        usage: dict[str, int] = {}
        if isinstance(self.data.get("prompt_eval_count"), int):
            usage["input_tokens"] = self.data["prompt_eval_count"]
        if isinstance(self.data.get("eval_count"), int):
            usage["output_tokens"] = self.data["eval_count"]
        return usage


class OllamaClient:
    def __init__(self, *, base_url: str | None = None, timeout: float | None = None):
        self.base_url = (base_url or settings.OLLAMA_URL).rstrip("/")
        self.timeout = float(timeout if timeout is not None else settings.OLLAMA_TIMEOUT)

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/api/chat"

    @property
    def tags_url(self) -> str:
        return f"{self.base_url}/api/tags"

    @staticmethod
    def payload(messages: list[dict[str, str]], *, model: str, stream: bool, format: str | None = "json",
                temperature: float = DEFAULT_TEMPERATURE) -> dict[str, Any]:
        """The seed's request body, plus ``format`` (holds the model to JSON) and ``stream``."""
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": stream,
                                "options": {"temperature": temperature}}
        if format:
            body["format"] = format
        return body

    # --- blocking ----------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], *, model: str, format: str | None = "json",
             temperature: float = DEFAULT_TEMPERATURE) -> ChatChunk:
        """One non-streamed ``/api/chat`` call; returns the whole answer (``done`` line data)."""
        body = self.payload(messages, model=model, stream=False, format=format, temperature=temperature)
        with requests.Session() as session:
            response = self._post(session, body, model=model, stream=False)
            try:
                data = response.json()
            except ValueError as exc:
                raise self._error("provider_error", model, f"answered with invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise self._error("provider_error", model, "answered with something other than a JSON object")
        if data.get("error"):
            raise self._error("provider_error", model, str(data["error"]))
        return ChatChunk(content=_content(data), done=True, data=data)

    def tags(self) -> list[str]:
        """Names of the models the server has (``GET /api/tags``); a cheap health check."""
        try:
            response = requests.get(self.tags_url, timeout=self.timeout)
        except requests.Timeout as exc:
            raise EngineError(f"Ollama at {self.tags_url} did not answer within {self.timeout:g} s: {exc}",
                              code="provider_timeout", retryable=True) from exc
        except requests.RequestException as exc:
            raise EngineError(f"Ollama is unreachable at {self.tags_url}: {exc}", code="provider_unreachable",
                              retryable=True) from exc
        if response.status_code >= 400:
            raise EngineError(f"Ollama at {self.tags_url} answered HTTP {response.status_code}: "
                              f"{_error_text(response)}", code="provider_error")
        try:
            models = response.json().get("models") or []
            return [str(m.get("name") or m.get("model")) for m in models if isinstance(m, dict)]
        except (ValueError, AttributeError) as exc:
            raise EngineError(f"Ollama at {self.tags_url} answered an unexpected body: {exc}",
                              code="provider_error") from exc

    # --- streaming ---------------------------------------------------------------------------------
    async def stream_chat(self, messages: list[dict[str, str]], *, model: str, format: str | None = "json",
                          temperature: float = DEFAULT_TEMPERATURE) -> AsyncIterator[ChatChunk]:
        """Yield each NDJSON line of a streamed answer as it arrives, the ``done`` line last.

        Closing the iterator early (or cancelling the task reading it) shuts the connection down,
        which ends the worker thread's read and Ollama's generation.
        """
        body = self.payload(messages, model=model, stream=True, format=format, temperature=temperature)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()
        holder: dict[str, Any] = {}
        lock = threading.Lock()

        def put(kind: str, item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, item))
            except RuntimeError:  # the loop is gone: nobody is listening any more
                pass

        def close_response() -> None:
            with lock:
                response, session = holder.pop("response", None), holder.pop("session", None)
            for closable in (response, session):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:  # noqa: BLE001 - best effort
                        pass

        def interrupt() -> None:
            # Called from the loop: closing the response here would wait for the worker's blocked
            # read (the file lock), so shut the socket down instead; that wakes the read at once
            # and tells Ollama to stop generating. The worker then closes everything itself.
            with lock:
                response = holder.get("response")
            sock = getattr(getattr(getattr(response, "raw", None), "connection", None), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def worker() -> None:
            try:
                session = requests.Session()
                with lock:
                    holder["session"] = session
                response = self._post(session, body, model=model, stream=True)
                with lock:
                    holder["response"] = response
                if stop.is_set():
                    return
                done = False
                # Read to the end of the body even after the done line, so the connection closes
                # cleanly instead of being reset with unread bytes.
                for line in response.iter_lines():
                    if stop.is_set():
                        return
                    if done or not line.strip():
                        continue
                    chunk = self._parse_line(line, model=model)
                    put("chunk", chunk)
                    done = chunk.done
                if not done:
                    raise self._error("provider_error", model, "the stream ended before the final (done) line")
                put("end", None)
            except EngineError as exc:
                put("error", exc)
            except requests.RequestException as exc:
                if _is_read_timeout(exc):
                    put("error", self._error("provider_timeout", model,
                                             f"no stream data for {self.timeout:g} s ({exc})"))
                else:
                    put("error", self._error("provider_error", model, f"the stream broke off: {exc}"))
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the reader
                put("error", exc if stop.is_set() else self._error("provider_error", model, f"{type(exc).__name__}: {exc}"))
            finally:
                close_response()

        thread = threading.Thread(target=worker, name=f"ollama-stream-{model}", daemon=True)
        thread.start()
        finished = False
        try:
            while True:
                kind, item = await queue.get()
                if kind == "chunk":
                    yield item
                elif kind == "end":
                    finished = True
                    return
                else:
                    finished = True
                    raise item
        finally:
            if not finished:  # the reader gave up early (closed, cancelled): stop the worker now
                stop.set()
                interrupt()

    # --- helpers -----------------------------------------------------------------------------------
    def _post(self, session: requests.Session, body: dict[str, Any], *, model: str, stream: bool) -> requests.Response:
        try:
            response = session.post(self.chat_url, json=body, stream=stream, timeout=self.timeout)
        except requests.Timeout as exc:
            raise self._error("provider_timeout", model, f"no answer within {self.timeout:g} s ({exc})") from exc
        except requests.ConnectionError as exc:
            raise self._error("provider_unreachable", model, f"cannot connect ({exc})") from exc
        except requests.RequestException as exc:
            raise self._error("provider_error", model, str(exc)) from exc
        if response.status_code >= 400:
            detail = _error_text(response)
            response.close()
            if response.status_code == 404:
                raise self._error("model_not_found", model, f"HTTP 404: {detail} (pull it with `ollama pull {model}`)")
            raise self._error("provider_error", model, f"HTTP {response.status_code}: {detail}")
        return response

    def _parse_line(self, line: bytes, *, model: str) -> ChatChunk:
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise self._error("provider_error", model, f"sent an invalid stream line: {line[:200]!r}") from exc
        if not isinstance(data, dict):
            raise self._error("provider_error", model, f"sent an unexpected stream line: {line[:200]!r}")
        if data.get("error"):
            raise self._error("provider_error", model, f"failed mid-stream: {data['error']}")
        return ChatChunk(content=_content(data), done=bool(data.get("done")), data=data)

    def _error(self, code: str, model: str, detail: str) -> EngineError:
        what = {
            "provider_unreachable": "Ollama is unreachable",
            "provider_timeout": "Ollama timed out",
            "model_not_found": "Ollama model not found",
        }.get(code, "Ollama request failed")
        return EngineError(f"{what}: model {model!r} at {self.chat_url}: {detail}", code=code,
                           retryable=code in {"provider_unreachable", "provider_timeout"})


def _content(data: dict[str, Any]) -> str:
    message = data.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return message["content"]
    return ""


def _is_read_timeout(exc: requests.RequestException) -> bool:
    # requests reports a read timeout inside iter_lines as ConnectionError(ReadTimeoutError).
    if isinstance(exc, requests.Timeout):
        return True
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


def _error_text(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return (response.text or "").strip()[:500] or response.reason or ""
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])[:500]
    return json.dumps(data)[:500]

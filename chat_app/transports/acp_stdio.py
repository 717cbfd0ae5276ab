"""The line filter in front of the ``agent-client-protocol`` package's connection, over stdio.

The package's ``Connection`` reads newline-delimited JSON itself, but it silently drops a line
that is not JSON and crashes its reader on a JSON value that is not an object, and it knows only
the ACP method names. :class:`LineTransport` is a message transport (the package's
``Transport`` seam: ``send``/``receive``/``close``) that reads the lines itself and:

- answers a line that is not JSON with ``-32700`` (id ``null``), and a JSON value that is not a
  JSON-RPC 2.0 request, notification or response (an array, ``jsonrpc`` missing or not
  ``"2.0"``, a non-string ``method``, an id that is not a string or integer, ``params`` that is
  not structured) with ``-32600`` (its id when it has a usable one, else ``null``); the process
  keeps serving after each;
- renames the seed-002 aliases to ACP methods before the package dispatches them
  (:data:`ALIASES`), noting the alias used in ``params._meta["orchestrator/alias"]``;
- passes everything else through unchanged, so ``-32601`` (unknown method), ``-32602`` (bad
  params) and ``-32603`` (internal failure) come from the package, and notifications are never
  answered.

Writes go out one JSON object per line, in call order, under a lock; :meth:`LineTransport.notify`
sends a notification the package has no helper for (``session/progress``, ``permission/request``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

logger = logging.getLogger("orchestrator.acp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

# Seed-002 names → ACP methods. ``permission/response`` becomes an extension method
# (``_orchestrator/...``), which the package hands to ``Agent.ext_method``/``ext_notification``.
ALIASES: dict[str, str] = {
    "acp/initialize": "initialize",
    "session/create": "session/new",
    "permission/response": "_orchestrator/permission_response",
}
ALIAS_META_KEY = "orchestrator/alias"

# 50 MB, as the package's own stdio runner allows (embedded resources can be large).
LINE_LIMIT = 50 * 1024 * 1024
# After stdin closes, requests already received get this long to be answered (``printf ... |``
# use); then the connection closes and what still runs is cancelled.
EOF_GRACE_SECONDS = 10.0


def _error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def _id_key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)


def _usable_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def check_message(message: Any) -> dict[str, Any] | None:
    """The ``-32600`` answer for a decoded line that is not a JSON-RPC 2.0 message, else None."""
    if isinstance(message, list):
        return _error(None, INVALID_REQUEST, "Invalid request", {"details": "batches are not supported: send one message per line"})
    if not isinstance(message, dict):
        return _error(None, INVALID_REQUEST, "Invalid request", {"details": "a message is a JSON object"})
    id_ = message.get("id")
    reply_id = id_ if _usable_id(id_) else None
    if message.get("jsonrpc") != "2.0":
        return _error(reply_id, INVALID_REQUEST, "Invalid request", {"details": 'jsonrpc must be "2.0"'})
    if "id" in message and not _usable_id(id_):
        return _error(None, INVALID_REQUEST, "Invalid request", {"details": "id must be a string, an integer or null"})
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            return _error(reply_id, INVALID_REQUEST, "Invalid request", {"details": "method must be a non-empty string"})
        if "params" in message and message["params"] is not None and not isinstance(message["params"], (dict, list)):
            return _error(reply_id, INVALID_REQUEST, "Invalid request", {"details": "params must be an object"})
        return None
    # A response to one of our requests (session/request_permission).
    if "id" not in message or ("result" in message) == ("error" in message):
        return _error(reply_id, INVALID_REQUEST, "Invalid request",
                      {"details": "a message needs a method, or an id with exactly one of result and error"})
    return None


def apply_alias(message: dict[str, Any]) -> dict[str, Any]:
    """Rename a seed-002 method to its ACP name (and fill what seed clients leave out)."""
    method = message.get("method")
    target = ALIASES.get(method) if isinstance(method, str) else None
    if target is None:
        return _seed_prompt(message)
    params = message.get("params")
    params = dict(params) if isinstance(params, dict) else ({} if params is None else params)
    if isinstance(params, dict):
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        params["_meta"] = {**meta, ALIAS_META_KEY: method}
        if target == "initialize":
            params.setdefault("protocolVersion", 1)
        elif target == "session/new":
            params.setdefault("cwd", os.getcwd())
            params.setdefault("mcpServers", [])
    return {**message, "method": target, "params": params}


def _seed_prompt(message: dict[str, Any]) -> dict[str, Any]:
    # A seed client may send the task as a plain string: make it one text block.
    params = message.get("params")
    if message.get("method") == "session/prompt" and isinstance(params, dict) and isinstance(params.get("prompt"), str):
        return {**message, "params": {**params, "prompt": [{"type": "text", "text": params["prompt"]}]}}
    return message


class LineTransport:
    """Newline-delimited JSON-RPC over a reader/writer pair, with the checks described above."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 eof_grace: float = EOF_GRACE_SECONDS) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._closed = False
        self._eof_grace = eof_grace
        # Ids of requests received and not answered yet (to let them finish after EOF).
        self._unanswered: set[Any] = set()
        self._answered = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise ConnectionError("Transport closed")
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        async with self._lock:
            self._writer.write(line.encode("utf-8"))
            await self._writer.drain()
        if "method" not in message and ("result" in message or "error" in message):
            self._unanswered.discard(_id_key(message.get("id")))
            self._answered.set()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._read_line()
            if line is None:
                await self._drain_requests()
                return None
            text = line.strip()
            if not text:
                continue
            try:
                message = json.loads(text)
            except (ValueError, UnicodeDecodeError) as exc:
                logger.info("acp: a line that is not JSON: %s", exc)
                await self.send(_error(None, PARSE_ERROR, "Parse error", {"details": str(exc)}))
                continue
            problem = check_message(message)
            if problem is not None:
                logger.info("acp: invalid request: %s", problem["error"].get("data"))
                await self.send(problem)
                continue
            if "method" in message and "id" in message:
                self._unanswered.add(_id_key(message["id"]))
            return apply_alias(message)

    async def _drain_requests(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._eof_grace
        while self._unanswered and loop.time() < deadline:
            self._answered.clear()
            try:
                await asyncio.wait_for(self._answered.wait(), deadline - loop.time())
            except TimeoutError:
                break
        if self._unanswered:
            logger.info("acp: stdin closed; %d request(s) still running are cancelled", len(self._unanswered))

    async def _read_line(self) -> bytes | None:
        try:
            return await self._reader.readuntil(b"\n") or None
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError as exc:
            # Drop the oversized line up to its end and say so; keep serving.
            await self._reader.readexactly(exc.consumed)
            while True:
                try:
                    await self._reader.readuntil(b"\n")
                    break
                except asyncio.LimitOverrunError as more:
                    await self._reader.readexactly(more.consumed)
                except asyncio.IncompleteReadError:
                    return None
            await self.send(_error(None, INVALID_REQUEST, "Invalid request",
                                   {"details": f"a message is limited to {LINE_LIMIT} bytes"}))
            return b""

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - closing stdout at exit
            pass


async def stdio_pair(protocol_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A reader on stdin and a writer on ``protocol_fd`` (the real stdout, kept apart from fd 1)."""
    import sys

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    protocol = asyncio.StreamReaderProtocol(reader)
    try:
        await loop.connect_read_pipe(lambda: protocol, sys.stdin)
    except (ValueError, OSError):
        # stdin is a regular file or a terminal: read it from a thread instead.
        import threading

        def feed() -> None:
            try:
                for chunk in iter(lambda: sys.stdin.buffer.readline(), b""):
                    loop.call_soon_threadsafe(reader.feed_data, chunk)
            finally:
                loop.call_soon_threadsafe(reader.feed_eof)

        threading.Thread(target=feed, name="acp-stdin", daemon=True).start()
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    try:
        transport, write_protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    except (ValueError, OSError):
        return reader, _FileWriter(out)  # type: ignore[return-value]  # stdout is a regular file
    return reader, asyncio.StreamWriter(transport, write_protocol, None, loop)


class _FileWriter:
    """The writer interface :class:`LineTransport` uses, for a stdout that is a regular file."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def write(self, data: bytes) -> None:
        self._out.write(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self._out.close()


def main() -> None:
    """The ``orchestrator-acp`` console script: ``manage.py acp`` with the same options."""
    import sys

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line([sys.argv[0], "acp", *sys.argv[1:]])

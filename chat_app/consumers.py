"""``/ws/chat`` (seed 000): chat turns and tool approvals over one WebSocket.

Client → server (JSON text frames):

- ``{"agent_role": ..., "message": ..., "conversation_history": [...]?}`` starts a chat turn;
- ``{"type": "confirm", "confirmation_id": ..., "approved": true|false, "reason"?: ...,
  "remember"?: "conversation"|"agent", "pattern"?: ...}`` approves or denies a tool call that is
  waiting (``tool_use`` with ``status: awaiting_input``); ``remember`` also makes the decision an
  approval rule (see ``tools_app.services.tool_confirmation_decide``).

Server → client: the seed-000 event objects (the ``chat-stream`` dialect,
``chat_app/transports/chat_stream.py``, through ``stream_run``), each turn ending with
``done`` or ``error``. Turns on one socket run one after another: a message sent while a turn
streams is queued (up to ``MAX_QUEUED``) and starts when the current one ends, so events of two
turns never interleave. A malformed frame, an invalid payload or an unknown role gets an
``error`` event and the socket stays open. Disconnecting stops the streaming; runs already
started go on server-side (their results are in the conversation and the run timeline).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from rest_framework.exceptions import ValidationError

from chat_app import services
from chat_app.api.chat_stream import chat_input_validate
from chat_app.eventlog import in_thread
from chat_app.executor import get_executor
from chat_app.transports import stream_run
from chat_app.transports.chat_stream import ChatStreamDialect
from core.errors import ApplicationError
from orchestrator_site.errors import _flatten
from tools_app.services import tool_confirmation_decide

logger = logging.getLogger("orchestrator.ws")

MAX_QUEUED = 20


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        """Accept authenticated users only (session cookie or ``?token=``)."""
        user = self.scope.get("user")
        if not user or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.user = user
        self.turns: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.worker: asyncio.Task | None = asyncio.create_task(self._run_turns(), name="ws-chat-turns")
        await self.accept()

    async def disconnect(self, code):
        """Stop streaming; the runs themselves continue server-side."""
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.cancel()
            try:
                await worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - already logged by the worker
                pass
            self.worker = None

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """Decode JSON ourselves so a malformed frame gets an error event instead of closing the socket."""
        if text_data is None:
            await self._error("Send JSON text frames, not binary ones.", code="malformed_json")
            return
        try:
            content = json.loads(text_data)
        except ValueError as exc:
            logger.info("ws/chat: malformed JSON from user %s: %s", self.user.pk, exc)
            await self._error(f"Malformed JSON: {exc}.", code="malformed_json")
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs):
        """Dispatch a chat turn or a confirmation."""
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "confirm":
            await self._confirm(content)
        elif kind in (None, "chat", "message"):
            await self._enqueue(content)
        else:
            await self._error(f"Unknown message type {kind!r}; send a chat message or type 'confirm'.",
                              code="unknown_type")

    # --- chat turns ------------------------------------------------------------------------------
    async def _enqueue(self, content: Any) -> None:
        if isinstance(content, dict):
            content = {k: v for k, v in content.items() if k != "type"}
        try:
            data = chat_input_validate(content)
        except ValidationError as exc:
            logger.info("ws/chat: invalid chat payload from user %s: %s", self.user.pk, exc.detail)
            await self._error("; ".join(_flatten(exc.detail)), code="invalid_input", errors=exc.detail)
            return
        if self.turns.qsize() >= MAX_QUEUED:
            await self._error(f"Too many messages waiting on this connection (limit {MAX_QUEUED}).", code="queue_full")
            return
        self.turns.put_nowait(data)

    async def _run_turns(self) -> None:
        while True:
            data = await self.turns.get()
            try:
                await self._run_turn(data)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one broken turn must not end the connection
                logger.exception("ws/chat: turn failed for user %s", self.user.pk)
                await self._error("Internal error while streaming this turn.", code="internal_error")

    async def _run_turn(self, data: dict[str, Any]) -> None:
        try:
            # Shielded: a disconnect while the run is being recorded must not leave it unlaunched.
            created = await asyncio.shield(services.run_start(
                user=self.user, input=data["message"], agent_role=data["agent_role"],
                history=data["conversation_history"],
            ))
        except ApplicationError as exc:
            logger.info("ws/chat: turn refused for user %s: %s", self.user.pk, exc.message)
            await self._error(exc.message, code=exc.code, **exc.extra)
            return
        run_id = str(created.run.id)
        dialect = ChatStreamDialect(run_id=run_id, conversation_id=str(created.conversation.id))
        # No pings on a WebSocket (the protocol keeps itself alive): the interval only bounds waits.
        frames = stream_run(dialect, get_executor().subscribe(run_id), ping_interval=float(settings.SSE_PING_INTERVAL))
        async for batch in frames:
            for item in batch:
                if isinstance(item, str):
                    continue  # an SSE keep-alive comment
                if item["type"] == "error":
                    logger.warning("ws/chat: run %s failed: %s", run_id, item.get("message"))
                await self.send_json(item)

    # --- confirmations ---------------------------------------------------------------------------
    async def _confirm(self, content: dict[str, Any]) -> None:
        confirmation_id = content.get("confirmation_id")
        approved = content.get("approved")
        reason = content.get("reason", "")
        remember, pattern = content.get("remember"), content.get("pattern")
        if not isinstance(confirmation_id, str) or not isinstance(approved, bool) or not isinstance(reason, str):
            await self._error("A confirm message needs confirmation_id (string) and approved (true or false).",
                              code="invalid_input")
            return
        if not isinstance(remember, (str, type(None))) or not isinstance(pattern, (str, type(None))):
            await self._error("remember and pattern, when given, are strings.", code="invalid_input")
            return
        try:
            await in_thread(tool_confirmation_decide)(
                user=self.user, confirmation_id=confirmation_id, approved=approved, reason=reason,
                remember=remember, pattern=pattern,
            )
        except ApplicationError as exc:
            logger.info("ws/chat: confirmation %s refused for user %s: %s", confirmation_id, self.user.pk, exc.message)
            await self._error(exc.message, code=exc.code, confirmation_id=confirmation_id, **exc.extra)

    async def _error(self, message: str, *, code: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "message": message, "code": code, **extra})

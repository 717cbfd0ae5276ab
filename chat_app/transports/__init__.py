"""Client dialects: one module per wire protocol, each a :class:`~.base.Dialect` registered by name.

- ``agent_chat``: seed-001 SSE (``POST /v1/agent/chat``, ``GET /v1/agent/runs/:id/events``);
- ``vercel_ai``: the AI SDK UI message stream (``?format=vercel-ai``);
- ``chat_stream``: seed-000 objects (``POST /api/v1/chat/stream`` SSE and ``/ws/chat``);
- ``message_stream``: seed-003 named SSE events (``POST /conversations/:id/messages/stream``).
- ``acp``: ACP over stdio (``manage.py acp``); imported by that command only, so HTTP never loads
  the ``acp`` package (``acp_stdio.py`` holds the line filter in front of it).

``base.stream_run`` drives any of them over a run; the HTTP views are in ``chat_app/api``.
"""
from .base import Dialect, detach, dialect_names, get_dialect, stream_run

__all__ = ["Dialect", "detach", "dialect_names", "get_dialect", "stream_run"]

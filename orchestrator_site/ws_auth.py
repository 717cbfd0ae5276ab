"""WebSocket authentication: the session cookie, or a DRF token in the ``token`` query parameter."""
from __future__ import annotations

from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser


@database_sync_to_async
def _user_for_token(key: str):
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token and token.user.is_active else None


class _TokenQueryMiddleware:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        key = (query.get("token") or [""])[0]
        if key:
            user = await _user_for_token(key)
            scope = dict(scope, user=user or AnonymousUser())
        return await self.inner(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner):  # noqa: N802 - reads like the channels middleware stacks
    return AuthMiddlewareStack(_TokenQueryMiddleware(inner))

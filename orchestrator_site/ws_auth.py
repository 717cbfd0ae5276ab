"""WebSocket authentication: the session cookie, or a DRF token in the ``token`` query parameter."""
from __future__ import annotations

from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.http.request import is_same_domain
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


class WebSocketOriginValidator(OriginValidator):
    """Refuses WebSockets opened by pages on foreign origins; allows clients that send no Origin.

    Browsers always send ``Origin``, so checking it stops other sites from opening sockets with a
    visitor's session cookie. Non-browser clients (scripts, native apps) send none and
    authenticate with ``?token=``; refusing them would protect nothing. Allowed: the
    ``ALLOWED_HOSTS`` names (any port) and the explicit ``CORS_ALLOWED_ORIGINS``.
    """

    def __init__(self, application):
        super().__init__(application, [*settings.ALLOWED_HOSTS, *settings.CORS_ALLOWED_ORIGINS])

    def valid_origin(self, parsed_origin):
        if parsed_origin is None:
            return True
        return self.validate_origin(parsed_origin)

    def match_allowed_origin(self, parsed_origin, pattern):
        if "://" in pattern:  # an explicit origin: scheme, host and port must all match
            return super().match_allowed_origin(parsed_origin, pattern)
        host = parsed_origin.hostname or ""
        return bool(host) and is_same_domain(host, pattern.strip("[]") if host.count(":") else pattern)

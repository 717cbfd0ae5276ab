"""Authentication: DRF tokens as ``Token <key>`` or ``Bearer <key>``, and the browser session."""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header


class BearerOrTokenAuthentication(TokenAuthentication):
    """Accepts ``Authorization: Token <key>`` and ``Authorization: Bearer <key>``."""

    keywords = (b"token", b"bearer")

    def authenticate(self, request):
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() not in self.keywords:
            return None
        if len(auth) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected '<scheme> <key>'.")
        try:
            key = auth[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token header: the key has invalid characters.")
        return self.authenticate_credentials(key)

"""Authentication: DRF tokens as ``Token <key>`` or ``Bearer <key>``, and the browser session."""
from __future__ import annotations

from rest_framework.authentication import TokenAuthentication


class BearerOrTokenAuthentication(TokenAuthentication):
    """Accepts ``Authorization: Token <key>`` and ``Authorization: Bearer <key>``."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if header[:7].lower() == "bearer ":
            request.META["HTTP_AUTHORIZATION"] = "Token " + header[7:]
        return super().authenticate(request)


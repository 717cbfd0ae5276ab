"""ASGI entry point: HTTP through Django, WebSockets through Channels."""
import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator_site.settings")
# Static files (admin, the offline Swagger UI assets, the chat page) are served by the app itself
# so the two-command quick start needs no web server or collectstatic step.
django_asgi_app = ASGIStaticFilesHandler(get_asgi_application())

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat_app.routing import websocket_urlpatterns  # noqa: E402
from orchestrator_site.ws_auth import TokenOrSessionAuthMiddleware, WebSocketOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": WebSocketOriginValidator(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

"""ASGI entry point: HTTP through Django, WebSockets through Channels."""
import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator_site.settings")
get_asgi_application()  # django.setup(), before the handler below imports its dependencies

from orchestrator_site.asgi_handler import OrchestratorASGIHandler  # noqa: E402
from orchestrator_site.stream_lane import StreamLane  # noqa: E402

# Static files (admin, the offline Swagger UI assets, the chat page) are served by the app itself
# so the two-command quick start needs no web server or collectstatic step.
# Token-authenticated requests to the streaming views take the stream lane (see its module).
django_asgi_app = ASGIStaticFilesHandler(StreamLane(OrchestratorASGIHandler()))

# Under ASGI each request's sync work runs on threads of its own (and the database work of runs
# and streams on the database pool, which manages its connections), so closing "old" connections
# of the current thread when a request *starts* has nothing to close; it only cost a thread hop
# before every response. request_finished still closes them after the response.
from django.core.signals import request_started  # noqa: E402
from django.db import close_old_connections, reset_queries  # noqa: E402

request_started.disconnect(close_old_connections)
request_started.disconnect(reset_queries)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat_app.routing import websocket_urlpatterns  # noqa: E402
from orchestrator_site.ws_auth import TokenOrSessionAuthMiddleware, WebSocketOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": WebSocketOriginValidator(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

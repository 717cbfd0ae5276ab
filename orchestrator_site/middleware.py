"""The project's middleware: JSON errors for API paths, and Django's own middleware adapted so
that API requests do not pay a thread hop per hook under ASGI."""
from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.middleware import clickjacking, common, csrf, security

from .errors import error_response

logger = logging.getLogger("orchestrator.errors")

_HTML_PREFIXES = ("/admin", "/docs", "/redoc", "/static", "/ui", "/accounts")


def _wants_json(request: HttpRequest) -> bool:
    return not request.path.startswith(_HTML_PREFIXES) and request.path != "/"


class JsonErrorMiddleware:
    """Turns Django's HTML error pages into ``{code, message}`` JSON for API paths."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self._acall(request)
        return self._rewrite(request, self.get_response(request))

    async def _acall(self, request: HttpRequest):
        return self._rewrite(request, await self.get_response(request))

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not _wants_json(request):
            return None
        if isinstance(exception, RequestDataTooBig):
            return error_response("request_too_large", "Request body is too large.", 413)
        logger.exception("unhandled error on %s", request.path, exc_info=exception)
        return error_response("internal_error", "Internal server error.", 500)

    @staticmethod
    def _rewrite(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if not _wants_json(request) or response.status_code < 400:
            return response
        content_type = response.get("Content-Type", "")
        if content_type.startswith("application/json") or getattr(response, "streaming", False):
            return response
        codes = {404: ("not_found", "Not found."), 405: ("method_not_allowed", "Method not allowed."),
                 403: ("forbidden", "Forbidden."), 400: ("bad_request", "Bad request."),
                 413: ("request_too_large", "Request body is too large."),
                 500: ("internal_error", "Internal server error.")}
        code, message = codes.get(response.status_code, ("error", response.reason_phrase or "Error"))
        rewritten = error_response(code, message, response.status_code)
        if response.has_header("Allow"):
            rewritten["Allow"] = response["Allow"]
        return rewritten


# --- Django's middleware, without a thread hop per hook on API paths ------------------------------

# Paths served to API clients: their requests authenticate inside the view (a token, or a session
# that is only read), so no middleware hook does blocking I/O for them.
API_PREFIXES = ("/v1/", "/api/", "/chat", "/conversations/", "/health")


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def inline_on_api_paths(cls: type) -> type:
    """``cls`` (a ``MiddlewareMixin`` middleware) with its hooks run on the event loop for API paths.

    Under ASGI, Django runs every sync hook of every such middleware through its own thread hop
    (``sync_to_async``): about fifteen per request, several milliseconds before a stream's first
    event. Their hooks only read headers and cookies and set lazy attributes; the one that can
    write (the session, when modified) is never modified on an API path. Other paths (the admin,
    the login page) keep Django's behaviour.
    """

    class InlineOnApiPaths(cls):
        async def __acall__(self, request: HttpRequest):
            if not _is_api(request):
                return await super().__acall__(request)
            response = self.process_request(request) if hasattr(self, "process_request") else None
            response = response or await self.get_response(request)
            if hasattr(self, "process_response"):
                response = self.process_response(request, response)
            return response

    if hasattr(cls, "process_view"):
        sync_process_view = cls.process_view

        async def process_view(self, request, view_func, view_args, view_kwargs):
            if _is_api(request):
                return sync_process_view(self, request, view_func, view_args, view_kwargs)
            return await sync_to_async(sync_process_view, thread_sensitive=True)(
                self, request, view_func, view_args, view_kwargs)

        InlineOnApiPaths.process_view = process_view

    InlineOnApiPaths.__name__ = InlineOnApiPaths.__qualname__ = cls.__name__
    InlineOnApiPaths.__module__ = __name__
    return InlineOnApiPaths


SecurityMiddleware = inline_on_api_paths(security.SecurityMiddleware)
SessionMiddleware = inline_on_api_paths(sessions.SessionMiddleware)
CommonMiddleware = inline_on_api_paths(common.CommonMiddleware)
CsrfViewMiddleware = inline_on_api_paths(csrf.CsrfViewMiddleware)
AuthenticationMiddleware = inline_on_api_paths(auth.AuthenticationMiddleware)
def skipped_on_api_paths(cls: type) -> type:
    """``cls`` run as ``inline_on_api_paths`` does on other paths, and not at all on API paths:
    for middleware no API response uses (the admin's flash messages: two storages built per
    request for nothing)."""
    inline = inline_on_api_paths(cls)

    class SkippedOnApiPaths(inline):
        async def __acall__(self, request: HttpRequest):
            if _is_api(request):
                return await self.get_response(request)
            return await super().__acall__(request)

    SkippedOnApiPaths.__name__ = SkippedOnApiPaths.__qualname__ = cls.__name__
    SkippedOnApiPaths.__module__ = __name__
    return SkippedOnApiPaths


MessageMiddleware = skipped_on_api_paths(messages.MessageMiddleware)
XFrameOptionsMiddleware = inline_on_api_paths(clickjacking.XFrameOptionsMiddleware)

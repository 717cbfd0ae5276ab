"""JSON errors for everything outside DRF: unknown paths, oversized bodies, crashes."""
from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse

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

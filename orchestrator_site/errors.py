"""One error hierarchy, mapped to HTTP once.

Every error a client sees is JSON ``{"code": ..., "message": ...}`` (plus optional extra keys)
with a fitting status. Services raise :class:`ApplicationError` subclasses; DRF views get them
mapped by :func:`exception_handler`; plain views and the middleware use :func:`error_response`.
"""
from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger("orchestrator.errors")


class ApplicationError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        self.extra = extra or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


class InvalidInput(ApplicationError):
    status = 400
    code = "invalid_input"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Forbidden(ApplicationError):
    """The caller may see the object but not do this to it (e.g. a non-staff user making an agent rule)."""

    status = 403
    code = "permission_denied"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class ProviderError(ApplicationError):
    """An upstream model provider failed (unreachable, rejected the call, or timed out)."""

    status = 502
    code = "provider_error"


def error_response(code: str, message: str, status: int, **extra: Any) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, **extra}, status=status)


_DRF_CODES = {
    drf_exceptions.ParseError: "malformed_json",
    drf_exceptions.NotAuthenticated: "not_authenticated",
    drf_exceptions.AuthenticationFailed: "authentication_failed",
    drf_exceptions.PermissionDenied: "permission_denied",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.NotAcceptable: "not_acceptable",
    drf_exceptions.UnsupportedMediaType: "unsupported_media_type",
    drf_exceptions.Throttled: "throttled",
    drf_exceptions.ValidationError: "invalid_input",
}


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            out.extend(_flatten(value, f"{prefix}{name}." if name else prefix))
        return out
    if isinstance(detail, list):
        return [m for item in detail for m in _flatten(item, prefix)]
    return [f"{prefix.rstrip('.')}: {detail}" if prefix else str(detail)]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error becomes ``{code, message}`` with the right status."""
    if isinstance(exc, ApplicationError):
        return Response(exc.to_dict(), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        return Response({"code": "request_too_large", "message": "Request body is too large."}, status=413)
    if isinstance(exc, Http404):
        return Response({"code": "not_found", "message": "Not found."}, status=404)
    if isinstance(exc, PermissionDenied):
        return Response({"code": "permission_denied", "message": "Permission denied."}, status=403)
    if isinstance(exc, DjangoValidationError):
        return Response({"code": "invalid_input", "message": "; ".join(exc.messages)}, status=400)
    if isinstance(exc, drf_exceptions.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), None) or str(exc.default_code)
        if isinstance(exc, drf_exceptions.ValidationError):
            body: dict[str, Any] = {"code": code, "message": "; ".join(_flatten(exc.detail)), "errors": exc.detail}
        else:
            body = {"code": code, "message": str(exc.detail)}
        response = Response(body, status=exc.status_code)
        if getattr(exc, "auth_header", None):
            response["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))
        return response
    logger.exception("unhandled error in API view", exc_info=exc)
    return Response({"code": "internal_error", "message": "Internal server error."}, status=500)

"""One error hierarchy and one code vocabulary, for every layer.

Services raise :class:`ApplicationError` subclasses; ``orchestrator_site/errors.py`` maps them to
HTTP once (``{"code", "message"}`` with the status). Engines and providers end a run with
:class:`EngineError`, whose ``code`` is an :class:`ErrorCode`: the same failure has the same code
whichever engine or provider met it, and every dialect reads it from ``error``/``agent.end``.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Why a run failed (``agent.end.errorCode``, ``error.code``). Values are the wire strings."""

    # The provider (a model API) and the way to it.
    AUTHENTICATION_FAILED = "authentication_failed"
    PERMISSION_DENIED = "permission_denied"
    BILLING_ERROR = "billing_error"
    MODEL_NOT_FOUND = "model_not_found"
    INVALID_REQUEST = "invalid_request"
    REQUEST_TOO_LARGE = "request_too_large"
    RATE_LIMITED = "rate_limited"
    # A 429 that means an exhausted quota or balance: waiting or another try does not help.
    QUOTA_EXHAUSTED = "quota_exhausted"
    PROVIDER_OVERLOADED = "provider_overloaded"
    PROVIDER_ERROR = "provider_error"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_UNREACHABLE = "provider_unreachable"
    PROVIDER_DISCONNECTED = "provider_disconnected"
    # The engine and the run.
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    UNKNOWN_ENGINE = "unknown_engine"
    NO_ANSWER = "no_answer"
    INVALID_SCRIPT = "invalid_script"
    MOCK_FAILURE = "mock_failure"
    AGENT_NOT_FOUND = "agent_not_found"
    RUN_TIMEOUT = "run_timeout"
    RUN_LOST = "run_lost"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"
    # Tools and MCP servers a run connects to.
    MCP_CONNECT_FAILED = "mcp_connect_failed"
    INVALID_MCP_CONFIG = "invalid_mcp_config"


# Failures worth trying again (on this provider later, or on another one now).
RETRYABLE = frozenset({
    ErrorCode.RATE_LIMITED, ErrorCode.PROVIDER_ERROR, ErrorCode.PROVIDER_OVERLOADED, ErrorCode.PROVIDER_TIMEOUT,
    ErrorCode.PROVIDER_UNREACHABLE, ErrorCode.PROVIDER_DISCONNECTED,
})


class EngineError(Exception):
    """A run-ending engine failure with a readable message and a stable :class:`ErrorCode`."""

    def __init__(self, message: str, *, code: ErrorCode | str = ErrorCode.ENGINE_ERROR, retryable: bool | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.code = str(code)
        self.retryable = code in RETRYABLE if retryable is None else retryable
        # Seconds the provider asked to wait (Retry-After), when it said.
        self.retry_after = retry_after


class ApplicationError(Exception):
    """A request that cannot be served as asked; ``status`` is the HTTP status it maps to."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 extra: dict[str, Any] | None = None):
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


class Forbidden(ApplicationError):
    status = 403
    code = "permission_denied"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class ProviderError(ApplicationError):
    """An upstream model provider failed (unreachable, rejected the call, or timed out)."""

    status = 502
    code = "provider_error"

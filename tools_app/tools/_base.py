"""Small helpers shared by the built-in tools."""
from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

from ..registry import ToolContext, ToolError, ToolResult

RunMethod = Callable[..., Awaitable[ToolResult]]


def tool_errors_as_results(func: RunMethod) -> RunMethod:
    """Turn a :class:`ToolError` raised by ``run`` into an ``is_error`` result.

    The registry contract allows raising, but returning keeps each tool correct on its own,
    whichever runner calls it.
    """

    @functools.wraps(func)
    async def wrapper(self: Any, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        try:
            return await func(self, input=input, context=context)
        except ToolError as exc:
            return ToolResult(output=str(exc), is_error=True)

    return wrapper


def string_arg(input: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    """Fetch a required string argument or raise a :class:`ToolError` the model can act on."""
    value = input.get(name) if isinstance(input, dict) else None
    if not isinstance(value, str):
        raise ToolError(f"{name!r} is required and must be a string")
    if not allow_empty and not value.strip():
        raise ToolError(f"{name!r} must not be empty")
    return value

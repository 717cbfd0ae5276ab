"""``read_file`` and ``write_file``: text files inside the agent's workspace."""
from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from .. import conf
from ..registry import Tool, ToolContext, ToolError, ToolResult
from ..sandbox import OutputCollector
from ..workspace import display_path, ensure_workspace, resolve_in_workspace
from ._base import string_arg, tool_errors_as_results

_CHUNK = 65536


class ReadFileTool(Tool):
    name = "read_file"
    description = (
        "Read a text file from your workspace and return its contents (decoded as UTF-8; bytes "
        "that are not valid UTF-8 are replaced). `path` is relative to the workspace root; paths "
        "that lead outside the workspace are refused. Very long files are cut and end with an "
        "'[output truncated: N more characters]' marker."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace root."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        workspace = ensure_workspace(context.workspace)
        resolved = resolve_in_workspace(workspace, string_arg(input, "path"), must_exist=True)
        shown = display_path(workspace, resolved)
        if resolved.is_dir():
            raise ToolError(f"{shown} is a directory, not a file")
        limit = int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000))
        try:
            text, truncated = await asyncio.to_thread(_read_capped, resolved, limit)
        except OSError as exc:
            raise ToolError(f"could not read {shown}: {exc.strerror or exc}") from exc
        return ToolResult(text, metadata={"path": shown, "truncated": truncated})


class WriteFileTool(Tool):
    name = "write_file"
    description = (
        "Write text to a file in your workspace, replacing the file if it exists. Missing parent "
        "directories are created. `path` is relative to the workspace root; paths that lead "
        "outside the workspace are refused. Returns 'OK: Wrote N chars to <path>'."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace root."},
            "content": {"type": "string", "description": "The complete new contents of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }
    requires_approval = True

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        workspace = ensure_workspace(context.workspace)
        resolved = resolve_in_workspace(workspace, string_arg(input, "path"))
        content = string_arg(input, "content", allow_empty=True)
        shown = display_path(workspace, resolved)
        if resolved.is_dir():
            raise ToolError(f"{shown} is a directory, not a file")
        try:
            await asyncio.to_thread(_write, resolved, content)
        except OSError as exc:
            raise ToolError(f"could not write {shown}: {exc.strerror or exc}") from exc
        return ToolResult(f"OK: Wrote {len(content)} chars to {shown}", metadata={"path": shown})


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    # O_NOFOLLOW: the path was resolved, so a symlink here appeared after the check.
    # O_NONBLOCK: opening a FIFO must not hang; only regular files are read.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb", buffering=0) as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError(f"{path.name} is not a regular file")
        collector = OutputCollector(limit)
        while chunk := handle.read(_CHUNK):
            collector.feed(chunk)
        return collector.text(), collector.truncated


def _write(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with open(fd, "wb") as handle:
        handle.write(content.encode("utf-8"))

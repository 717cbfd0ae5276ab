"""``bash``: run a shell command in the agent's workspace."""
from __future__ import annotations

from typing import Any

from .. import conf
from ..registry import Tool, ToolContext, ToolResult
from ..sandbox import run_subprocess
from ..workspace import ensure_workspace
from ._base import string_arg, tool_errors_as_results


class BashTool(Tool):
    name = "bash"
    description = (
        "Run a shell command with /bin/bash -c in your workspace directory (the current directory "
        "and $HOME). Standard output and standard error are returned together; a non-zero exit code "
        "is reported at the end. The command has a time limit and is killed, with any background "
        "processes it started, when it runs over or when it finishes. Output beyond a size limit is "
        "cut. There is no terminal and no standard input, so avoid interactive programs. "
        "Environment variables from the server (API keys and the like) are not available."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command line to run."},
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    requires_approval = True

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        command = string_arg(input, "command")
        timeout = float(conf.setting("TOOL_TIMEOUT", 30))
        result = await run_subprocess(
            ["/bin/bash", "-c", command],
            cwd=ensure_workspace(context.workspace),
            timeout=timeout,
            output_limit=int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000)),
        )
        metadata = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
        }
        output = result.output
        if result.timed_out:
            note = f"[command timed out after {timeout:g} s and was killed]"
            return ToolResult(_join(output, note), is_error=True, metadata=metadata)
        if result.exit_code != 0:
            return ToolResult(_join(output, f"[exit code: {result.exit_code}]"), is_error=True, metadata=metadata)
        return ToolResult(output or "(no output)", metadata=metadata)


def _join(output: str, note: str) -> str:
    if not output:
        return note
    return f"{output}\n{note}" if not output.endswith("\n") else f"{output}{note}"

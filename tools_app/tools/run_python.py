"""``run_python``: run a Python snippet in a separate interpreter in the agent's workspace.

Never ``exec`` in the server process: the code runs in ``sys.executable -I`` (isolated mode: no
``PYTHON*`` variables, no user site-packages) through :func:`run_subprocess`, so it gets the
workspace as cwd, the scrubbed environment, the timeout and the output cap. The code goes in on
stdin and the outcome comes back in a small JSON file outside the workspace, so nothing the code
prints can be mistaken for the result line and the result survives an output cut.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import conf
from ..registry import Tool, ToolContext, ToolResult
from ..sandbox import SubprocessResult, run_subprocess, truncate_text
from ..workspace import ensure_workspace
from ._base import string_arg, tool_errors_as_results

# Runs in the child. argv[1] is the result file. Kept dependency-free and short on purpose.
_WRAPPER = r'''
import json, os, sys, traceback, types
result_path = sys.argv[1]
source = sys.stdin.read()
sys.stdin.close()
sys.stdin = open(os.devnull)
sys.argv = ["<run_python>"]
sys.dont_write_bytecode = True
sys.stdout.reconfigure(line_buffering=True)  # keep prints and tracebacks in order
sys.path.insert(0, os.getcwd())
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
SKIP = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)

def summary():
    parts = []
    for key, value in namespace.items():
        if key.startswith("__") or isinstance(value, SKIP):
            continue
        try:
            text = repr(value)
        except Exception:
            continue
        if len(text) > 2000:
            text = text[:2000] + "...<cut>"
        parts.append(repr(key) + ": " + text)
    return "{" + ", ".join(parts) + "}"

def finish(outcome):
    sys.stdout.flush()
    sys.stderr.flush()
    with open(result_path, "w", encoding="utf-8") as handle:
        json.dump(outcome, handle)

try:
    exec(compile(source, "<run_python>", "exec"), namespace)
except SystemExit as exc:
    if exc.code in (None, 0):
        finish({"ok": True, "vars": summary()})
    else:
        finish({"ok": False, "type": "SystemExit", "message": str(exc.code)})
except BaseException as exc:
    sys.stdout.flush()
    # Show the user's frames only, not this wrapper's.
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    finish({"ok": False, "type": type(exc).__name__, "message": str(exc)})
else:
    finish({"ok": True, "vars": summary()})
'''


class RunPythonTool(Tool):
    name = "run_python"
    description = (
        "Run Python 3 code in a fresh interpreter, in your workspace directory, and return what it "
        "printed (stdout and stderr together) followed by either 'EXEC_OK: {...}' with the repr of "
        "the top-level variables the code defined (modules, functions, classes and dunder names "
        "left out), or 'EXEC_ERROR: <ExceptionType>: <message>' after a traceback if it raised. "
        "Each call starts from scratch: no variables carry over between calls. The code has a "
        "time limit, no standard input, and no access to the server's environment variables; use "
        "files in the workspace to keep state."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python source code to execute as a module."},
        },
        "required": ["code"],
        "additionalProperties": False,
    }
    requires_approval = True

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        code = string_arg(input, "code")
        workspace = ensure_workspace(context.workspace)
        timeout = float(conf.setting("TOOL_TIMEOUT", 30))
        limit = int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000))
        with tempfile.TemporaryDirectory(prefix="run_python-") as scratch:
            result_path = Path(scratch) / "result.json"
            result = await run_subprocess(
                [sys.executable, "-I", "-c", _WRAPPER, str(result_path)],
                cwd=workspace,
                timeout=timeout,
                output_limit=limit,
                stdin=code.encode("utf-8"),
            )
            outcome = _load_outcome(result_path)

        status, is_error = _status_line(result, outcome, timeout=timeout, limit=limit)
        printed = result.output
        if printed and not printed.endswith("\n"):
            printed += "\n"
        metadata = {"exit_code": result.exit_code, "timed_out": result.timed_out, "truncated": result.truncated}
        return ToolResult(printed + status, is_error=is_error, metadata=metadata)


def _status_line(result: SubprocessResult, outcome: dict[str, Any] | None, *, timeout: float, limit: int) -> tuple[str, bool]:
    """The seed-004 ``EXEC_OK`` / ``EXEC_ERROR`` line, and whether it is an error."""
    if result.timed_out:
        return f"EXEC_ERROR: TimeoutError: run_python timed out after {timeout:g} s and was killed", True
    if outcome is None:  # killed, os._exit, or the result file was tampered with
        return f"EXEC_ERROR: the interpreter exited with code {result.exit_code} before reporting a result", True
    if outcome.get("ok"):
        variables, _ = truncate_text(str(outcome.get("vars", "{}")), limit)
        return f"EXEC_OK: {variables}", False
    return f"EXEC_ERROR: {outcome.get('type')}: {outcome.get('message')}", True


def _load_outcome(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

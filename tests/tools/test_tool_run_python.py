"""run_python: a separate interpreter in the workspace, seed-004 EXEC_OK / EXEC_ERROR output."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tools_app.registry import ToolContext
from tools_app.tools.run_python import RunPythonTool


async def _run(code: str, context: ToolContext):
    return await RunPythonTool().run(input={"code": code}, context=context)


@pytest.mark.asyncio
async def test_run_python_reports_defined_variables(context: ToolContext) -> None:
    result = await _run("x = 1+1", context)
    assert not result.is_error
    assert result.output == "EXEC_OK: {'x': 2}"


@pytest.mark.asyncio
async def test_run_python_prints_first_and_skips_modules_functions_dunders(context: ToolContext) -> None:
    code = "import math\ndef f():\n    return 1\nclass K: pass\n__hidden__ = 1\nname = 'pi'\nvalue = round(math.pi, 2)\nprint('hello')\n"
    result = await _run(code, context)
    assert not result.is_error
    printed, status = result.output.rsplit("\n", 1)
    assert printed == "hello"
    assert status == "EXEC_OK: {'name': 'pi', 'value': 3.14}"


@pytest.mark.asyncio
async def test_run_python_exception_is_error(context: ToolContext) -> None:
    result = await _run("print('before')\n1/0\n", context)
    assert result.is_error
    assert result.output.startswith("before\n")
    assert "Traceback" in result.output and "<run_python>" in result.output
    assert result.output.endswith("EXEC_ERROR: ZeroDivisionError: division by zero")


@pytest.mark.asyncio
async def test_run_python_syntax_error_is_error(context: ToolContext) -> None:
    result = await _run("def broken(:\n", context)
    assert result.is_error
    assert "EXEC_ERROR: SyntaxError:" in result.output


@pytest.mark.asyncio
async def test_run_python_printed_result_marker_cannot_fake_status(context: ToolContext) -> None:
    result = await _run("print('EXEC_OK: {}')\nraise ValueError('real failure')", context)
    assert result.is_error
    assert result.output.endswith("EXEC_ERROR: ValueError: real failure")


@pytest.mark.asyncio
async def test_run_python_timeout(context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["TOOL_TIMEOUT"] = 1
    started = time.monotonic()
    result = await _run("print('spinning', flush=True)\nwhile True:\n    pass\n", context)
    assert time.monotonic() - started < 5
    assert result.is_error
    assert "spinning" in result.output
    assert "timed out after 1 s" in result.output


@pytest.mark.asyncio
async def test_run_python_has_no_server_environment(monkeypatch: pytest.MonkeyPatch, context: ToolContext) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-should-not-leak")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "django-should-not-leak")
    monkeypatch.setenv("DATABASE_URL", "postgres://should-not-leak")
    code = "import os\nleaked = sorted(k for k in os.environ if 'KEY' in k or 'URL' in k or 'SECRET' in k)\nprint(dict(os.environ))"
    result = await _run(code, context)
    assert not result.is_error
    assert "'leaked': []" in result.output
    assert "should-not-leak" not in result.output


@pytest.mark.asyncio
async def test_run_python_runs_in_workspace_in_another_process(workspace: Path, context: ToolContext) -> None:
    code = "import os\ncwd = os.getcwd()\npid = os.getpid()\nopen('out.txt', 'w').write('written')"
    result = await _run(code, context)
    assert not result.is_error
    assert f"'cwd': {str(workspace)!r}" in result.output
    assert f"'pid': {os.getpid()}," not in result.output
    assert (workspace / "out.txt").read_text() == "written"


@pytest.mark.asyncio
async def test_run_python_can_import_workspace_modules(workspace: Path, context: ToolContext) -> None:
    (workspace / "helper.py").write_text("ANSWER = 42\n")
    result = await _run("import helper\nanswer = helper.ANSWER", context)
    assert result.output == "EXEC_OK: {'answer': 42}"
    assert not (workspace / "__pycache__").exists()


@pytest.mark.asyncio
async def test_run_python_rejects_missing_code(context: ToolContext) -> None:
    result = await RunPythonTool().run(input={}, context=context)
    assert result.is_error and "'code'" in result.output


def test_run_python_requires_approval() -> None:
    assert RunPythonTool.requires_approval is True

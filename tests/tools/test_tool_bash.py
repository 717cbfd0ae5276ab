"""bash: runs in the workspace, with a scrubbed environment, a timeout and an output cap."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tools_app.registry import ToolContext
from tools_app.tools.bash import BashTool


@pytest.mark.asyncio
async def test_bash_cwd_and_home_are_the_workspace(workspace: Path, context: ToolContext) -> None:
    result = await BashTool().run(input={"command": 'pwd; echo "home=$HOME"; echo hi > made-here.txt'}, context=context)
    assert not result.is_error
    lines = result.output.splitlines()
    assert lines[0] == str(workspace)
    assert lines[1] == f"home={workspace}"
    assert (workspace / "made-here.txt").read_text() == "hi\n"


@pytest.mark.asyncio
async def test_bash_does_not_leak_server_environment(monkeypatch: pytest.MonkeyPatch, context: ToolContext) -> None:
    secrets = {
        "ANTHROPIC_API_KEY": "sk-ant-should-not-leak",
        "ANTHROPIC_AUTH_TOKEN": "auth-should-not-leak",
        "DJANGO_SECRET_KEY": "django-should-not-leak",
        "DATABASE_URL": "postgres://user:pw@db/should-not-leak",
        "REDIS_URL": "redis://should-not-leak",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    result = await BashTool().run(input={"command": "env"}, context=context)
    assert not result.is_error
    for name, value in secrets.items():
        assert name not in result.output
        assert value not in result.output
    names = {line.split("=", 1)[0] for line in result.output.splitlines() if "=" in line}
    # bash itself adds a few (PWD, SHLVL, _); nothing else from the server's environment.
    assert names <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.asyncio
async def test_bash_nonzero_exit_is_error_with_exit_code(context: ToolContext) -> None:
    result = await BashTool().run(input={"command": "echo partial; exit 7"}, context=context)
    assert result.is_error
    assert result.output == "partial\n[exit code: 7]"
    assert result.metadata["exit_code"] == 7


@pytest.mark.asyncio
async def test_bash_success_without_output(context: ToolContext) -> None:
    result = await BashTool().run(input={"command": "true"}, context=context)
    assert not result.is_error
    assert result.output == "(no output)"


@pytest.mark.asyncio
async def test_bash_timeout_kills_process_group(
    context: ToolContext, tool_settings: dict[str, Any], process_helpers: SimpleNamespace
) -> None:
    tool_settings["TOOL_TIMEOUT"] = 1
    started = time.monotonic()
    result = await BashTool().run(input={"command": "sleep 60 & echo child=$!; wait"}, context=context)
    assert time.monotonic() - started < 5
    assert result.is_error
    assert "timed out after 1 s" in result.output
    assert result.metadata["timed_out"] is True
    child = int(result.output.split("child=")[1].split()[0])
    assert process_helpers.wait_for(lambda: not process_helpers.pid_alive(child), timeout=5)


@pytest.mark.asyncio
async def test_bash_output_truncated_with_marker(context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["TOOL_OUTPUT_LIMIT"] = 100
    result = await BashTool().run(input={"command": "head -c 5000 /dev/zero | tr '\\0' a"}, context=context)
    assert not result.is_error
    assert result.output == "a" * 100 + "\n[output truncated: 4900 more characters]"
    assert result.metadata["truncated"] is True


@pytest.mark.asyncio
@pytest.mark.parametrize("payload", [{}, {"command": ""}, {"command": 12}])
async def test_bash_rejects_missing_command(context: ToolContext, payload: dict[str, Any]) -> None:
    result = await BashTool().run(input=payload, context=context)
    assert result.is_error
    assert "command" in result.output


def test_bash_requires_approval() -> None:
    assert BashTool.requires_approval is True
    assert BashTool.spec()["input_schema"]["required"] == ["command"]
